"""Bad input never crashes the engine: foreign refs under refs/heads/poise/, edits no parser survives,
invalid UTF-8 — each a clear one-line message, the archive intact."""

from __future__ import annotations

import pytest

from engine.archive.store import Archive
from engine.cli import EXIT_REJECTED
from engine.loop.state import pending_work

DEEP = "x = " + "(" * 1500 + "1" + ")" * 1500 + "\n"
CHAIN = "x = " + "+".join(["1"] * 3000) + "\n"


MISSING = "1234567890123456789012345678901234567890"
"""an object id no repository here has"""


def _plant(archive: Archive, ref: str, message: str | None = None, kind: str = "commit") -> None:
    tree = archive.git.text("rev-parse", "poise/grpo^{tree}").strip()
    if kind in ("tree", "missing"):  # git refuses these under refs/heads/; a foreign tool might not
        path = archive.path / ".git" / ref
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((tree if kind == "tree" else MISSING) + "\n")
        return
    commit = archive.git.commit_tree(tree, [], message or "foreign\n")
    archive.git.run("update-ref", ref, commit)


def test_log_and_spawn_name_foreign_refs_and_go_on(archive, cli, tmp_path):
    _plant(archive, "refs/heads/poise/tree-ref", kind="tree")
    _plant(
        archive,
        "refs/heads/poise/bad-created",
        "x\n\nPoise-Node: bad-created\nPoise-Created: soon\n",
    )
    _plant(
        archive, "refs/heads/poise/bad-status", "x\n\nPoise-Node: bad-status\nPoise-Status: pwned\n"
    )
    _plant(archive, "refs/heads/poise/nested/name", "x\n\nPoise-Node: z\n")
    _plant(archive, "refs/heads/poise/plain", "a plain commit, not a node\n")
    archive.git.run("update-ref", "refs/heads/poise/copy", archive.tip("grpo"))  # another node's
    _plant(archive, "refs/heads/poise/gone", kind="missing")
    r = cli("log", "-C", str(archive.path))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    for ref, why in (
        ("tree-ref", "points to a tree"),
        ("bad-created", "Poise-Created"),
        ("bad-status", "'pwned' is unknown"),
        ("nested/name", "not a poise-git node name"),
        ("plain", "not a poise-git node's (no Poise-Node trailer)"),
        ("copy", "its commit is node 'grpo''s (Poise-Node: grpo), not 'copy''s"),
        ("gone", f"it points to {MISSING}, an object this repository does not have"),
    ):
        assert f"ignoring refs/heads/poise/{ref}:" in r.stderr and why in r.stderr, r.stderr
    assert r.stdout.split() == ["grpo", "spawned"]  # not one of them is a (parentless) node
    edit = tmp_path / "e.py"
    edit.write_text(
        "def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:\n"
        "    return batch.rewards.to(torch.float32) - batch.rewards.to(torch.float32).mean()\n"
    )
    r = cli(
        "spawn", "grpo", "--name", "c", "--edit", str(edit), "--no-verify", "-C", str(archive.path)
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert set(archive.nodes()) == {"grpo", "c"} and set(archive.skipped) == {
        f"refs/heads/poise/{n}"
        for n in ("tree-ref", "bad-created", "bad-status", "nested/name", "plain", "copy", "gone")
    }


def test_a_branch_to_an_object_the_repository_lacks_breaks_no_command(archive, cli):
    """git refuses to list any branch once one points to a missing object; every command goes on
    without that one, and the warning says how to remove it."""
    archive.spawn("grpo", "a")
    _plant(archive, "refs/heads/poise/D", kind="missing")
    a = str(archive.path)
    r = cli("log", "-C", a)
    assert r.returncode == 0 and r.stdout.split() == ["grpo", "spawned", "└──", "a", "spawned"], (
        r.stdout + r.stderr
    )
    assert "ignoring refs/heads/poise/D: it points to " + MISSING in r.stderr, r.stderr
    assert f"remove the ref: git -C {archive.path} update-ref -d refs/heads/poise/D" in r.stderr
    fresh = Archive(archive.path)
    assert set(fresh.nodes()) == {"grpo", "a"} and fresh.root() == "grpo"
    assert list(fresh.skipped) == ["refs/heads/poise/D"]
    r = cli("drop", "D", "-C", a)
    assert r.returncode == 1 and "unknown node 'D'" in r.stderr, r.stderr
    for args in (("drop", "a"), ("restore", "a"), ("select",), ("gc", "--dry-run")):
        r = cli(*args, "-C", a)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (args, r.stderr)
    archive.git.run("update-ref", "-d", "refs/heads/poise/D")  # as the warning says
    assert set(archive.nodes()) == {"grpo", "a"} and archive.skipped == {}


def test_a_branch_to_a_commit_of_no_node_is_no_second_root(archive, cli):
    """A commit without ``Poise-Node: <its branch's name>`` is no node: not a second root in the
    lineage, not droppable as a root, not selected, and no pending work of the loop."""
    archive.spawn("grpo", "a")
    empty_tree = archive.git.text("mktree", input=b"").strip()
    commit = archive.git.commit_tree(empty_tree, [], "x\n")
    archive.git.run("update-ref", "refs/heads/poise/D", commit)
    a = str(archive.path)
    r = cli("log", "-C", a)
    assert r.returncode == 0 and "ignoring refs/heads/poise/D:" in r.stderr, r.stderr
    assert "D" not in r.stdout.split()
    assert set(archive.nodes()) == {"grpo", "a"} and archive.root() == "grpo"
    r = cli("drop", "D", "-C", a)
    assert r.returncode == 1 and "unknown node 'D'" in r.stderr and "root" not in r.stderr
    todo = pending_work(archive, archive.nodes())  # raised: node 'D' has no algorithm.py
    assert "D" not in todo.verify + todo.evaluate
    r = cli("select", "--json", "-C", a)
    assert r.returncode == 0 and '"D"' not in r.stdout, r.stdout + r.stderr
    assert (
        cli("drop", "a", "-C", a).returncode == 0 and cli("restore", "a", "-C", a).returncode == 0
    )


@pytest.mark.parametrize(
    "content,why",
    [
        (b"def compute_advantages(batch, cfg):\n    return '\xff\xfe'\n", "not valid UTF-8 (byte"),
        (DEEP.encode(), "deeper than 50"),
        (("x = [" * 1500 + "]" * 1500 + "\n").encode(), "deeper than 50"),
        (CHAIN.encode(), "operators in one statement"),
        (b"x = 1\x00\n", "NUL byte"),
    ],
    ids=["invalid-utf8", "parentheses", "lists", "operator-chain", "nul"],
)
def test_spawn_refuses_unparseable_edits_with_one_line(archive, cli, tmp_path, content, why):
    edit = tmp_path / "e.py"
    edit.write_bytes(content)
    before = archive.git.text("for-each-ref")
    r = cli("spawn", "grpo", "--name", "c", "--edit", str(edit), "-C", str(archive.path))
    assert r.returncode == 1 and why in r.stderr, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 3
    assert archive.git.text("for-each-ref") == before and archive.fsck()


@pytest.mark.slow  # several CLI processes / a sandboxed verification: seconds of CPU each
@pytest.mark.parametrize("code", [DEEP, CHAIN], ids=["parentheses", "operator-chain"])
def test_code_from_an_llm_reply_is_bounded_too(tmp_path, cli, code):
    """`spawn --auto` with an endpoint that replies with code no parser survives: a rejected node."""
    import openai_server

    toml = tmp_path / "poise.toml"
    toml.write_text(
        '[propose]\nproposer = "llm"\ncorrection_rounds = 1\npopulation = 1\n'
        '[llm]\nmodel = "gpt-4o-mini"\napi_key_env = "POISE_TEST_KEY"\n'
    )
    assert cli("init", str(tmp_path / "exp"), "--config", str(toml)).returncode == 0
    with openai_server.ScriptedOpenAI([openai_server.proposal_reply("deep", code)]) as srv:
        env = {"OPENAI_BASE_URL": srv.base_url, "POISE_TEST_KEY": "sk-test-key"}
        r = cli("spawn", "grpo", "--auto", "-C", str(tmp_path / "exp"), env=env)
    assert r.returncode == EXIT_REJECTED and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert (
        "deeper than" in r.stdout + r.stderr or "operators in one statement" in r.stdout + r.stderr
    )
    arch = Archive(tmp_path / "exp")
    assert all(n.status in ("spawned", "rejected") for n in arch.nodes().values()) and arch.fsck()


def test_a_ref_lock_left_by_a_killed_writer_is_named(archive):
    """git's lock file of a node's ref, left behind by a writer killed mid-update, makes every write
    to that node fail: the error names the file (not "the branch kept moving"), and removing it is
    all it takes."""
    from engine.errors import ArchiveError

    archive.spawn("grpo", "n")
    lock = archive.path / ".git" / "refs" / "heads" / "poise" / "n.lock"
    lock.write_text("")
    with pytest.raises(ArchiveError, match=r"git's lock file .*n\.lock exists") as exc:
        archive.commit_files("n", {"notes.md": "x"}, subject="a record", retries=2)
    assert "kept moving" not in str(exc.value)
    (archive.path / ".git" / "refs" / "heads" / "poise" / "m.lock").write_text("")
    with pytest.raises(ArchiveError, match=r"m\.lock exists"):
        archive.spawn("grpo", "m")
    lock.unlink()
    archive.commit_files("n", {"notes.md": "x"}, subject="a record")
    assert "m" not in archive.nodes() and archive.fsck()


def test_locks_hold_across_linked_worktrees_of_an_archive(archive, tmp_path):
    """Refs live in the common git directory, shared by every linked worktree of an archive: the
    run lock taken through one worktree holds through another, and a stale ref lock is found there."""
    import subprocess

    from engine.archive.store import Archive
    from engine.errors import ArchiveError
    from engine.loop.state import RunStateError, run_lock

    archive.spawn("grpo", "n")
    other = tmp_path / "linked"
    subprocess.run(
        ["git", "-C", str(archive.path), "worktree", "add", "-q", "--detach", str(other)],
        check=True,
    )
    linked = Archive(other)
    with run_lock(archive):
        with pytest.raises(RunStateError, match="another `poise-git run`"):
            with run_lock(linked):
                pass
    (archive.path / ".git" / "refs" / "heads" / "poise" / "n.lock").write_text("")
    with pytest.raises(ArchiveError, match=r"n\.lock exists"):
        linked.commit_files("n", {"notes.md": "x"}, subject="a record", retries=2)


def test_a_branch_edited_by_hand_is_named_with_its_repair(archive, cli):
    """A commit a user added on ``poise/a`` and a renamed node branch each make that branch no
    node's: the warning and a command naming it say why and how to repair it, in one line each, and
    the repair brings the node back with the archive intact."""
    archive.spawn("grpo", "a")
    archive.spawn("a", "b")
    a = str(archive.path)
    node_commit = archive.tip("a")
    tree = archive.git.text("rev-parse", "poise/a^{tree}").strip()
    archive.git.run(
        "update-ref", "refs/heads/poise/a", archive.git.commit_tree(tree, [node_commit], "tweak\n")
    )
    archive.git.run("branch", "-m", "poise/b", "poise/bee")
    r = cli("log", "-C", a)
    assert r.returncode == 0, r.stderr
    assert f"git -C {a} branch -f poise/a {node_commit}" in r.stderr, r.stderr
    assert f"git -C {a} branch -m poise/bee poise/b" in r.stderr, r.stderr
    r = cli("show", "a", "-C", a)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    error = next(ln for ln in r.stderr.splitlines() if ln.startswith("error:"))
    assert "unknown node 'a'" in error and "no Poise-Node trailer" in error, r.stderr
    assert f"branch -f poise/a {node_commit}" in error
    r = cli("show", "bee", "-C", a)
    assert r.returncode == 1 and "branch -m poise/bee poise/b" in r.stderr, r.stderr
    archive.git.run("branch", "-f", "poise/a", node_commit)  # as the messages say
    archive.git.run("branch", "-m", "poise/bee", "poise/b")
    assert set(archive.nodes()) == {"grpo", "a", "b"} and archive.skipped == {}
    assert archive.fsck()


def test_a_node_whose_parent_branch_was_deleted_still_shows_its_mechanism(archive, cli, tmp_path):
    """``git branch -D poise/a`` under a child ``b``: ``show b`` and the diff it reflects on are
    taken against ``a`` as ``b`` was forked from it (its commit in ``b``'s own history)."""
    edit = tmp_path / "e.py"
    edit.write_text("def helper_scale():\n    return 2.0\n")
    archive.spawn("grpo", "a")
    archive.spawn("a", "b", edit.read_text())
    a = str(archive.path)
    archive.git.run("branch", "-D", "poise/a")
    r = cli("show", "b", "-C", a)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "mechanism diff vs a as b was forked from it" in r.stdout, r.stdout
    assert "+def helper_scale():" in r.stdout
    diff, against = archive.parent_diff("b", ["algorithm.py"])
    assert "+def helper_scale():" in diff and "its branch is gone" in against
    r = cli("reflect", "b", "--no-llm", "-C", a)
    assert r.returncode == 1 and "evaluate it first" in r.stderr  # one clear error, not 'a'
    assert archive.fsck()


def test_a_parent_branch_edited_by_hand_is_not_said_to_be_gone(archive):
    """``b``'s parent ``a`` has a branch, with a commit a user added on top (no node's now): the diff
    is still taken against ``a`` as ``b`` was forked from it, and says the branch is there, edited,
    not that it is gone."""
    archive.spawn("grpo", "a")
    archive.spawn("a", "b", "def helper_scale():\n    return 2.0\n")
    node_commit = archive.tip("a")
    tree = archive.git.text("rev-parse", "poise/a^{tree}").strip()
    archive.git.run(
        "update-ref", "refs/heads/poise/a", archive.git.commit_tree(tree, [node_commit], "tweak\n")
    )
    diff, against = archive.parent_diff("b", ["algorithm.py"])
    assert "+def helper_scale():" in diff
    assert f"({node_commit[:12]}; its branch is no node's" in against, against
    assert "gone" not in against
