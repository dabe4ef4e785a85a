"""Ablation (``poise-git ablate``): a node's changes to the root, each reverted alone, and, on the tiny
proxy preset, what each carries, measured end to end on real nodes."""

from __future__ import annotations

import difflib
import json
import subprocess

import pytest
from conftest import mark_verified, run_cli

from engine.archive.edit import apply_edit, check_interface
from engine.errors import EvaluationError
from engine.operators.ablation_changes import (
    ADDED,
    DEFINITION,
    HYPERPARAMETER,
    Change,
    node_changes,
    without,
)
from engine.operators.proposers.edit_plan import class_defaults
from engine.operators.proposers.hyperparams import set_defaults
from trainer_template import ALGORITHM_FILE

ROOT = ALGORITHM_FILE.read_text(encoding="utf-8")
SCALED = '''
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """GRPO advantages, shrunk."""
    return _shrunk(grpo_advantages(batch, cfg), cfg)


def _shrunk(adv, cfg):
    return adv / (1.0 + cfg.shrink)


def unused_hook(x):
    return x
'''
NEEDS_KL = '''
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """GRPO advantages; refuses to train without a strong KL anchor."""
    if cfg.kl_coef < 0.01:
        raise RuntimeError("deliberately broken without the anchor")
    return grpo_advantages(batch, cfg)
'''


def _node() -> str:
    src = set_defaults(ROOT, {"kl_coef": 0.1, "clip_ratio_high": 0.3, "shrink": 0.5})
    return apply_edit(src, SCALED)


def test_a_nodes_changes_are_its_edits_to_the_root_one_by_one():
    changes = node_changes(_node(), ROOT)
    assert changes == [
        Change(HYPERPARAMETER, "clip_ratio_high", 0.3, 0.2),
        Change(HYPERPARAMETER, "kl_coef", 0.1, 0.001),
        Change(DEFINITION, "compute_advantages"),
        Change(ADDED, "unused_hook"),
    ]  # `shrink` and `_shrunk` serve the rewritten compute_advantages: not changes of their own
    assert changes[1].describe() == "kl_coef = 0.1 (root: 0.001)" and changes[1].slug == "kl-coef"
    assert node_changes(ROOT, ROOT) == []
    # a docstring or a comment is not a change of mechanism
    redoc = ROOT.replace('"""Sequence-level GRPO advantages', '"""Other words for the advantages')
    assert redoc != ROOT and node_changes(redoc + "\n# a comment\n", ROOT) == []


@pytest.mark.parametrize("i", range(4))
def test_each_change_is_reverted_alone_and_every_other_line_kept(i):
    node = _node()
    changes = node_changes(node, ROOT)
    change = changes[i]
    out = without(node, ROOT, change)
    check_interface(ROOT, out)
    compile(out, "algorithm.py", "exec")
    left = node_changes(out, ROOT)
    expected = [c for c in changes if c != change]
    if change.name == "compute_advantages":  # its helper is left behind, called by nothing
        expected.append(Change(ADDED, "_shrunk"))
    assert sorted(left, key=repr) == sorted(expected, key=repr)
    removed = [ln for ln in difflib.ndiff(node.splitlines(), out.splitlines()) if ln[:1] == "-"]
    added = [ln for ln in difflib.ndiff(node.splitlines(), out.splitlines()) if ln[:1] == "+"]
    if change.kind == HYPERPARAMETER:  # one default, in place
        assert len(removed) == len(added) == 1 and change.name in removed[0]
        assert class_defaults(out)[change.name] == change.root_value
    elif change.kind == ADDED:  # the definition is gone, nothing else touched
        assert f"def {change.name}" not in out and not added
    else:  # the root's definition, in the node's place for it
        assert out.index("def compute_advantages") < out.index("def _shrunk")
        assert "return grpo_advantages(batch, cfg)" in out and "_shrunk(grpo" not in out


def test_ablate_refuses_what_it_cannot_ablate(archive):
    from engine.operators.ablate import ablate_node

    exp = archive.config().experiment
    archive.spawn("grpo", "kc", algorithm=set_defaults(ROOT, {"kl_coef": 0.1}))
    with pytest.raises(EvaluationError, match="unknown node 'ghost'"):
        ablate_node(archive, "ghost", exp, preset="tiny")
    with pytest.raises(EvaluationError, match="unknown root 'nope'"):
        ablate_node(archive, "kc", exp, preset="tiny", root="nope")
    with pytest.raises(EvaluationError, match="grpo is the root"):
        ablate_node(archive, "grpo", exp, preset="tiny")
    with pytest.raises(EvaluationError, match="kc has no evaluated result under proxy/tiny@"):
        ablate_node(archive, "kc", exp, preset="tiny")
    with pytest.raises(EvaluationError, match="unknown proxy preset 'giant'"):
        ablate_node(archive, "kc", exp, preset="giant")
    assert sorted(archive.nodes()) == ["grpo", "kc"] and archive.fsck()


def test_the_ablation_names_what_its_values_measure(archive):
    """With a length penalty the values are U, not the objective's metric: the table's column and the
    JSON say so (read from recorded results: the one change's child is the root, nothing trains)."""
    from results_util import record

    from engine.cli.ablate import ablation_table
    from engine.operators.ablate import ablate_node
    from engine.select.objective import with_objective

    def rows(overall, length):
        return [
            {"seed": s, "status": "evaluated", "metrics": {"overall": o, "mean_length": ln}}
            for s, (o, ln) in enumerate(zip(overall, length))
        ]

    archive.spawn("grpo", "kc", algorithm=set_defaults(ROOT, {"kl_coef": 0.1}))
    for name, overall, length in (("grpo", [0.5, 0.6], [10, 20]), ("kc", [0.7, 0.6], [10, 10])):
        metrics = {"overall": sum(overall) / 2, "mean_length": sum(length) / 2}
        payload = {"metrics": metrics, "seeds": [0, 1], "per_seed": rows(overall, length)}
        record(archive, name, payload, preset="tiny")
    exp = with_objective(archive.config().experiment, "overall - 0.01*mean_length")
    ab = ablate_node(archive, "kc", exp, preset="tiny")
    (row,) = ab.rows
    assert row.child == "grpo" and row.reused and row.status == "evaluated"
    assert (row.origin, row.evaluated_now) == ("existing", False)
    assert row.value == pytest.approx((0.5 - 0.1 + 0.6 - 0.2) / 2)  # U, not Overall's 0.55
    assert ab.objective == "overall - 0.01*mean_length"
    data = ab.to_json()
    assert data["objective"] == "overall - 0.01*mean_length" and "overall" not in data["changes"][0]
    assert data["changes"][0]["overall - 0.01*mean_length"] == pytest.approx(row.value)
    headers = [c.header for c in ablation_table(ab).columns]
    assert "overall - 0.01*mean_length" in headers and "overall" not in headers


def test_a_rerun_after_an_interrupted_ablation_says_which_children_it_resumed(archive, monkeypatch):
    """An ablation stopped (Ctrl-C, killed) after spawning a child and before evaluating it: the rerun
    finds that child by its mechanism and evaluates it, and says where it comes from (an earlier,
    interrupted ablation of the node) rather than calling it an existing node; a third run reads
    both children's results. Evaluations are recorded results here: nothing trains."""
    import io

    from results_util import proxy_result, record
    from rich.console import Console

    import engine.operators.ablate as ablate_mod
    from engine.cli.ablate import ablation_table

    def payload(values):
        rows = [{"seed": s, "status": "evaluated", "metrics": {"overall": v}} for s, v in values]
        mean = sum(v for _, v in values) / len(values)
        return {"metrics": {"overall": mean}, "seeds": [s for s, _ in values], "per_seed": rows}

    def stopped(*_a, **_kw):
        raise KeyboardInterrupt

    def evaluate(arch, name, *, seeds, preset, **_kw):
        p = payload([(s, 0.55 + 0.01 * s) for s in seeds])
        record(arch, name, p, preset=preset)
        return proxy_result(p, preset)

    def table_text(ab) -> str:
        out = io.StringIO()
        Console(file=out, width=300).print(ablation_table(ab))
        return out.getvalue()

    archive.spawn(
        "grpo", "kc", algorithm=set_defaults(ROOT, {"kl_coef": 0.1, "clip_ratio_high": 0.3})
    )
    record(archive, "grpo", payload([(0, 0.5), (1, 0.52)]), preset="tiny")
    record(archive, "kc", payload([(0, 0.6), (1, 0.61)]), preset="tiny")
    monkeypatch.setattr(ablate_mod, "evaluation_gate", lambda *_a: False)
    exp = archive.config().experiment
    monkeypatch.setattr(ablate_mod, "evaluate_node", stopped)
    with pytest.raises(KeyboardInterrupt):
        ablate_mod.ablate_node(archive, "kc", exp, preset="tiny")
    assert sorted(archive.nodes()) == ["grpo", "kc", "kc-no-clip-ratio-high"]
    monkeypatch.setattr(ablate_mod, "evaluate_node", evaluate)
    events: list[str] = []
    ab = ablate_mod.ablate_node(archive, "kc", exp, preset="tiny", on_event=events.append)
    text = table_text(ab)
    assert (
        "kc-no-clip-ratio-high (spawned by an earlier, interrupted ablation of kc; evaluated now)"
        in text
    )
    assert "(existing" not in text and "kc-no-kl-coef (" not in text
    resumed, new = ab.rows
    assert (resumed.child, resumed.origin, resumed.evaluated_now) == (
        "kc-no-clip-ratio-high",
        ablate_mod.INTERRUPTED,
        True,
    )
    assert (new.child, new.origin, new.evaluated_now) == ("kc-no-kl-coef", ablate_mod.SPAWNED, True)
    assert (
        "without clip_ratio_high: kc-no-clip-ratio-high, spawned by an earlier ablation of kc "
        "that was interrupted" in events
    )
    assert [c["origin"] for c in ab.to_json()["changes"]] == ["interrupted", "spawned"]
    # a third run trains nothing: both children come from an earlier ablation, already evaluated
    monkeypatch.setattr(ablate_mod, "evaluate_node", stopped)
    again = ablate_mod.ablate_node(archive, "kc", exp, preset="tiny")
    assert [(r.origin, r.evaluated_now) for r in again.rows] == [(ablate_mod.EARLIER, False)] * 2
    text = table_text(again)
    for child in ("kc-no-clip-ratio-high", "kc-no-kl-coef"):
        assert f"{child} (spawned by an earlier ablation of kc; already evaluated)" in text
    assert archive.fsck()


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """An archive with grpo and two evaluated nodes on tiny-preset seeds 0 and 1: `kc` (the KL anchor
    and clip-higher) and `kb` (the anchor, and an advantage that raises without it)."""
    from engine.archive.store import Archive
    from engine.operators.evaluate import evaluate_node

    mp = pytest.MonkeyPatch()
    mp.setenv("POISE_CACHE_DIR", str(tmp_path_factory.mktemp("proxy-cache")))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.delenv("POISE_EVAL_CACHE", raising=False)
    arch = Archive.init(tmp_path_factory.mktemp("arch") / "exp")
    arch.spawn("grpo", "kc", algorithm=set_defaults(ROOT, {"kl_coef": 0.1, "clip_ratio_high": 0.3}))
    arch.spawn("grpo", "kb", algorithm=apply_edit(set_defaults(ROOT, {"kl_coef": 0.1}), NEEDS_KL))
    for name in ("kc", "kb"):
        mark_verified(arch, name)
    for name in ("grpo", "kc", "kb"):
        assert evaluate_node(arch, name, seeds=2, preset="tiny").ok
    yield arch
    mp.undo()


@pytest.mark.slow  # two tiny-preset children at two seeds, then the same ablation again
def test_ablate_measures_each_change_at_the_nodes_seeds_and_a_second_time_trains_nothing(evaluated):
    from engine.archive.store import Archive
    from engine.archive.tracking import find_runs
    from engine.operators.ablate import CARRIES, HURTS, WITHIN, ablate_node
    from engine.select.objective import seed_utilities
    from engine.stats import paired_interval

    arch = evaluated
    exp = arch.config().experiment
    events: list[str] = []
    ab = ablate_node(arch, "kc", exp, preset="tiny", on_event=events.append)
    assert ab.seeds == (0, 1) and ab.protocol.startswith("proxy/tiny@")
    assert [r.change.name for r in ab.rows] == ["clip_ratio_high", "kl_coef"]
    nodes = Archive(arch.path).nodes(ab.protocol)
    node_values = seed_utilities(nodes["kc"].result, exp)
    for row in ab.rows:
        child = nodes[row.child]
        assert not row.reused and child.parent == "kc" and child.status == "evaluated"
        assert (
            child.trailer("Poise-Proposer") == "ablation" and child.trailer("Poise-Ablates") == "kc"
        )
        # the child is kc with that one default set back: `git diff` shows one line each way
        diff = arch.git.text("diff", "poise/kc", f"poise/{row.child}", "--", "algorithm.py")
        changed = [
            ln for ln in diff.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")
        ]
        assert len(changed) == 2 and row.change.name in changed[0], diff
        # the numbers are the archive's: kc's and the child's recorded per-seed results, paired
        mean, iv, n = paired_interval(node_values, seed_utilities(child.result, exp))
        assert row.contribution == (mean, tuple(iv), n) and n == 2
        assert row.value == pytest.approx(child.result.metrics["overall"])
        assert row.verdict in (CARRIES, HURTS, WITHIN)
    gain = paired_interval(node_values, seed_utilities(nodes["grpo"].result, exp))
    assert ab.gain == (gain[0], tuple(gain[1]), 2)
    assert any("spawned kc-no-kl-coef" in e for e in events)
    assert any("kc-no-kl-coef: seed 1" in e for e in events)
    # MLflow runs of the children say what they were for
    tagged = find_runs(arch, "kc-no-kl-coef")
    assert tagged and all(r.data.tags.get("poise.ablates") == "kc" for r in tagged)
    # again: every child is found as the existing node with its mechanism; nothing is trained
    before = {n: v.commit for n, v in Archive(arch.path).nodes().items()}
    again = ablate_node(arch, "kc", exp, preset="tiny")
    assert [r.reused for r in again.rows] == [True, True]
    assert [(r.child, r.contribution) for r in again.rows] == [
        (r.child, r.contribution) for r in ab.rows
    ]
    assert {n: v.commit for n, v in Archive(arch.path).nodes().items()} == before
    assert len(find_runs(arch, "kc-no-kl-coef")) == len(tagged)
    # kc evaluated at a third seed: its ablation children are evaluated there too and recorded at all
    # three (the root's recorded result, which the selection reads, is left as it was)
    from engine.operators.evaluate import evaluate_node

    root_result = Archive(arch.path).nodes(ab.protocol)["grpo"].result
    assert evaluate_node(arch, "kc", seeds=3, preset="tiny").ok
    third = ablate_node(arch, "kc", exp, preset="tiny")
    assert third.seeds == (0, 1, 2) and [r.contribution[2] for r in third.rows] == [3, 3]
    nodes = Archive(arch.path).nodes(ab.protocol)
    assert all(nodes[r.child].result.seeds == (0, 1, 2) for r in third.rows)
    assert nodes["grpo"].result == root_result and third.gain[2] == 2
    assert arch.fsck()


@pytest.mark.slow  # one tiny-preset child (the other is the existing kc), one failing child
def test_a_rejected_child_is_reported_and_the_cli_exits_3(evaluated, tmp_path):
    arch = evaluated
    out_json = tmp_path / "ablation.json"
    args = ("ablate", "kb", "--preset", "tiny", "--json", str(out_json), "-C", str(arch.path))
    out = run_cli(*args)
    assert out.returncode == 3, out.stdout + out.stderr
    data = json.loads(out_json.read_text())
    rows = {r["name"]: r for r in data["changes"]}
    assert set(rows) == {"kl_coef", "compute_advantages"}
    # without the anchor kb's advantage raises: its generated tests reject the child, and say why
    assert rows["kl_coef"]["status"] == "rejected" and rows["kl_coef"]["contribution"] is None
    assert "deliberately broken" in rows["kl_coef"]["reason"]
    # without its advantage kb is GRPO with the anchor alone: no new node, an existing mechanism
    kept = rows["compute_advantages"]
    assert kept["status"] == "evaluated" and kept["contribution"]["seeds"] == 2
    # (GRPO with the anchor is kc without clip-higher, where that ablation ran first)
    assert kept["child"] == (
        "kc-no-clip-ratio-high" if kept["reused"] else "kb-no-compute-advantages"
    )
    assert data["seeds"] == [0, 1] and data["protocol"].startswith("proxy/tiny@")
    assert "kb-no-kl-coef rejected:" in out.stdout and "deliberately broken" in out.stdout
    assert arch.node("kb-no-kl-coef").status == "rejected"
    assert subprocess.run(["git", "-C", str(arch.path), "fsck", "--strict"]).returncode == 0
