"""The lineage index (engine/archive/index.py) against refs changed behind the engine's back, a broken
or hostile index file and concurrent writers: each time, ``nodes()`` equals a read that parses every
tip from git (no index), and the mechanism index finds what the lineage holds and nothing else. Real
git repositories and real processes throughout."""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from results_util import record

from engine.archive import index as lineage_index
from engine.archive.edit import apply_edit
from engine.archive.locks import git_dir
from engine.archive.mechanism import same_mechanism
from engine.archive.store import REF_PREFIX, Archive

ROOT = Path(__file__).resolve().parents[1]


def index_file(arch: Archive) -> Path:
    return Path(git_dir(arch)) / lineage_index.INDEX_DIR / lineage_index.INDEX_FILE


def new_process(arch: Archive) -> Archive:
    """A handle as a process that has not read the index yet has it (what it knows is its file)."""
    lineage_index.forget()
    return Archive(arch.path)


def unindexed(arch: Archive) -> dict:
    """The lineage parsed from git alone: the index forgotten and its file removed first."""
    lineage_index.forget()
    for p in index_file(arch).parent.glob(lineage_index.INDEX_FILE + "*"):
        p.unlink()
    fresh = Archive(arch.path)
    nodes = fresh.nodes()
    return {"nodes": nodes, "skipped": dict(fresh.skipped)}


def indexed(arch: Archive) -> dict:
    nodes = arch.nodes()
    return {"nodes": nodes, "skipped": dict(arch.skipped)}


def check_both_ways(arch: Archive) -> dict:
    """The lineage read with the index this process holds, with only the index file, and from git
    alone: all three equal (every Node field, results, skipped refs)."""
    warm = indexed(arch)
    from_file = indexed(new_process(arch))
    cold = unindexed(arch)
    assert warm == cold
    assert from_file == cold
    return cold


def git(arch_or_path, *args: str) -> str:
    path = arch_or_path.path if isinstance(arch_or_path, Archive) else arch_or_path
    return subprocess.run(
        ["git", "-C", str(path), *args], check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture(autouse=True)
def _forget_index():
    lineage_index.forget()
    yield
    lineage_index.forget()


@pytest.fixture
def lineage(archive):
    """grpo with three children (one evaluated, one with an unreadable result, one rejected)."""
    archive.spawn("grpo", "a", "A = 1\n")
    archive.spawn("grpo", "b", "B = 1\n")
    archive.spawn("a", "c", "C = 1\n")
    record(archive, "a", {"overall": 0.6})
    record(archive, "grpo", {"overall": 0.5})
    archive.commit_files(
        "b",
        {"results/proxy/x.json": "{not json"},
        subject="bad",
        trailers={"Poise-Results": "proxy/x"},
    )
    archive.set_status("c", "rejected", "tests failed")
    archive.nodes()  # the index is built
    return archive


def test_the_index_is_written_under_the_git_directory_and_the_writers_add_their_commits(lineage):
    assert index_file(lineage).is_file()
    assert not (lineage.path / ".poise" / lineage_index.INDEX_FILE).exists()
    memo = lineage._index().memo
    commit = lineage.commit_files("a", {"notes.txt": "x"}, subject="a note")
    assert commit in memo  # written by the record, before any lineage read
    record(lineage, "b", {"overall": 0.7})
    assert lineage.tip("b") in memo
    nodes = check_both_ways(lineage)["nodes"]
    assert nodes["a"].commit == commit and nodes["a"].result is not None
    assert nodes["b"].evaluated and nodes["b"].unreadable  # the bad file is still named
    assert git(lineage, "status", "--porcelain") == ""
    assert lineage.fsck()


def test_a_branch_deleted_with_git_branch_D_leaves_the_lineage(lineage):
    git(lineage, "branch", "-D", "poise/c")
    nodes = check_both_ways(lineage)["nodes"]
    assert "c" not in nodes and set(nodes) == {"grpo", "a", "b"}


def test_a_branch_moved_with_update_ref_is_read_at_its_new_commit(lineage, caplog):
    old_a = lineage.tip("a")
    git(lineage, "update-ref", REF_PREFIX + "a", lineage.spawn_commit("a"))  # back to its spawn
    git(lineage, "update-ref", REF_PREFIX + "c", lineage.tip("b"))  # onto another node's commit
    with caplog.at_level(logging.WARNING):
        got = check_both_ways(lineage)
    a = got["nodes"]["a"]
    assert a.commit != old_a and a.status == "spawned" and a.result is None and not a.results
    assert "c" not in got["nodes"]
    assert "node 'b''s" in got["skipped"][REF_PREFIX + "c"]
    git(lineage, "update-ref", REF_PREFIX + "a", old_a)
    assert check_both_ways(lineage)["nodes"]["a"].evaluated


def test_branches_pushed_in_from_another_clone_are_read_and_found_as_duplicates(lineage, tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--mirror", str(lineage.path), str(clone)], check=True)
    other = Archive(clone)
    src = apply_edit(other.algorithm("a"), "PUSHED = 1\n")
    other.spawn("a", "pushed", algorithm=src)
    record(other, "pushed", {"overall": 0.9})
    other.set_status("b", "failed", "moved in the clone")
    lineage_index.forget()
    arch = Archive(lineage.path)
    arch.nodes()
    git(clone, "push", "-q", str(lineage.path), "refs/heads/poise/*:refs/heads/poise/*")
    nodes = check_both_ways(arch)["nodes"]
    assert nodes["pushed"].evaluated and nodes["pushed"].parents == ("a",)
    assert nodes["b"].status == "failed"
    assert same_mechanism(Archive(lineage.path), src) == ["pushed"]


def test_a_truncated_or_corrupt_index_file_is_rebuilt(lineage, caplog):
    path = index_file(lineage)
    for damage in (b"", b"SQLite format 3\x00" + b"\x07" * 300, os.urandom(4096)):
        lineage_index.forget()
        data = path.read_bytes()
        for p in path.parent.glob(lineage_index.INDEX_FILE + "-*"):
            p.unlink()
        path.write_bytes(data[: len(damage)] if not damage else damage)
        with caplog.at_level(logging.WARNING, logger="engine.archive.index"):
            check_both_ways(lineage)
        lineage.nodes()  # rebuilt: a valid index again
        with sqlite3.connect(path) as db:
            assert db.execute("SELECT count(*) FROM snapshot").fetchone()[0] == 1
    assert lineage.fsck()


def test_an_index_of_other_parsing_code_or_holding_code_is_dropped_unrun(lineage, tmp_path):
    path = index_file(lineage)
    lineage_index.forget()
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with sqlite3.connect(path) as db:
        db.execute("UPDATE snapshot SET data = ?", (pickle.dumps({"x": Evil()}),))
    check_both_ways(lineage)
    assert not marker.exists()
    with sqlite3.connect(path) as db:  # written by another version of the parsers
        db.execute("UPDATE meta SET value = 'old' WHERE key = 'fingerprint'")
        db.execute("UPDATE snapshot SET data = ?", (pickle.dumps({"x": 1}),))
    lineage_index.forget()
    check_both_ways(lineage)
    with sqlite3.connect(path) as db:
        fp = db.execute("SELECT value FROM meta WHERE key = 'fingerprint'").fetchone()[0]
    assert fp == lineage_index.fingerprint()


def test_the_mechanism_index_forgets_deleted_and_moved_branches(lineage):
    src_a = lineage.algorithm("a")
    assert same_mechanism(lineage, src_a) == same_mechanism(lineage, src_a, lineage.nodes())
    assert same_mechanism(lineage, src_a) == ["a"]
    lineage.spawn("grpo", "twin", algorithm=src_a)
    assert same_mechanism(lineage, src_a) == ["a", "twin"]
    git(lineage, "branch", "-D", "poise/a")
    assert same_mechanism(lineage, src_a) == ["twin"]
    git(lineage, "update-ref", REF_PREFIX + "twin", lineage.tip("b"))
    assert same_mechanism(lineage, src_a) == []
    assert same_mechanism(lineage, src_a, lineage.nodes()) == []


def test_nodes_made_before_the_mechanism_trailer_are_hashed_once_from_their_file(archive):
    src = apply_edit(archive.algorithm("grpo"), "OLD = 1\n")
    tree = git(archive, "rev-parse", "poise/grpo^{tree}").strip()
    blob = (
        subprocess.run(
            ["git", "-C", str(archive.path), "hash-object", "-w", "--stdin"],
            input=src.encode(),
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .strip()
    )
    ls = git(archive, "ls-tree", tree).replace(
        git(archive, "rev-parse", "poise/grpo:algorithm.py").strip(), blob
    )
    new_tree = subprocess.run(
        ["git", "-C", str(archive.path), "mktree"],
        input=ls,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    msg = "poise: old\n\nPoise-Node: old\nPoise-Parent: grpo\nPoise-Status: spawned\nPoise-Created: 5.0\n"
    commit = subprocess.run(
        ["git", "-C", str(archive.path), "commit-tree", new_tree, "-p", archive.tip("grpo")],
        input=msg,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    git(archive, "update-ref", REF_PREFIX + "old", commit)
    assert same_mechanism(archive, src) == ["old"]
    with sqlite3.connect(index_file(archive)) as db:
        assert db.execute("SELECT hash FROM mech WHERE oid = ?", (commit,)).fetchone()[0]
    assert same_mechanism(new_process(archive), src) == ["old"]


WORKER = textwrap.dedent(
    """
    import sys
    from engine.archive import index
    from engine.archive.store import Archive
    from results_util import record
    index._COMPACT_MIN = 3  # compactions among the other writers' inserts
    arch, me, n = Archive(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    for i in range(n):
        name = f"{me}-{i}"
        arch.spawn("grpo", name, f"W_{me.replace('-', '_')}_{i} = {i}\\n")
        record(arch, name, {"overall": (i + 1) / (n + 1)})
        if i % 2:
            arch.nodes()
    print("done")
    """
)


@pytest.mark.slow  # three processes, each importing the engine and writing a dozen commits
def test_concurrent_writers_and_compactions_lose_nothing(archive):
    archive.nodes()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(archive.path), f"w{k}", "6"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(3)
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "done" in out, err[-2000:]
    nodes = check_both_ways(archive)["nodes"]
    assert len(nodes) == 1 + 3 * 6
    assert all(nodes[f"w{k}-{i}"].evaluated for k in range(3) for i in range(6))
    src = apply_edit(archive.algorithm("grpo"), "W_w1_3 = 3\n")
    assert same_mechanism(new_process(archive), src) == ["w1-3"]
    with sqlite3.connect(index_file(archive)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert archive.fsck()


def test_results_read_from_the_index_are_the_results_written(lineage):
    before = {n: node.results for n, node in unindexed(lineage)["nodes"].items()}
    after = {n: node.results for n, node in new_process(lineage).nodes().items()}
    assert after == before
    r = after["a"][next(iter(after["a"]))]
    assert json.loads(r.to_json()) == json.loads(before["a"][r.protocol.id].to_json())
    assert r.per_seed == before["a"][r.protocol.id].per_seed


def test_an_index_that_cannot_be_written_leaves_reads_and_writes_right(archive, caplog):
    archive.spawn("grpo", "a", "A = 1\n")
    arch = new_process(archive)
    where = Path(git_dir(archive)) / lineage_index.INDEX_DIR
    shutil.rmtree(where)
    where.write_text("a file where the index goes")
    with caplog.at_level(logging.WARNING, logger="engine.archive.index"):
        assert set(arch.nodes()) == {"grpo", "a"}
        arch.spawn("grpo", "b", "B = 1\n")
        assert same_mechanism(arch, arch.algorithm("b")) == ["b"]  # from the lineage read
        record(arch, "b", {"overall": 0.4})
        assert arch.nodes()["b"].evaluated
    said = [r for r in caplog.records if "lineage index" in r.getMessage()]
    assert len(said) == 1 and "reading git" in said[0].getMessage()  # said once, not per read
    assert arch.fsck()


def depths(nodes: dict) -> dict:
    return {name: n.depth for name, n in nodes.items()}


def test_depths_follow_nodes_added_deleted_and_recreated_behind_the_engine_s_back(lineage):
    """A read starts from the depths of the last one (or of the snapshot's): each change below is
    one the start cannot hold (a parent gone, a node with other parents, a node under a name other
    nodes list as a parent) or one it can (nodes added); every time, the depths of a read from git."""
    lineage.spawn("c", "d", "D = 1\n")
    lineage.spawn("d", "e", "E = 1\n")
    assert depths(check_both_ways(lineage)["nodes"]) == {
        "grpo": 0, "a": 1, "b": 1, "c": 2, "d": 3, "e": 4,
    }  # fmt: skip
    c_tip = lineage.tip("c")
    git(lineage, "branch", "-D", "poise/c")  # d's parent is gone: d counts from 0
    assert depths(check_both_ways(lineage)["nodes"]) == {"grpo": 0, "a": 1, "b": 1, "d": 1, "e": 2}
    lineage.nodes()  # this process's start: a lineage where 'c' is a parent and no node
    git(lineage, "update-ref", REF_PREFIX + "c", c_tip)  # back, under the name d lists
    assert depths(check_both_ways(lineage)["nodes"])["e"] == 4
    git(lineage, "update-ref", REF_PREFIX + "d", lineage.spawn_commit("b"))  # not d's: skipped
    got = check_both_ways(lineage)
    assert "d" not in got["nodes"] and got["nodes"]["e"].depth == 1
    lineage.nodes()
    git(lineage, "update-ref", "-d", REF_PREFIX + "d")
    lineage.spawn("a", "d", "D = 2\n")  # 'd' again, now a child of a: e moves up under it
    assert depths(check_both_ways(lineage)["nodes"])["e"] == 3


def hand_made(arch: Archive, name: str, parent: str, tree_of: str = "grpo") -> str:
    """A node commit written with git alone (no index entry), its branch made: what a push brings."""
    tree = git(arch, "rev-parse", f"poise/{tree_of}^{{tree}}").strip()
    msg = f"by hand\n\nPoise-Node: {name}\nPoise-Parent: {parent}\nPoise-Status: spawned\n"
    commit = subprocess.run(
        ["git", "-C", str(arch.path), "commit-tree", tree, "-m", msg + "Poise-Created: 1.0\n"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    git(arch, "update-ref", REF_PREFIX + name, commit)
    return commit


def test_depths_of_a_lineage_with_a_cycle_are_those_of_a_read_from_git(lineage):
    """Branches edited into a cycle (a's commit moved to one naming c, c's child, as its parent):
    both nodes of the cycle are skipped and named, alike with and without the index."""
    hand_made(lineage, "a", "c", tree_of="a")
    first = check_both_ways(lineage)["nodes"]
    assert "a" not in first and "c" not in first and "b" in first
    lineage.nodes()
    assert "cycle (a -> c -> a)" in lineage.skipped[REF_PREFIX + "a"]
    lineage.spawn("b", "f", "F = 1\n")  # added to a lineage with a cycle: a whole pass again
    assert depths(check_both_ways(lineage)["nodes"])["f"] == 2


def test_a_new_process_starts_from_the_snapshot_s_depths(lineage, monkeypatch):
    """The depths kept with a snapshot are those of its lineage; a process that loads it and finds
    nodes added since computes theirs alone, and reads what git holds."""
    monkeypatch.setattr(lineage_index, "_COMPACT_MIN", 1)
    hand_made(lineage, "d", "c")
    lineage.nodes()  # parses d from git, then folds it into a new snapshot, with its depths
    fresh = new_process(lineage)
    fresh._index().get([lineage.tip("grpo")])  # loads the snapshot, not yet a lineage
    kept, dangling = fresh._index().lineage
    assert kept["d"] == (("c",), 3) and not dangling
    lineage.spawn("d", "e", "E = 1\n")
    assert depths(fresh.nodes())["e"] == 4
    assert depths(check_both_ways(lineage)["nodes"])["e"] == 4


def test_result_fields_kept_out_of_the_snapshot_are_read_from_their_row_or_from_git(lineage):
    """A snapshot holds each result's protocol, status, metrics, units, utility and seeds; the rest
    is read from the index's ``tail`` rows on first access, and from the result file in git where
    its row is gone (dropped by a compaction elsewhere) or damaged: equal either way."""
    want = unindexed(lineage)["nodes"]
    lineage.nodes()  # the index and its snapshot written again
    full = {n: {p: r.to_dict() for p, r in node.results.items()} for n, node in want.items()}
    assert any(full.values())
    with sqlite3.connect(index_file(lineage)) as db:
        assert db.execute("SELECT count(*) FROM tail").fetchone()[0] == sum(map(len, full.values()))
    for damage in (None, "DELETE FROM tail", "UPDATE tail SET data = x'80059500'"):
        if damage:
            with sqlite3.connect(index_file(lineage)) as db:
                db.execute(damage)
        got = new_process(lineage).nodes()
        r = got["a"].results["proxy/default"]
        assert "_tail" in r.__dict__  # from the snapshot, its tail not read yet
        assert {
            n: {p: r.to_dict() for p, r in node.results.items()} for n, node in got.items()
        } == full
        assert got == want
    # a node of the snapshot pickles with its values (nothing of the index in it)
    sent = pickle.loads(pickle.dumps(new_process(lineage).nodes()))
    assert sent == want
    assert all(
        k[:1] != "_" for node in sent.values() for r in node.results.values() for k in vars(r)
    )
    assert type(sent["a"].trailers) is dict and sent["a"].trailers == want["a"].trailers
