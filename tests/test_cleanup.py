"""`poise-git drop / restore / gc` on real archives: nothing lost, git fsck clean throughout."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import scratch_left_by_a_killed_process

from engine.archive import cleanup
from engine.errors import ArchiveError
from engine.scratch import SANDBOX_PREFIX, scratch_dir

REPO = Path(__file__).resolve().parents[1]


def _refs(path: Path, prefix: str) -> dict[str, str]:
    out = subprocess.run(
        ["git", "-C", str(path), "for-each-ref", "--format=%(refname) %(objectname)", prefix],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split() for line in out.splitlines())


def _fsck_strict_clean(path: Path) -> None:
    p = subprocess.run(
        ["git", "-C", str(path), "fsck", "--strict", "--no-progress", "--unreachable"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0 and "unreachable" not in p.stdout, p.stdout + p.stderr


def _tree(archive):
    archive.spawn("grpo", "a")
    archive.spawn("a", "a1")
    archive.spawn(["a1", "grpo"], "cross")  # a crossover below a
    archive.spawn("grpo", "b")


def test_drop_refuses_descendants_then_drops_and_restores_them(archive, cli):
    _tree(archive)
    a = str(archive.path)
    tips = {n: archive.tip(n) for n in ("a", "a1", "cross")}
    r = cli("drop", "a", "-C", a)
    assert r.returncode == 1 and "has descendants (a1, cross)" in r.stderr
    assert "--with-descendants" in r.stderr and archive.exists("a")
    r = cli("drop", "a", "--with-descendants", "-C", a)
    assert r.returncode == 0 and "dropped 3 node(s): a, a1, cross" in r.stdout, r.stderr
    assert set(archive.nodes()) == {"grpo", "b"}
    assert "a1" not in cli("log", "-C", a).stdout
    hidden = _refs(archive.path, cleanup.DROPPED_PREFIX)
    assert sorted(v for v in hidden.values()) == sorted(tips.values())
    assert {k.split("/")[2] for k in hidden} == {"a", "a1", "cross"}
    _fsck_strict_clean(archive.path)
    # the objects survive git's own garbage collection: they are reachable
    subprocess.run(["git", "-C", a, "gc", "--prune=now", "--quiet"], check=True)
    _fsck_strict_clean(archive.path)
    listed = json.loads(cli("restore", "--list", "--json", "-C", a).stdout)
    assert {d["node"] for d in listed} == {"a", "a1", "cross"} and len(
        {d["batch"] for d in listed}
    ) == 1
    r = cli("drop", "a", "--undo", "-C", a)
    assert r.returncode == 0 and "restored a, a1, cross" in r.stdout, r.stderr
    assert {n: archive.tip(n) for n in tips} == tips
    assert archive.node("cross").parents == ("a1", "grpo")
    assert _refs(archive.path, cleanup.DROPPED_PREFIX) == {}
    _fsck_strict_clean(archive.path)


def test_drop_leaf_restore_and_refusals(archive, cli):
    _tree(archive)
    a = str(archive.path)
    assert cli("drop", "b", "-C", a).returncode == 0 and not archive.exists("b")
    r = cli("drop", "grpo", "-C", a)
    assert r.returncode == 1 and "a root cannot be dropped" in r.stderr
    r = cli("drop", "nope", "-C", a)
    assert r.returncode == 1 and "unknown node 'nope'" in r.stderr
    r = cli("restore", "nope", "-C", a)
    assert r.returncode == 1 and "no dropped node 'nope' (dropped nodes: b)" in r.stderr
    archive.spawn("grpo", "b")  # the name is taken again
    r = cli("restore", "b", "-C", a)
    assert r.returncode == 1 and "b exist(s) again" in r.stderr
    assert cli("drop", "b", "-C", a).returncode == 0  # a second drop of the name: its own batch
    assert len(cleanup.dropped(archive)) == 2
    r = cli("restore", "b", "-C", a)
    assert r.returncode == 0 and archive.exists("b")
    _fsck_strict_clean(archive.path)


def test_restore_checks_a_parent_by_commit_not_by_name(archive, cli):
    """A node goes back under the parent it was spawned from, never under another node that took
    the parent's name since; the error names the old parent's drop to restore first."""
    a = str(archive.path)
    archive.spawn("grpo", "A")
    archive.spawn("A", "B")
    archive.record_reflection(
        "A", "recorded after B was spawned"
    )  # the old A's tip is past B's base
    t0 = time.time()
    cleanup.drop(archive, ["B"], now=t0 - 2)
    cleanup.drop(archive, ["A"], now=t0 - 1)
    old_a = next(d for d in cleanup.dropped(archive) if d.name == "A")
    archive.spawn("grpo", "A", "LENGTH_FLOOR = 0.5\n")  # another node, the same name
    r = cli("restore", "B", "-C", a)
    assert r.returncode == 1 and "its parent A was made again as a different node" in r.stderr
    assert f"restore the old one first (poise-git restore A --batch {old_a.batch})" in r.stderr
    assert not archive.exists("B")
    assert cli("drop", "A", "-C", a).returncode == 0  # the new A out of the way
    r = cli("restore", "B", "-C", a)
    assert r.returncode == 1, r.stdout
    assert (
        f"not in the archive; restore A first (poise-git restore A --batch {old_a.batch})"
        in r.stderr
    )
    assert cli("restore", "A", "--batch", old_a.batch, "-C", a).returncode == 0
    r = cli("restore", "B", "-C", a)
    assert r.returncode == 0, r.stderr
    assert archive.tip("A") == old_a.commit and archive.node("B").parents == ("A",)
    # the old parent pruned for good: nothing to restore the child under
    archive.spawn("grpo", "C")
    archive.spawn("C", "D")
    cleanup.drop(archive, ["D"], now=t0)
    cleanup.drop(archive, ["C"], now=t0 - 30 * 86400)
    archive.spawn("grpo", "C", "LENGTH_FLOOR = 0.5\n")
    rep = cleanup.gc(archive, 14, prune=True, drop_failed=False, tmpdir=archive.path / "none")
    assert [p.split("@")[0] for p in rep.pruned] == ["C"]
    r = cli("restore", "D", "-C", a)
    assert r.returncode == 1 and "its parent C was made again" in r.stderr
    assert "the old C is no longer among the dropped nodes (pruned), so D cannot be restored" in (
        r.stderr
    )
    assert not archive.exists("D")
    _fsck_strict_clean(archive.path)


def test_dry_run_changes_nothing(archive, cli):
    _tree(archive)
    before = _refs(archive.path, "refs/")
    r = cli("drop", "a", "--with-descendants", "--dry-run", "-C", str(archive.path))
    assert r.returncode == 0 and "would drop 3 node(s)" in r.stdout
    assert _refs(archive.path, "refs/") == before


def _age(path: Path, days: float) -> None:
    t = time.time() - days * 86400
    for root, dirs, files in os.walk(path):
        for f in dirs + files:
            os.utime(os.path.join(root, f), (t, t))
    os.utime(path, (t, t))


def test_gc_collects_old_scratch_and_failed_leaves(archive, tmp_path, cli):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    stale = tmp / "poise-sbx-abc123"  # a sandboxed child's, its run killed
    (stale / "tests").mkdir(parents=True)
    (stale / "algorithm.py").write_text("x" * 5000)
    _age(stale, 20)
    fresh = tmp / "poise-blobs-def456"
    fresh.mkdir()
    (fresh / "out.json").write_text("{}")
    other = tmp / "not-ours"
    other.mkdir()
    _age(other, 20)
    archive.spawn("grpo", "ok")
    archive.spawn("grpo", "bad")
    archive.set_status("bad", "failed", "NaN loss")
    archive.spawn("grpo", "parent-failed")
    archive.set_status("parent-failed", "rejected", "imports os")
    archive.spawn("parent-failed", "child")  # a failed node with a child is evidence in use: kept
    verl = archive.path / ".poise" / "verl" / "nodes"  # as the verl launch lays it out
    (verl / "gone-node" / "checkpoints").mkdir(parents=True)
    (verl / "ok" / "checkpoints").mkdir(parents=True)
    _age(verl / "gone-node", 30)
    _age(verl / "ok", 30)
    env = {"TMPDIR": str(tmp)}
    a = str(archive.path)
    r = cli("gc", "--older-than", "7", "--dry-run", "--json", "-C", a, env=env)
    rep = json.loads(r.stdout)
    assert rep["scratch"] == [str(stale), str(verl / "gone-node")] and rep["scratch_bytes"] >= 5000
    assert rep["failed"] == []  # the nodes are minutes old
    assert stale.exists()
    r = cli("gc", "--older-than", "7", "-C", a, env=env)
    assert r.returncode == 0 and "removed 2 scratch" in r.stdout
    assert not stale.exists() and fresh.exists() and other.exists() and (verl / "ok").exists()
    r = cli("gc", "--older-than", "0", "-C", a, env=env)
    assert "dropped 1 failed / rejected node(s): bad" in r.stdout
    assert set(archive.nodes()) == {"grpo", "ok", "parent-failed", "child"}
    assert cli("restore", "bad", "-C", a).returncode == 0 and archive.exists("bad")
    _fsck_strict_clean(archive.path)


def _age_objects(path: Path, seconds: float) -> None:
    """Date every object file (loose and packed) ``seconds`` back, as if written that long ago."""
    t = time.time() - seconds
    for f in (path / ".git" / "objects").rglob("*"):
        if f.is_file():
            os.utime(f, (t, t))


def test_gc_prune_deletes_old_drops_for_good(archive):
    archive.spawn("grpo", "old")
    archive.spawn("grpo", "recent")
    t0 = time.time()
    cleanup.drop(archive, ["old"], now=t0 - 30 * 86400)
    cleanup.drop(archive, ["recent"], now=t0)
    _age_objects(archive.path, 2 * 3600)  # written long ago, as a drop 30 days old implies
    rep = cleanup.gc(archive, 14, prune=True, drop_failed=False, tmpdir=archive.path / "none")
    assert [p.split("@")[0] for p in rep.pruned] == ["old"]
    assert [d.name for d in cleanup.dropped(archive)] == ["recent"]
    _fsck_strict_clean(archive.path)  # the old node's objects are gone, not dangling
    with pytest.raises(ArchiveError, match="no dropped node 'old'"):
        cleanup.restore(archive, "old")
    assert cleanup.restore(archive, "recent") == ["recent"]


def test_gc_prune_keeps_what_a_concurrent_writer_has_not_referenced_yet(archive):
    """A writer (a run, a spawn) writes a commit's objects a moment before the ref that reaches
    them; `gc --prune` meanwhile must not delete them, or the ref it then moves points at nothing."""
    archive.spawn("grpo", "old")
    cleanup.drop(archive, ["old"], now=time.time() - 30 * 86400)
    _age_objects(archive.path, 2 * 3600)
    git = archive.git
    blob = git.write_blobs([b"results a writer is committing\n"])[0]
    tree = git.write_tree({"results.json": ("100644", blob)})
    commit = git.commit_tree(tree, [archive.node("grpo").commit], "poise: a concurrent write")
    rep = cleanup.gc(archive, 14, prune=True, drop_failed=False, tmpdir=archive.path / "none")
    assert [p.split("@")[0] for p in rep.pruned] == ["old"]
    assert git.update_ref("refs/heads/poise/late", commit, None, "the writer's ref, after gc")
    assert git.cat_blobs([f"{commit}:results.json"])[0] is not None
    _fsck_strict_clean(archive.path)


def test_gc_keeps_live_verl_checkpoints_and_the_shared_data(archive, tmp_path, cli):
    """Only the per-node work dirs of nodes gone from the archive are collected; the data, model and
    tokenizer caches the nodes share, and every live node's checkpoints, stay whatever their age."""
    archive.spawn("grpo", "kept")
    archive.spawn("grpo", "gone")
    cleanup.drop(archive, ["gone"])
    verl = archive.path / ".poise" / "verl"
    keep = [
        verl / "nodes" / "grpo" / "checkpoints" / "model.pt",
        verl / "nodes" / "kept" / "checkpoints" / "model.pt",
        verl / "data" / "math_l3to5_n5000_seed0" / "train.parquet",
        verl / "smoke" / "nodes" / "kept" / "checkpoints" / "model.pt",
        verl / "smoke" / "shared" / "model" / "config.json",
        verl / "smoke" / "shared" / "data_seed0" / "train.parquet",
    ]
    gone = [
        verl / "nodes" / "gone" / "checkpoints" / "model.pt",
        verl / "smoke" / "nodes" / "gone" / "checkpoints" / "model.pt",
    ]
    for f in keep + gone:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("weights")
    _age(verl, 30)
    a = str(archive.path)
    r = cli(
        "gc", "--older-than", "0", "--keep-failed", "--json", "-C", a, env={"TMPDIR": str(tmp_path)}
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["scratch"] == [
        str(verl / "nodes" / "gone"),
        str(verl / "smoke" / "nodes" / "gone"),
    ]
    assert all(f.read_text() == "weights" for f in keep)
    assert not any(f.parent.parent.exists() for f in gone)


def test_gc_collects_the_scratch_a_killed_process_left_and_spares_one_in_use(
    archive, tmp_path, cli
):
    """The engine's temporary directories as the engine makes them: one whose process was
    SIGKILLed inside it is collected, one a live process holds is not, however old both look."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    left = scratch_left_by_a_killed_process(tmp)
    assert left.is_dir() and left.name.startswith(SANDBOX_PREFIX)
    _age(left, 30)
    with scratch_dir(SANDBOX_PREFIX, dir=tmp) as held:
        _age(Path(held), 30)
        a = str(archive.path)
        r = cli(
            "gc", "--older-than", "0", "--keep-failed", "--json", "-C", a, env={"TMPDIR": str(tmp)}
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["scratch"] == [str(left)]
        assert Path(held).is_dir()
    assert not left.exists()


def test_gc_knows_every_prefix_the_engine_makes_scratch_under():
    """Every scratch_dir(...) call in the engine uses a prefix gc collects."""
    import re

    from engine import scratch

    used = set()
    for path in (REPO / "engine").rglob("*.py"):
        used |= set(re.findall(r"scratch_dir\((\w+_PREFIX)", path.read_text(encoding="utf-8")))
    assert used >= {"SANDBOX_PREFIX", "BLOBS_PREFIX", "SUITE_PREFIX"}
    assert {getattr(scratch, name) for name in used} <= set(scratch.SCRATCH_PREFIXES)


def test_the_test_runs_scratch_sweep_spares_directories_another_session_is_making(
    tmp_path, monkeypatch
):
    """The temporary directory is shared with other test sessions. The sweep at the end of a run
    removes only a scratch directory a dead process left (its lock file there, unlocked, not new):
    one still without its lock file, or whose lock file was created a moment ago, is another
    process's between creating the directory and locking it, and stays."""
    import fcntl
    import os
    import tempfile
    import time

    from conftest import _remove_left_scratch

    from engine.scratch import IN_USE, SANDBOX_PREFIX

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = {k: tmp_path / f"{SANDBOX_PREFIX}{k}" for k in ("bare", "fresh", "held", "dead")}
    for d in made.values():
        d.mkdir()
    for k in ("fresh", "held", "dead"):
        (made[k] / IN_USE).write_text("")
    old = time.time() - 600
    os.utime(made["dead"] / IN_USE, (old, old))
    os.utime(made["held"] / IN_USE, (old, old))
    fd = os.open(made["held"] / IN_USE, os.O_WRONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _remove_left_scratch(set())
    finally:
        os.close(fd)
    assert {k for k, d in made.items() if d.exists()} == {"bare", "fresh", "held"}
