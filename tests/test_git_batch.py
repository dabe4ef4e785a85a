"""The long-lived git batch processes of a handle (engine/archive/gitio.py): they see what other
processes write after they started, survive being killed, are not shared with a forked child, and a
request they fail fails as a one-shot git process does. Real git throughout."""

from __future__ import annotations

import os
import subprocess

import pytest

from engine.archive.gitio import GitError
from engine.archive.store import REF_PREFIX, Archive


def git(arch: Archive, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(arch.path), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def test_a_batch_process_sees_objects_and_refs_written_after_it_started(archive):
    assert archive.git.cat_objects([REF_PREFIX + "a"]) == [None]  # the process is running now
    archive.spawn("grpo", "a", "A = 1\n")
    obj = archive.git.cat_objects([REF_PREFIX + "a"])[0]
    assert obj is not None and obj[0] == git(archive, "rev-parse", "poise/a")
    git(archive, "pack-refs", "--all")  # packed, then moved by another process
    git(archive, "update-ref", REF_PREFIX + "a", git(archive, "rev-parse", "poise/grpo"))
    assert archive.git.cat_objects([REF_PREFIX + "a"])[0][0] == git(
        archive, "rev-parse", "poise/grpo"
    )


def test_a_killed_batch_process_is_replaced(archive):
    archive.git.cat_objects([REF_PREFIX + "grpo"])
    archive.git.write_blobs([b"x"])
    for batch in archive.git._batches.values():
        batch.proc.kill()
        batch.proc.wait()
    tip = git(archive, "rev-parse", "poise/grpo")
    assert archive.git.cat_objects([REF_PREFIX + "grpo"])[0][0] == tip
    (blob,) = archive.git.write_blobs([b"y\n"])
    assert git(archive, "cat-file", "-p", blob) == "y"
    assert archive.spawn("grpo", "a", "A = 1\n").commit == git(archive, "rev-parse", "poise/a")


def test_a_forked_child_starts_its_own_batch_process(archive):
    archive.git.cat_objects([REF_PREFIX + "grpo"])
    parent_proc = archive.git._batches["cat-file --batch"].proc
    tip = git(archive, "rev-parse", "poise/grpo")
    pid = os.fork()
    if pid == 0:  # the child: answers right, from a process of its own
        try:
            ok = archive.git.cat_objects([REF_PREFIX + "grpo"])[0][0] == tip
            ok = ok and archive.git._batches["cat-file --batch"].proc is not parent_proc
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert parent_proc.poll() is None  # the child's exit left the parent's process alone
    assert archive.git.cat_objects([REF_PREFIX + "grpo"])[0][0] == tip


def test_a_request_the_batch_process_fails_raises_as_git_does(archive):
    missing = "1" * 40
    with pytest.raises(GitError):
        archive.git.write_tree({"f": ("100644", missing)})
    (blob,) = archive.git.write_blobs([b"z"])
    tree = archive.git.write_tree({"f": ("100644", blob)})
    assert git(archive, "ls-tree", tree).endswith(f"{blob}\tf")


def test_a_pickled_handle_starts_its_own_processes(archive):
    import pickle

    archive.git.cat_objects([REF_PREFIX + "grpo"])
    copy = pickle.loads(pickle.dumps(archive.git))
    assert copy.path == archive.git.path and copy._batches == {}
    assert copy.cat_objects([REF_PREFIX + "grpo"])[0][0] == git(archive, "rev-parse", "poise/grpo")
