"""An archive rooted at an algorithm.py of the user's own (``poise-git init --root FILE``): the root is
found by name wherever the archive needs it (configuration, run summary, confirm, ablate), it is
refused before anything is created when it breaks the shared interface, and the loop verifies it
before its first evaluation, as it would any candidate's code."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from engine.archive.edit import prior_source
from engine.archive.store import Archive
from engine.errors import ArchiveError, EditError
from engine.loop.budget import Budget
from engine.loop.core import Loop, RunOptions
from engine.loop.inline import InlineExecutor
from engine.loop.state import pending_work
from trainer_template import ALGORITHM_FILE

ANCHOR = ALGORITHM_FILE.read_text(encoding="utf-8").replace(
    "kl_coef: float = 0.001", "kl_coef: float = 0.1"
)


def fsck(path: Path) -> None:
    subprocess.run(["git", "-C", str(path), "fsck", "--strict"], check=True, capture_output=True)


def test_the_anchor_differs_from_the_template():
    assert ANCHOR != ALGORITHM_FILE.read_text(encoding="utf-8")


def test_a_root_of_your_own_is_found_by_name(tmp_path):
    arch = Archive.init(tmp_path / "a", algorithm=ANCHOR, root_name="anchor")
    assert arch.root() == "anchor"
    assert Archive(arch.path).root() == "anchor"  # from git alone, in a new handle
    assert arch.config().proxy.preset  # the root's poise.toml, without a grpo branch
    nodes = arch.nodes()
    assert list(nodes) == ["anchor"] and nodes["anchor"].parents == ()
    assert arch.algorithm("anchor") == ANCHOR
    fsck(arch.path)


def test_the_default_root_is_grpo(tmp_path):
    assert Archive.init(tmp_path / "a").root() == "grpo"


def test_children_do_not_change_the_root(tmp_path):
    arch = Archive.init(tmp_path / "a", algorithm=ANCHOR, root_name="anchor")
    arch.spawn("anchor", "kid", ANCHOR.replace("kl_coef: float = 0.1", "kl_coef: float = 0.2"))
    arch.spawn("anchor", "grpo", ANCHOR.replace("kl_coef: float = 0.1", "kl_coef: float = 0.3"))
    assert arch.root() == "anchor" and arch.nodes()["kid"].parents == ("anchor",)
    assert Archive(arch.path).root() == "anchor"  # a child named grpo is not the root


@pytest.mark.parametrize(
    "source, why",
    [
        ("def compute_advantages(batch, cfg):\n    return 1\n", "drops the interface function"),
        ("x = (\n", "syntax error"),
        (
            ALGORITHM_FILE.read_text(encoding="utf-8").replace(
                "def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters)",
                "def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters, extra=None)",
            ),
            "changes the signature",
        ),
    ],
)
def test_a_root_that_breaks_the_interface_is_refused_before_anything_exists(tmp_path, source, why):
    with pytest.raises(EditError, match=why):
        Archive.init(tmp_path / "a", algorithm=source, root_name="anchor")
    assert not (tmp_path / "a").exists()


def test_init_root_from_the_command_line(tmp_path, cli):
    src = tmp_path / "anchor.py"
    src.write_text(ANCHOR)
    res = cli("init", str(tmp_path / "a"), "--root", str(src), "--root-name", "anchor")
    assert res.returncode == 0, res.stderr
    assert "root node anchor" in res.stdout and "verifies it" in res.stdout
    assert Archive(tmp_path / "a").algorithm("anchor") == ANCHOR
    res = cli("init", str(tmp_path / "b"), "--root", str(src))
    assert res.returncode == 0 and Archive(tmp_path / "b").root() == "root"


def test_init_root_errors_are_clear_and_leave_nothing(tmp_path, cli):
    bad = tmp_path / "bad.py"
    bad.write_text("def compute_advantages(batch, cfg):\n    return 1\n")
    res = cli("init", str(tmp_path / "a"), "--root", str(bad))
    assert res.returncode != 0
    assert (
        "--root" in res.stderr and "policy_loss()" in res.stderr and "Traceback" not in res.stderr
    )
    res = cli("init", str(tmp_path / "a"), "--root", str(tmp_path / "missing.py"))
    assert res.returncode != 0 and "does not exist" in res.stderr
    good = tmp_path / "good.py"
    good.write_text(ANCHOR)
    res = cli("init", str(tmp_path / "a"), "--root", str(good), "--root-name", "no good")
    assert res.returncode != 0 and "invalid node name" in res.stderr
    assert not (tmp_path / "a").exists()


def test_the_loop_verifies_a_root_of_your_own_but_not_shipped_code(tmp_path):
    own = Archive.init(tmp_path / "own", algorithm=ANCHOR, root_name="anchor")
    todo = pending_work(own, own.nodes())
    assert todo.verify == ["anchor"] and todo.evaluate == []
    shipped = Archive.init(tmp_path / "shipped")
    todo = pending_work(shipped, shipped.nodes())
    assert todo.verify == [] and todo.evaluate == ["grpo"]
    prior = Archive.init(tmp_path / "prior", algorithm=prior_source("msa_grpo"), root_name="msa")
    todo = pending_work(prior, prior.nodes())
    assert todo.verify == [] and todo.evaluate == ["msa"]  # a published mechanism is shipped code


def test_an_archive_without_an_init_commit_has_no_root(tmp_path):
    arch = Archive.init(tmp_path / "a", algorithm=ANCHOR, root_name="anchor")
    git = ["git", "-C", str(arch.path)]
    tip = subprocess.run([*git, "rev-parse", "poise/anchor"], capture_output=True, text=True)
    tree = tip.stdout.strip() + "^{tree}"
    foreign = subprocess.run(
        [*git, "commit-tree", tree, "-m", "not an init"], capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run([*git, "update-ref", "refs/heads/poise/anchor", foreign], check=True)
    with pytest.raises(ArchiveError, match="no root node"):
        Archive(arch.path).root()


@pytest.mark.slow  # a real loop round on the tiny preset: verification and two evaluations, ~20 s
def test_a_search_from_a_root_of_your_own(tmp_path, cli):
    arch = Archive.init(tmp_path / "a", algorithm=ANCHOR, root_name="anchor")
    plan = {"preset": "tiny", "seeds": 1, "parents": 1, "population": 1, "rounds": 1}
    opts = RunOptions(plan=plan, budget=Budget(candidates=1), workers=1)
    Loop(arch, opts, executor=InlineExecutor(1)).run()
    nodes = arch.nodes("proxy/tiny")
    assert nodes["anchor"].status == "evaluated" and nodes["anchor"].result is not None
    assert arch.read_file("anchor", "verification.json")  # verified before it was evaluated
    (kid,) = [n for n in nodes.values() if n.parents]
    assert kid.parents == ("anchor",) and kid.status in ("evaluated", "failed", "rejected")
    res = cli("log", "-C", str(arch.path))
    assert res.returncode == 0 and "anchor" in res.stdout
    fsck(arch.path)


def test_run_makes_a_new_archive_from_your_root_and_refuses_it_for_an_existing_one(tmp_path, cli):
    bad = tmp_path / "bad.py"
    bad.write_text("x = (\n")
    args = ("--rounds", "1", "--parents", "1", "--population", "1", "--preset", "tiny")
    res = cli("run", "-C", str(tmp_path / "new"), "--root", str(bad), *args)
    assert res.returncode == 1 and "syntax error" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "new").exists()
    Archive.init(tmp_path / "old")
    good = tmp_path / "good.py"
    good.write_text(ANCHOR)
    res = cli("run", "-C", str(tmp_path / "old"), "--root", str(good), *args)
    assert res.returncode == 1 and "exists (its root is 'grpo')" in res.stderr
    assert list(Archive(tmp_path / "old").nodes()) == ["grpo"]  # nothing ran


def test_a_child_named_grpo_under_your_root_is_an_ordinary_node(tmp_path):
    from engine.archive.cleanup import drop

    arch = Archive.init(tmp_path / "a", algorithm=ANCHOR, root_name="anchor")
    arch.spawn("anchor", "grpo", ANCHOR.replace("kl_coef: float = 0.1", "kl_coef: float = 0.3"))
    # not root work the loop adopts: a hand-made child, like any other without a Poise-Round
    assert "grpo" not in pending_work(arch, arch.nodes()).verify
    assert drop(arch, ["grpo"]) == ["grpo"]  # droppable, as any leaf
    with pytest.raises(ArchiveError, match="'anchor' is a root node"):
        drop(arch, ["anchor"])
    fsck(arch.path)


def test_branches_fetched_from_another_archive_do_not_move_the_root(tmp_path):
    import time

    first = Archive.init(tmp_path / "first", algorithm=ANCHOR, root_name="anchor")
    time.sleep(1.1)  # the other archive's init commit is strictly newer
    Archive.init(tmp_path / "other", root_name="theirs")
    git = ["git", "-C", str(first.path)]
    refspec = "refs/heads/poise/theirs:refs/heads/poise/theirs"
    subprocess.run([*git, "fetch", "-q", str(tmp_path / "other"), refspec], check=True)
    from engine.archive.store import earliest_root as _root

    arch = Archive(first.path)
    assert arch.root() == "anchor" == _root(arch.nodes())  # one rule: the oldest init


def test_root_option_errors(tmp_path, cli):
    good = tmp_path / "good.py"
    good.write_text(ANCHOR)
    res = cli("init", str(tmp_path / "a"), "--root", str(tmp_path))
    assert res.returncode == 1 and "is a directory, not a file" in res.stderr
    res = cli("init", str(tmp_path / "a"), "--root", str(good), "--root-name", "")
    assert res.returncode == 1 and "--root-name is empty" in res.stderr
    assert not (tmp_path / "a").exists()
    res = cli("init", str(good))  # an existing file: an error, not a traceback
    assert res.returncode == 1 and "exists and is not a directory" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_a_rejected_root_stops_the_run_with_its_reason(tmp_path, cli):
    nan = ANCHOR.replace(
        "    return grpo_advantages(batch, cfg)\n",
        '    return grpo_advantages(batch, cfg) * float("nan")\n',
    )
    assert nan != ANCHOR
    src = tmp_path / "nan.py"
    src.write_text(nan)
    args = ("--rounds", "1", "--parents", "1", "--population", "1", "--preset", "tiny")
    res = cli(
        "run", "-C", str(tmp_path / "a"), "--root", str(src), "--seeds", "1", "--no-report", *args
    )
    assert res.returncode == 3, res.stderr  # rejected, as for a candidate
    out = " ".join(res.stdout.split())
    assert "the root node 'root' was rejected by verification" in out
    assert "[all_correct]" in out  # the reason as written, brackets and all (not read as markup)
    assert "no node can be a parent" not in out + res.stderr
    arch = Archive(tmp_path / "a")
    assert [n.status for n in arch.nodes().values()] == ["rejected"]  # nothing spawned under it
    fsck(arch.path)


def test_the_root_is_found_from_its_ref_which_an_archive_without_one_gets(tmp_path):
    """``refs/poise-root`` names the init commit: believed only where the branch of the node it
    names still holds it; an archive made before it, or one whose ref points elsewhere, finds the
    root by walking the lineage as before and records it."""
    from engine.archive.store import ROOT_REF

    arch = Archive.init(tmp_path / "a", algorithm=ANCHOR, root_name="anchor")
    git = ["git", "-C", str(arch.path)]

    def rev(ref: str) -> str:
        return subprocess.run(
            [*git, "rev-parse", ref], capture_output=True, text=True
        ).stdout.strip()

    init = rev("poise/anchor")
    assert rev(ROOT_REF) == init
    arch.spawn("anchor", "grpo", ANCHOR.replace("kl_coef: float = 0.1", "kl_coef: float = 0.3"))
    subprocess.run([*git, "update-ref", "-d", ROOT_REF], check=True)  # made before the ref
    assert Archive(arch.path).root() == "anchor" and rev(ROOT_REF) == init
    subprocess.run([*git, "update-ref", ROOT_REF, rev("poise/grpo")], check=True)  # no init
    assert Archive(arch.path).root() == "anchor" and rev(ROOT_REF) == init  # repaired


def test_a_root_named_root_is_what_git_log_poise_root_shows(tmp_path):
    """The archive's own refs never shadow a node's branch: git resolves ``poise/X`` to
    ``refs/poise/X`` before ``refs/heads/poise/X``, and the root's hint once sat at
    ``refs/poise/root``, so ``git log poise/root`` showed the init commit alone for a root named
    ``root``, whatever was recorded on its branch."""
    arch = Archive.init(tmp_path / "a", root_name="root")
    arch.record_reflection("root", "the root, reflected on")
    p = subprocess.run(
        ["git", "-C", str(arch.path), "log", "--format=%s", "poise/root"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert len(p.stdout.splitlines()) == 2, p.stdout
    assert "ambiguous" not in p.stderr, p.stderr
