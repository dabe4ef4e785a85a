"""Proposal: tiered context, screening (consistency, feasibility, behavioural novelty), the offline
proposer end to end with no network, the LLM proposer end to end, and --replay with the server stopped."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

import openai_server  # tests/openai_server.py (tests/ is on pythonpath)
import pytest
from results_util import collapsing_root, record, remedied_child

from engine.archive.store import Archive
from engine.errors import PoiseError
from engine.operators.context import build_context, pareto_nodes
from engine.operators.propose import Proposal, screen
from engine.operators.proposers import available, get_proposer, register
from engine.operators.proposers.codegen import normalize, render
from engine.operators.proposers.hyperparams import set_defaults

RLOO = '''\
@dataclass
class Hyperparameters:
    eps: float = 1e-6
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    kl_coef: float = 0.0
    kl_type: str = "low_var_kl"
    entropy_coef: float = 0.0
    loo_scale: float = 1.0
    """multiplier of the leave-one-out advantage"""


def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """RLOO: reward minus the mean of the other samples of the group, scaled."""
    scores = batch.rewards.to(torch.float32)
    stats = group_stats(scores, batch.group)
    base = torch.where(stats.count < 2, torch.zeros_like(scores), stats.loo_mean)
    return cfg.loo_scale * (scores - base)
'''
GRPO_REWRITTEN = '''\
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """GRPO again, written differently: same behaviour."""
    r = batch.rewards.float()
    s = group_stats(r, batch.group)
    one = s.count < 2
    centred = r - torch.where(one, torch.zeros_like(r), s.mean)
    if not cfg.norm_adv_by_std:
        return centred
    return centred / (torch.where(one, torch.ones_like(r), s.unbiased_std()) + cfg.eps)
'''
LLM_TOML = (
    '[propose]\nproposer = "llm"\npopulation = 2\n[llm]\nmodel = "gpt-4o-mini"\napi_key_env = "POISE_TEST_KEY"\n'
    '[experiment]\ndirective = "cut mean response length by a quarter without losing Overall"\n'
)


def prop(name, edit, **kw):
    return Proposal(
        name=name,
        motivation="m",
        mechanism=f"{name} mechanism",
        expected_effect="e",
        edit=edit,
        **kw,
    )


def test_registry():
    assert {"offline", "llm"} <= set(available())
    with pytest.raises(PoiseError, match="unknown proposer"):
        get_proposer("nope")
    with pytest.raises(PoiseError, match="already registered"):
        register("offline")(type("Other", (), {}))
    with pytest.raises(PoiseError, match="needs an LLM client"):
        get_proposer("llm")


def test_codegen_and_defaults():
    src = render({"baseline": "valid_bayes", "scale": "analytic", "hp": {"prior_strength": 2.0}})
    assert (
        "cfg.prior_strength" in src
        and "cfg.std_floor" in src
        and "prior_strength: float = 2.0" in src
    )
    assert "invalid_penalty" not in normalize({"invalid": "none"})["hp"]
    root = (
        Path(__file__).resolve().parents[1].joinpath("trainer_template", "algorithm.py").read_text()
    )
    out = set_defaults(root, {"clip_ratio_high": 0.28, "new_knob": 3})
    assert "clip_ratio_high: float = 0.28" in out and "new_knob: int = 3" in out
    assert (
        out.replace("0.28", "0.2").replace("    new_knob: int = 3\n", "") == root
    )  # every other byte kept
    with pytest.raises(PoiseError, match="unknown baseline"):
        normalize({"baseline": "magic"})


@pytest.mark.slow
def test_screening_drops_inconsistent_and_behavioural_duplicates(archive):
    cfg = archive.config()
    cands = [
        prop("rloo", RLOO, hyperparameters={"loo_scale": 1.5}, expected_gain=0.7),
        prop("rloo-again", RLOO, hyperparameters={"loo_scale": 1.5}, expected_gain=0.4),
        prop("grpo-rewritten", GRPO_REWRITTEN),
        prop("unused-knob", RLOO, hyperparameters={"not_a_knob": 1.0}),
        prop("nothing", ""),
        prop("needs-fixing", "import os\n\n\n" + RLOO),
    ]
    kept, dropped = screen(archive, "grpo", cands, cfg)
    why = {p.name: p.screening.get("reason", "") for p in dropped}
    assert [p.name for p in kept] == ["rloo", "needs-fixing"]
    assert kept[0].screening["feasible"] and kept[0].screening["novelty"] > 0.01
    assert (
        not kept[1].screening["feasible"]
        and "import of 'os'" in kept[1].screening["needs_correction"]
    )
    assert kept[1].score < kept[0].score
    assert why["grpo-rewritten"].startswith("duplicate: behaves like archived node 'grpo'")
    assert why["rloo-again"].startswith("duplicate: behaves like the better-ranked proposal 'rloo'")
    assert "not_a_knob" in why["unused-knob"] and "changes nothing" in why["nothing"]


def test_context_tiers(archive):
    cfg = archive.config()
    for name, parent, overall in (
        ("a", "grpo", 0.30),
        ("b", "a", 0.50),
        ("c", "grpo", 0.40),
        ("d", "c", 0.20),
    ):
        archive.spawn(parent, name, proposal=f"# {name}\n\n## Mechanism\nmechanism of {name}\n")
        record(archive, name, {"overall": overall, "mean_length": 100 * overall})
    archive.spawn("grpo", "bad", "import os\n", proposal="# bad\n")
    archive.set_status("bad", "rejected", "static check: import of 'os' is not allowed")
    ctx = build_context(archive, "a", cfg, seed=0)
    assert ctx.parent.name == "a" and ctx.parent.mechanism == "mechanism of a"
    assert [s.name for s in ctx.frontier] == ["b"]
    assert {s.name for s in ctx.exploratory} <= {"c", "d"} and "b" not in {
        s.name for s in ctx.exploratory
    }
    assert [s.name for s in ctx.rejected] == ["bad"] and "import of 'os'" in ctx.rejected[0].reason
    text = ctx.render()
    assert "Pareto-frontier" in text and "avoid repeating" in text and "```python" in text
    assert pareto_nodes(
        {"x": {"o": 1, "l": 5}, "y": {"o": 2, "l": 9}, "z": {"o": 0.5, "l": 6}}, ("o", "-l")
    ) == ["x", "y"]


def test_frontier_references_rank_a_utility_of_zero_as_a_number(tmp_path):
    """The frontier tier keeps its best MAX_PER_TIER nodes by U; U = 0.0 (here overall 0.5 minus
    0.01 x 50 tokens) is the best of them, not a missing utility ranked below every negative one."""
    toml = (
        '[experiment]\nobjective = "overall"\nlength_penalty = 0.01\n'
        'pareto_objectives = ["overall", "-mean_length"]\n'
    )
    arch = Archive.init(tmp_path / "exp", config_toml=toml)
    record(arch, "grpo", {"overall": 0.2, "mean_length": 60})
    for name, overall, length in (("a", 0.5, 50), ("b", 0.6, 70), ("c", 0.7, 90), ("d", 0.8, 110)):
        arch.spawn("grpo", name)  # a trade-off: all four on the front, U = 0, -0.1, -0.2, -0.3
        record(arch, name, {"overall": overall, "mean_length": length})
    arch.spawn("grpo", "p")
    record(arch, "p", {"overall": 0.3, "mean_length": 60})
    ctx = build_context(arch, "p", arch.config(), seed=0)
    assert [s.name for s in ctx.frontier] == ["a", "b", "c"] and ctx.frontier[0].utility == 0.0


def test_exploratory_references_are_seeded_without_a_seed(archive):
    """`poise-git propose` without --seed: the exploratory sample is seeded by the archive size, as
    the proposer's own draws are, so the same archive gives the same context (and prompt)."""
    record(archive, "grpo", {"overall": 0.4})
    archive.spawn("grpo", "p")
    record(archive, "p", {"overall": 0.45})
    for i in range(10):
        archive.spawn("grpo", f"o{i}")
        record(archive, f"o{i}", {"overall": 0.3 + i / 100})
    cfg = archive.config()
    seen = {tuple(s.name for s in build_context(archive, "p", cfg).exploratory) for _ in range(4)}
    assert len(seen) == 1 and len(next(iter(seen))) == 3


@pytest.mark.slow  # CLI proposal with fingerprinting and verification
def test_offline_proposer_needs_no_network(tmp_path, cli):
    exp = tmp_path / "exp"
    assert cli("init", str(exp)).returncode == 0
    env = {
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "OPENAI_API_KEY": "",
    }  # nothing listens there
    r = cli(
        "spawn", "grpo", "--auto", "--proposer", "offline", "--seed", "3", "-C", str(exp), env=env
    )
    assert r.returncode == 0, r.stdout + r.stderr
    arch = Archive(exp)
    child = next(n for n in arch.nodes().values() if n.name != "grpo")
    assert child.status == "verified" and child.trailer("Poise-Proposer") == "offline"
    rec = json.loads(arch.read_file(child.name, "records/proposal.json"))
    assert rec["components"]["baseline"] in ("group_mean", "loo", "valid_bayes", "batch")
    assert arch.read_file(child.name, "tests/test_intent.py") is not None
    assert json.loads(arch.read_file(child.name, "verification.json"))["ok"]
    assert arch.diff("grpo", child.name, ["algorithm.py"])  # real code changed
    # the offline proposer is deterministic for a seed and reads the child's components next time
    off = get_proposer("offline")
    ctx = build_context(arch, child.name, arch.config(), seed=1)
    a = off.propose(arch, child.name, ctx, arch.config(), 3, 1)
    b = off.propose(arch, child.name, ctx, arch.config(), 3, 1)
    assert [p.edit for p in a] == [p.edit for p in b] and len({p.edit for p in a}) > 1
    assert ctx.parent.components == rec["components"]
    assert arch.fsck()


@pytest.mark.slow  # LLM proposal, correction and replay through the CLI
def test_llm_proposal_to_verified_node_and_replay(tmp_path, cli):
    S = openai_server
    toml = tmp_path / "poise.toml"
    toml.write_text(LLM_TOML)
    exp = tmp_path / "exp"
    assert cli("init", str(exp), "--config", str(toml)).returncode == 0
    reply = S.proposal_reply(
        "RLOO scaled",
        RLOO,
        hyperparameters={"loo_scale": 1.5},
        intents=("correct_above_wrong", "rare_success_larger"),
    )
    with S.ScriptedOpenAI(["{broken json", reply]) as srv:  # the first reply is malformed: re-asked
        env = {"OPENAI_BASE_URL": srv.base_url, "POISE_TEST_KEY": "sk-test-key"}
        r1 = cli("propose", "grpo", "--json", "-C", str(exp), env=env)
        srv.default = lambda req: reply
        r2 = cli("spawn", "grpo", "--auto", "-C", str(exp), env=env)
    assert r1.returncode == 0, r1.stdout + r1.stderr
    assert r2.returncode == 0, r2.stdout + r2.stderr
    assert "cut mean response length" in srv.requests[0]["messages"][1]["content"]
    kept = json.loads(r1.stdout)["kept"]
    assert [k["name"] for k in kept] == ["rloo-scaled"] and kept[0]["proposer"] == "llm"
    arch = Archive(exp)
    node = arch.node("rloo-scaled")
    assert node.status == "verified" and node.trailer("Poise-Proposer") == "llm"
    assert "loo_scale: float = 1.5" in arch.algorithm("rloo-scaled")
    assert "def test_intent_rare_success_larger" in arch.read_file(
        "rloo-scaled", "tests/test_intent.py"
    )
    assert (
        json.loads(arch.read_file("rloo-scaled", "records/llm_usage.json"))["propose_call"]["calls"]
        >= 1
    )
    # --replay with the server stopped: the same proposals, and the same node in a fresh archive
    fresh = tmp_path / "fresh"
    assert cli("init", str(fresh), "--config", str(toml)).returncode == 0
    subprocess.run(
        ["git", "-C", str(fresh), "fetch", "-q", str(exp), "refs/poise-llm/*:refs/poise-llm/*"],
        check=True,
    )
    r3 = cli(
        "propose",
        "grpo",
        "--json",
        "--replay",
        "-C",
        str(fresh),
        env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"},
    )
    assert r3.returncode == 0, r3.stderr
    replayed = json.loads(r3.stdout)["kept"]
    usage, usage0 = replayed[0].pop("llm_usage"), kept[0].pop("llm_usage")
    assert replayed == kept and usage["replayed"] == usage["calls"] == usage0["calls"] == 2
    r4 = cli(
        "spawn",
        "grpo",
        "--auto",
        "--replay",
        "-C",
        str(fresh),
        env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"},
    )
    assert r4.returncode == 0, r4.stdout + r4.stderr
    assert Archive(fresh).algorithm("rloo-scaled") == arch.algorithm("rloo-scaled")
    assert Archive(fresh).node("rloo-scaled").status == "verified"


def test_fingerprint_ignores_a_constant_scale_but_sees_loss_terms():
    from engine.operators.fingerprint import DUPLICATE_TOL, compute, distance
    from trainer_template.loader import load_algorithm, make_config

    root = (
        Path(__file__).resolve().parents[1].joinpath("trainer_template", "algorithm.py").read_text()
    )
    g = compute(load_algorithm(root, "g"))
    scaled = root.replace(
        "return centred / (std + cfg.eps)", "return 2.0 * centred / (std + cfg.eps)"
    )
    assert scaled != root and distance(g, compute(load_algorithm(scaled, "s"))) < DUPLICATE_TOL
    dr = root.replace("if cfg.norm_adv_by_std:", "if False:")
    assert distance(g, compute(load_algorithm(dr, "dr"))) > 0.01
    m = load_algorithm(root, "kl")
    assert distance(g, compute(m, make_config(m, {"kl_coef": 0.01}))) > 0.1
    assert distance(g, compute(m, make_config(m, {"entropy_coef": 0.001}))) > 0.1


def _root_source() -> str:
    return (
        Path(__file__).resolve().parents[1].joinpath("trainer_template", "algorithm.py").read_text()
    )


def _changed_lines(a: str, b: str) -> list[str]:
    import difflib

    return [
        ln
        for ln in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)
        if ln[:1] in "+-" and not ln.startswith(("+++", "---"))
    ]


def test_offline_edits_touch_only_the_definitions_they_change():
    from engine.operators.implement import build_source
    from engine.operators.proposers.codegen import DEFAULT_SPEC
    from engine.operators.proposers.edit_plan import plan_edit

    root = _root_source()
    # a loss-knob mutation: one field default changes, nothing else (no class rewrite, 1e-6 stays)
    spec = normalize({"hp": {**DEFAULT_SPEC["hp"], "clip_ratio_high": 0.28}})
    plan = plan_edit(root, DEFAULT_SPEC, spec, rendered=False)
    assert plan.edit == "" and plan.hyperparameters == {"clip_ratio_high": 0.28}
    child = build_source(root, plan.edit, plan.hyperparameters, plan.drop)
    assert _changed_lines(root, child) == [
        "-    clip_ratio_high: float = 0.2",
        "+    clip_ratio_high: float = 0.28",
    ]
    assert "eps: float = 1e-6" in child
    # an advantage mutation: compute_advantages and one new documented field, the loss untouched
    spec = normalize({"scale": "analytic", "hp": {"std_floor": 0.25}})
    plan = plan_edit(root, DEFAULT_SPEC, spec, rendered=False)
    assert "def compute_advantages" in plan.edit
    assert "class Hyperparameters" not in plan.edit and "def policy_loss" not in plan.edit
    assert plan.hyperparameters == {"std_floor": 0.25}
    child = build_source(root, plan.edit, plan.hyperparameters, plan.drop)
    diff = _changed_lines(root, child)
    assert (
        "+    std_floor: float = 0.25" in diff
        and '+    """floor of the analytic scale' in " ".join(diff)
    )
    assert not [ln for ln in diff if ln.startswith("-") and ("cfg.clip" in ln or ": " in ln[:30])]
    assert child.split("def policy_loss")[1] == root.split("def policy_loss")[1]
    # back to the group std: the field the child no longer reads goes, with its docstring
    back = normalize({"scale": "group_std"})
    plan2 = plan_edit(child, spec, back, rendered=True)
    assert plan2.drop == ("std_floor",)
    grand = build_source(child, plan2.edit, plan2.hyperparameters, plan2.drop)
    assert "std_floor" not in grand and "floor of the analytic scale" not in grand
    assert grand.split("def compute_advantages")[0] == root.split("def compute_advantages")[0]


def test_set_defaults_writes_floats_as_written_by_hand():
    out = set_defaults(_root_source(), {"eps": 1e-8, "kl_coef": 0.001})
    assert "eps: float = 1e-8" in out and "kl_coef: float = 0.001" in out
    assert '"""numerical floor added to the group std"""' in out


@pytest.mark.slow
def test_an_edit_already_in_the_archive_is_not_proposed_again(archive, caplog):
    from engine.operators.proposers.offline import OfflineProposer

    cfg = archive.config()
    ctx = build_context(archive, "grpo", cfg, seed=0)
    first = OfflineProposer().propose(archive, "grpo", ctx, cfg, 3, 0)
    assert first
    taken = first[0]
    kept, _ = screen(archive, "grpo", [taken], cfg)
    from engine.operators.implement import build_source

    src = build_source(
        archive.algorithm("grpo"), taken.edit, taken.hyperparameters, taken.drop_hyperparameters
    )
    archive.spawn("grpo", "taken", algorithm=src)
    with caplog.at_level("WARNING"):
        again = OfflineProposer().propose(archive, "grpo", ctx, cfg, 3, 0)
    assert all(
        build_source(archive.algorithm("grpo"), p.edit, p.hyperparameters, p.drop_hyperparameters)
        != src
        for p in again
    )
    assert "already in the archive as 'taken'" in caplog.text
    # screening drops it too, whichever proposer wrote it
    kept, dropped = screen(archive, "grpo", [taken], cfg)
    assert not kept and dropped[0].screening["reason"] == (
        "duplicate: the same code as archived node 'taken'"
    )


def test_clip_mutations_that_cannot_clip_anything_are_skipped(archive):
    from engine.operators.proposers.offline import clip_is_inert, parent_ratios

    old = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0, "kl_coef": 0.0}
    wider = {**old, "clip_ratio_high": 0.28}
    assert "nothing would be clipped" in clip_is_inert(old, wider, (0.93, 1.06))
    assert clip_is_inert(old, {**old, "clip_ratio_low": 0.05}, (0.93, 1.06)) == ""  # it would clip
    assert clip_is_inert(old, wider, (0.7, 1.3)) == ""  # the parent clipped: widening matters
    assert clip_is_inert(old, {**wider, "kl_coef": 0.01}, (0.93, 1.06)) == ""  # KL changes it
    assert clip_is_inert(old, wider, None) == ""  # unknown trajectory: no claim
    assert parent_ratios(archive, "grpo") is None
    traj = {"step": [0, 1], "train/ratio_min": [0.97, 0.95], "train/ratio_max": [1.02, 1.04]}
    record(archive, "grpo", {"metrics": {"overall": 0.5}, "trajectory": traj})
    assert parent_ratios(archive, "grpo") == (0.95, 1.04)
    # every clip range the proposer samples (eps >= 0.1) is inert for this parent: none is offered
    from engine.operators.proposers.offline import OfflineProposer

    cfg = archive.config()
    ctx = build_context(archive, "grpo", cfg, seed=0)
    offered = [
        p
        for seed in range(4)
        for p in OfflineProposer().propose(archive, "grpo", ctx, cfg, 4, seed)
    ]
    assert offered and not [
        p.hyperparameters
        for p in offered
        if not p.edit and set(p.hyperparameters) & {"clip_ratio_low", "clip_ratio_high"}
    ]


def _evidence(name, parent, u, **options):
    from engine.operators.proposers.offline import Evidence

    return Evidence(name, parent, u, normalize(options) if options else None)


def _by_name(*evidence) -> dict:
    """Evidence records keyed by node name, as ``archive_evidence`` returns them."""
    return {e.name: e for e in evidence}


def _kl_moves() -> tuple:
    """The root and two knob-only children that raised the KL anchor and gained."""
    return (
        _evidence("grpo", None, 0.50),
        _evidence("kl-a", "grpo", 0.52, hp={"kl_coef": 0.01}),
        _evidence("kl-b", "grpo", 0.535, hp={"kl_coef": 0.1}),
    )


def test_component_effects_charge_a_collapse_to_its_cause():
    from engine.operators.proposers.offline import component_effects, expected_gain

    ev = _by_name(
        _evidence("grpo", None, 0.50),
        _evidence("bayes", "grpo", 0.25, baseline="valid_bayes"),
        _evidence("adapt", "grpo", 0.52, entropy_control="adaptive"),
        _evidence("adapt-2", "adapt", 0.53, entropy_control="adaptive", invalid="mask"),
        # a crossover that brought the collapsing baseline along with a harmless option
        _evidence(
            "adapt-x-bayes",
            "adapt",
            0.27,
            entropy_control="adaptive",
            baseline="valid_bayes",
            length="negative_scale",
        ),
        _evidence("unevaluated", "grpo", None, scale="none"),
        _evidence("orphan", "gone", 0.9, scale="batch"),
    )
    eff = component_effects(ev)
    assert eff[("baseline", "valid_bayes")] < -0.15  # charged with both collapses
    assert abs(eff[("length", "negative_scale")]) < abs(eff[("baseline", "valid_bayes")]) / 3
    assert eff[("entropy_control", "adaptive")] > 0 and eff[("invalid", "mask")] > 0
    assert ("scale", "none") not in eff and ("scale", "batch") not in eff  # no usable evidence
    base = normalize(None)
    beta = 0.05
    assert expected_gain(normalize({"baseline": "valid_bayes"}), base, eff, beta) < 0.05
    assert expected_gain(normalize({"entropy_control": "adaptive"}), base, eff, beta) > 0.5
    assert expected_gain(normalize({"scale": "none"}), base, eff, beta) == 0.5  # never tried
    assert expected_gain(base, base, eff, beta) == 0.5  # an option the parent has is no change
    assert component_effects({}) == {}


def test_offline_crossover_never_takes_a_collapsed_partner(archive):
    from engine.operators.proposers.offline import OfflineProposer, crossover_partners

    def child(name, overall, **options):
        spec = normalize(options)
        archive.spawn(
            "grpo",
            name,
            algorithm=archive.algorithm("grpo"),
            files={"records/proposal.json": json.dumps({"components": spec})},
        )
        record(archive, name, {"overall": overall})

    record(archive, "grpo", {"overall": 0.50})
    child("collapsed", 0.25, baseline="valid_bayes")
    child("steady", 0.49, entropy_control="adaptive")
    child("better", 0.53, invalid="mask")
    cfg = archive.config()
    ctx = build_context(archive, "grpo", cfg, seed=0)
    refs = {s.name for s in ctx.frontier + ctx.complementary + ctx.exploratory}
    assert "collapsed" in refs  # the context shows it (as evidence), the crossover must not use it
    assert {s.name for s in crossover_partners(ctx, cfg.select.beta)} == {"steady", "better"}
    offered = [
        p
        for seed in range(6)
        for p in OfflineProposer().propose(archive, "grpo", ctx, cfg, 4, seed)
    ]
    crossed = [p for p in offered if p.parents]
    assert crossed and not [p for p in crossed if "collapsed" in p.parents]
    # the archive's evidence, read from the nodes' records, sinks another valid_bayes proposal
    from engine.operators.proposers.offline import (
        archive_evidence,
        component_effects,
        expected_gain,
    )

    eff = component_effects(archive_evidence(archive, cfg))
    assert eff[("baseline", "valid_bayes")] < -0.1 < 0 < eff[("invalid", "mask")]
    bayes = normalize({"baseline": "valid_bayes"})
    assert expected_gain(bayes, normalize(None), eff, cfg.select.beta) < 0.05
    for p in offered:  # every proposal carries the gain its changed options earn
        if p.components and not p.parents:
            want = expected_gain(p.components, normalize(None), eff, cfg.select.beta)
            assert p.expected_gain == want


def test_offline_proposer_never_tries_an_untested_option_twice_at_once(archive):
    """A loop round expands its parents one after another: the first parent's children are still
    under evaluation when the second parent's are proposed. An option no evaluated node has
    introduced, which a pending node already tries, is not proposed again until that node has a
    result; an option with evidence is."""
    from engine.operators.proposers.offline import (
        OfflineProposer,
        archive_evidence,
        component_effects,
        options_in_flight,
    )

    record(archive, "grpo", {"overall": 0.50})
    src = archive.algorithm("grpo")
    spec = normalize({"baseline": "batch"})
    archive.spawn(
        "grpo",
        "trying-batch",
        algorithm=src,
        files={"records/proposal.json": json.dumps({"components": spec})},
        status="verified",
    )
    archive.spawn(
        "grpo",
        "tried-mask",
        algorithm=src,
        files={"records/proposal.json": json.dumps({"components": normalize({"invalid": "mask"})})},
    )
    record(archive, "tried-mask", {"overall": 0.51})
    archive.spawn(
        "tried-mask",
        "also-mask",
        algorithm=src,
        files={
            "records/proposal.json": json.dumps(
                {"components": normalize({"invalid": "mask", "scale": "none"})}
            )
        },
        status="evaluating",
    )
    cfg = archive.config()
    ev = archive_evidence(archive, cfg)
    assert ev["trying-batch"].pending and ev["also-mask"].pending and not ev["tried-mask"].pending
    flight = options_in_flight(ev, component_effects(ev))
    assert flight == {("baseline", "batch"): "trying-batch", ("scale", "none"): "also-mask"}
    ctx = build_context(archive, "grpo", cfg, seed=0)
    offered = [
        p
        for seed in range(8)
        for p in OfflineProposer().propose(archive, "grpo", ctx, cfg, 4, seed)
        if p.components
    ]
    chosen = [(p.components["baseline"], p.components["scale"]) for p in offered]
    assert offered and ("batch", "group_std") not in chosen
    assert not [c for c in chosen if c[1] == "none"]
    assert any(b != "group_mean" for b, _ in chosen)  # the other baselines stay open
    # once the pending node has a result, its option is evidence, not in flight
    archive.set_status("trying-batch", "evaluating")
    record(archive, "trying-batch", {"overall": 0.49})
    ev = archive_evidence(archive, cfg)
    assert ("baseline", "batch") not in options_in_flight(ev, component_effects(ev))


@pytest.mark.slow
def test_screening_ranks_distinct_proposals_by_expected_gain_not_by_distance(archive):
    """Novelty earns its full credit once a proposal is clearly distinct (NOVELTY_FULL); a more radical
    behavioural change earns nothing more, so an untested radical change does not outrank a milder
    one, and evidence of gain decides."""
    from engine.operators.propose import NOVELTY_FULL

    cfg = archive.config()
    cands = [
        prop("radical", render({"baseline": "valid_bayes"}), expected_gain=0.5),
        prop("mild", render({"length": "negative_scale"}), expected_gain=0.5),
        prop("backed", render({"entropy_control": "adaptive"}), expected_gain=0.6),
    ]
    kept, dropped = screen(archive, "grpo", cands, cfg)
    assert not dropped
    by = {p.name: p for p in kept}
    nov = {n: p.screening["novelty"] for n, p in by.items()}
    assert min(nov.values()) >= NOVELTY_FULL and nov["radical"] > 2 * nov["mild"]
    assert by["radical"].score == by["mild"].score == 0.7
    assert kept[0].name == "backed" and by["backed"].score > by["radical"].score


@pytest.mark.slow  # fingerprints two candidates in the sandbox
def test_screening_reads_an_expected_gain_of_nan_as_unknown(archive):
    """An LLM reply's expected_gain may be NaN (Python's JSON reads it, and NaN passes the schema's
    0..1 bounds): it counts as the default 0.5, not as the full gain the clamp would give it."""
    from engine.operators.llm import parse_json_reply, validate_json
    from engine.operators.proposers.llm import proposals_schema

    reply = parse_json_reply(
        '{"proposals": [{"name": "n", "motivation": "", "mechanism": "m", "expected_effect": "",'
        ' "hyperparameters": {}, "code": "", "intents": [], "expected_gain": NaN}]}'
    )
    assert validate_json(reply, proposals_schema()) is None  # the schema lets it through
    cands = [
        prop("unsure", render({"length": "negative_scale"}), expected_gain=float("nan")),
        prop("backed", render({"entropy_control": "adaptive"}), expected_gain=0.6),
    ]
    kept, _ = screen(archive, "grpo", cands, archive.config())
    by = {p.name: p for p in kept}
    assert by["unsure"].score == 0.7 and kept[0].name == "backed"


@pytest.mark.slow
def test_offline_proposer_acts_on_the_parents_diagnosis(archive):
    """A parent whose recorded trajectory shows an entropy collapse (the reflection's finding) gets
    its remedies: about half the mutations apply one (a KL anchor one to two orders of magnitude
    stronger, an entropy controller, a larger entropy bonus, clip-higher), and a proposal that applies
    one is credited the remedy prior in its expected gain. Without the finding nothing is directed."""
    from engine.operators.proposers.offline import (
        REMEDY_PRIOR,
        OfflineProposer,
        parent_findings,
        remedies_applied,
        remedies_for,
    )

    cfg = archive.config()
    base = normalize(None)
    flat = {
        "step": list(range(9)),
        "train/entropy": [0.7, 0.6, 0.6, 0.55, 0.5, 0.5, 0.5, 0.5, 0.45],
    }
    record(archive, "grpo", {"metrics": {"overall": 0.5}, "trajectory": flat})
    assert parent_findings(archive, "grpo", cfg) == []

    def offered():
        ctx = build_context(archive, "grpo", cfg, seed=0)
        return [
            p
            for seed in range(6)
            for p in OfflineProposer().propose(archive, "grpo", ctx, cfg, 4, seed)
        ]

    undirected = offered()
    moves = ("kl", "entropy_control", "entropy", "clip_higher")
    assert not [p for p in undirected if "against" in p.motivation]
    assert all(p.expected_gain == 0.5 for p in undirected if not p.parents)

    collapse = {**flat, "train/entropy": [0.75, 0.44, 0.18, 0.17, 0.21, 0.19, 0.08, 0.15, 0.1]}
    record(archive, "grpo", {"metrics": {"overall": 0.5}, "trajectory": collapse})
    findings = parent_findings(archive, "grpo", cfg)
    assert findings and findings[0].startswith("entropy collapse")
    assert remedies_for(findings, base) == moves
    # an anchor already at the range's top has no room to be strengthened
    assert "kl" not in remedies_for(findings, normalize({"hp": {"kl_coef": 0.1}}))

    directed = offered()
    treated = [p for p in directed if "against its entropy collapse" in p.motivation]
    assert len(treated) >= 0.4 * len(directed) > 0
    for p in treated:
        if not p.parents:
            assert p.expected_gain > 0.5  # the prior, no archive evidence on these options yet
    anchors = [p.hyperparameters["kl_coef"] for p in treated if "kl_coef" in p.hyperparameters]
    assert anchors and all(0.01 <= k <= 0.1 for k in anchors)  # 10x to 100x GRPO's 0.001
    assert REMEDY_PRIOR > 0
    assert remedies_applied(normalize({"hp": {"kl_coef": 0.05}}), base, moves) == ("kl",)
    assert remedies_applied(normalize({"hp": {"kl_coef": 0.0}}), base, moves) == ()
    # a directed proposal ranks above an untried undirected one in screening (two of each: every
    # screened source is fingerprinted in a sandboxed child of its own)
    untreated = [p for p in directed if p not in treated]
    kept, _ = screen(archive, "grpo", treated[:2] + untreated[:2], cfg)
    assert kept and "against its entropy collapse" in kept[0].motivation


def test_a_remedy_whose_children_trained_like_their_parents_is_spent(archive, caplog):
    """Each evaluated child that applied a remedy of its parent's entropy collapse is one trial of
    it, judged on the policy's entropy against its parent's, seed by seed: up, alike, or unclear
    (an interval too wide to tell). A remedy with two trials that kept entropy as their parents did,
    and none that raised it, is spent: the diagnosis stops directing mutations to it, while the
    remedies that acted, or have too few trials, are still directed to. ``remedy_trials = 0`` spends
    nothing."""
    import logging

    from engine.archive.results import configured_protocol
    from engine.operators.proposers.offline import archive_evidence
    from engine.operators.proposers.remedies import remedy_trials, spent_remedies

    collapsing_root(archive)
    remedied_child(archive, "bonus-a", 1.01, entropy_coef=0.004)
    remedied_child(archive, "bonus-b", 0.99, entropy_coef=0.008)
    remedied_child(archive, "anchor-a", 1.5, kl_coef=0.05)
    remedied_child(archive, "anchor-b", 1.0, kl_coef=0.02)
    remedied_child(archive, "clip-a", [0.6, 1.5, 0.7, 1.4, 0.8, 1.3], clip_ratio_high=0.3)
    remedied_child(archive, "clip-b", 1.0, clip_ratio_high=0.28)

    cfg = archive.config()
    assert cfg.propose.remedy_trials == 2
    nodes = archive.nodes(configured_protocol(cfg))
    specs = {n: ev.spec() for n, ev in archive_evidence(archive, cfg, nodes).items()}
    trials = {t.node: (t.moves, t.verdict) for t in remedy_trials(nodes, specs)}
    assert trials == {
        "bonus-a": (("entropy",), "alike"),
        "bonus-b": (("entropy",), "alike"),
        "anchor-a": (("kl",), "up"),
        "anchor-b": (("kl",), "alike"),
        "clip-a": (("clip_higher",), "unclear"),
        "clip-b": (("clip_higher",), "alike"),
    }
    spent = spent_remedies(remedy_trials(nodes, specs), ("entropy collapse",), 2)
    assert set(spent) == {"entropy"}
    assert "2 children" in spent["entropy"] and "bonus-a, bonus-b" in spent["entropy"]
    assert spent_remedies(remedy_trials(nodes, specs), ("entropy collapse",), 0) == {}
    assert set(spent_remedies(remedy_trials(nodes, specs), ("entropy collapse",), 1)) == {
        "entropy",
        "clip_higher",
    }

    with caplog.at_level(logging.INFO, logger="engine.operators.proposers.offline"):
        directed = [p for p in _offered_from_root(archive, directed=1.0) if not p.parents]
    assert "grpo is no longer directed to entropy: 2 children" in caplog.text
    applied = {
        m for p in directed for m in re.findall(r"entropy collapse: ([a-z_, ]+)\)", p.motivation)
    }
    assert directed and {"kl", "entropy_control", "clip_higher"} == applied
    every = [p for p in _offered_from_root(archive, directed=1.0, remedy_trials=0) if not p.parents]
    assert any("entropy collapse: entropy)" in p.motivation for p in every)


def _offered_from_root(archive, **propose) -> list:
    """The offline proposer's proposals for the root, over three seeds, with ``[propose]`` set to
    ``propose``."""
    import dataclasses

    from engine.operators.proposers.offline import OfflineProposer

    cfg = archive.config()
    c = dataclasses.replace(cfg, propose=dataclasses.replace(cfg.propose, **propose))
    ctx = build_context(archive, "grpo", c, seed=0)
    return [
        p for seed in range(3) for p in OfflineProposer().propose(archive, "grpo", ctx, c, 4, seed)
    ]


@pytest.mark.slow
def test_propose_config_chooses_the_remedies_and_their_share(archive):
    """``[propose].remedies`` limits the remedies a diagnosis directs to, ``directed = 0`` turns the
    direction (and its prior) off, and a setting out of range or an unknown remedy is refused."""

    from engine.config import REMEDY_MOVES, parse_config
    from engine.errors import ConfigError
    from engine.operators.proposers.offline import REMEDIES

    # every remedy a finding names is one the setting can name
    assert {m for moves in REMEDIES.values() for m in moves} <= set(REMEDY_MOVES)

    collapse = {
        "step": list(range(9)),
        "train/entropy": [0.75, 0.44, 0.18, 0.17, 0.21, 0.19, 0.08, 0.15, 0.1],
    }
    record(archive, "grpo", {"metrics": {"overall": 0.5}, "trajectory": collapse})

    only = [
        p
        for p in _offered_from_root(archive, remedies=("entropy_control",))
        if "against" in p.motivation
    ]
    assert len(only) >= 4
    assert all("(against its entropy collapse: entropy_control)" in p.motivation for p in only)
    assert not [p for p in _offered_from_root(archive, directed=0.0) if "against" in p.motivation]
    every = [p for p in _offered_from_root(archive, directed=1.0) if not p.parents]
    assert every and all("against its entropy collapse" in p.motivation for p in every)

    assert parse_config("[propose]\ndirected = 0.25\nremedies = ['kl']\n").propose.remedies == (
        "kl",
    )
    assert parse_config("[propose]\nremedy_trials = 3\n").propose.remedy_trials == 3
    with pytest.raises(ConfigError, match=r"remedy_trials must be a whole number >= 0, got -1"):
        parse_config("[propose]\nremedy_trials = -1\n")
    with pytest.raises(ConfigError, match=r"\[propose\]\.directed must lie in \[0, 1\]"):
        parse_config("[propose]\ndirected = 1.5\n")
    with pytest.raises(ConfigError, match="unknown remedy 'anchor'.*known: kl, entropy_control"):
        parse_config("[propose]\nremedies = ['kl', 'anchor']\n")


@pytest.mark.slow  # four interpreter starts
def test_offline_crossover_is_the_same_in_every_process():
    """Two processes with the same seed cross the same specs alike: the crossover draws per
    hyperparameter in a fixed order, not in a set's, which varies with the process's hash seed."""
    import os
    import sys

    code = (
        "import random, json\n"
        "from engine.operators.proposers.codegen import normalize\n"
        "from engine.operators.proposers.offline import OfflineProposer\n"
        "a = normalize({'entropy_control': 'adaptive', 'hp': {'kl_coef': 0.05, 'clip_ratio_high': 0.3}})\n"
        "b = normalize({'scale': 'analytic', 'hp': {'entropy_coef': 0.004, 'clip_ratio_low': 0.15}})\n"
        "out = [OfflineProposer._cross(a, b, random.Random(s)) for s in range(20)]\n"
        "print(json.dumps(out, sort_keys=True))\n"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": str(h)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for h in (0, 1, 2, 3)
    ]
    assert runs[0] and all(r == runs[0] for r in runs)


def test_learned_moves_follow_the_archive_evidence():
    """The move fit reads knob moves (in decades for a coefficient) as well as option switches and
    weights each observation by its paired seeds' spread; the learned direction makes a move only
    where its posterior probability of a gain is high, never a move the archive has not observed,
    and leaves a knob whose effect is near zero where it is: nothing names a remedy."""
    import random

    from engine.operators.proposers.moves import (
        CONFIDENCE,
        EFFECT_SD,
        apply_move,
        candidate_moves,
        features,
        fit_moves,
        learned_move,
        move_features,
        observation_sd,
        prior_gain,
    )
    from engine.operators.proposers.offline import expected_gain

    base = normalize(None)  # kl_coef 0.001
    assert features(normalize({"hp": {"kl_coef": 0.1}}), base) == {("knob", "kl_coef"): 2.0}
    assert features(normalize({"scale": "none", "hp": {"clip_ratio_high": 0.3}}), base) == {
        ("scale", "none"): 1.0,
        ("knob", "clip_ratio_high"): 1.0,
    }
    # the measurement noise: a tight paired difference is a precise observation, a spread one is not
    par = {s: 0.5 + 0.03 * (s % 3) for s in range(6)}
    tight = observation_sd({s: v + 0.02 for s, v in par.items()}, par)
    loose = observation_sd({s: v + (0.1 if s % 2 else -0.06) for s, v in par.items()}, par)
    assert tight < observation_sd({0: 0.52}, {0: 0.5}) and tight < loose

    ev = _by_name(
        *_kl_moves(),
        _evidence("kl-a-2", "kl-a", 0.53, hp={"kl_coef": 0.05}),
        _evidence("annealed", "grpo", 0.49, entropy_control="annealed"),
        _evidence("scale", "grpo", 0.495, scale="none"),
        _evidence("ent-up", "grpo", 0.502, hp={"entropy_coef": 0.01}),
        _evidence("ent-down", "ent-up", 0.499, hp={"entropy_coef": 0.0001}),
        _evidence("pending", "grpo", None, baseline="loo"),
    )
    fit = fit_moves(ev)
    means = dict(zip(fit.names, fit.mean))
    assert means[("knob", "kl_coef")] > 0.005 > 0 > means[("entropy_control", "annealed")]
    assert fit.seen[("knob", "kl_coef")] == 3 and ("baseline", "loo") not in means
    # a collapsed child charges its cause and leaves every other effect's uncertainty as it was
    collapsed = fit_moves({**ev, "bayes": _evidence("bayes", "grpo", 0.25, baseline="valid_bayes")})
    k, c = fit.names.index(("knob", "kl_coef")), collapsed.names.index(("knob", "kl_coef"))
    assert collapsed.cov[c][c] == pytest.approx(fit.cov[k][k])
    assert dict(zip(collapsed.names, collapsed.mean))[("baseline", "valid_bayes")] < -0.01
    up, down = (move_features(("kl_coef", m), base) for m in ("up", "down"))
    assert fit.probability(up) > CONFIDENCE > 1 - CONFIDENCE > fit.probability(down)
    ent = normalize({"hp": {"entropy_coef": 0.001}})
    assert 1 - CONFIDENCE < fit.probability(move_features(("entropy_coef", "up"), ent)) < CONFIDENCE
    rng = random.Random(0)
    drawn = [learned_move(fit, base, rng) for _ in range(60)]
    assert all(d is not None and d.probability >= CONFIDENCE and d.gain > 0 for d in drawn)
    assert not any(d.explored for d in drawn)
    moves = [d.move for d in drawn]
    assert moves.count(("kl_coef", "up")) > len(drawn) / 2
    assert not {m for m in moves if m[0] == "entropy_coef"}  # near zero: left where it is
    observed = {("kl_coef", "up"), ("entropy_control", "annealed"), ("scale", "none")}
    assert set(moves) <= observed  # never an unobserved option
    # an archive with only a near-zero knob offers no confident move: the mutation is the usual one
    flat = {k: ev[k] for k in ("grpo", "ent-up", "ent-down")}
    assert all(learned_move(fit_moves(flat), ent, rng) is None for _ in range(20))
    # ... unless it explores: then it tries what nobody tried, the widest prior spread first (a
    # coefficient pushed 1.5 decades before an option switch), never the observed entropy knob
    tried = [learned_move(fit_moves(flat), ent, rng, explore=True) for _ in range(40)]
    assert all(d.explored and d.gain == 0.0 and d.probability == 0.5 for d in tried)
    assert {d.move for d in tried} == {("kl_coef", "up")}
    assert tried[0].spread == pytest.approx(1.5 * EFFECT_SD)
    first = {learned_move(None, base, rng, explore=True).move for _ in range(60)}
    assert first == {("kl_coef", "up"), ("entropy_coef", "up")}  # nothing observed: both tie
    # an untried move with an observed part: that part's posterior, the rest at the prior
    mixed = {("knob", "kl_coef"): 1.0, ("baseline", "loo"): 1.0}
    m, sd = prior_gain(fit, mixed)
    k_mean, k_sd = fit.gain({("knob", "kl_coef"): 1.0})
    assert m == pytest.approx(k_mean) and sd == pytest.approx((k_sd**2 + EFFECT_SD**2) ** 0.5)
    # confident moves come first; exploring changes nothing where one exists
    assert not any(learned_move(fit, base, rng, explore=True).explored for _ in range(20))
    assert ("baseline", "loo") in candidate_moves(base)
    assert fit_moves({"grpo": ev["grpo"]}) is None
    # its posterior mean ranks a proposal: a kl move above an annealed controller
    up = normalize({"hp": {"kl_coef": 0.02}})
    annealed = normalize({"entropy_control": "annealed"})
    assert (
        expected_gain(up, base, {}, 0.05, fit=fit)
        > 0.5
        > expected_gain(annealed, base, {}, 0.05, fit=fit)
    )
    assert move_features(("kl_coef", "up"), base) == {("knob", "kl_coef"): 1.5}
    # the moves themselves, inside their ranges
    sample = lambda name: 0.123  # noqa: E731
    for seed in range(20):
        r = random.Random(seed)
        assert 0.01 <= apply_move(base, ("kl_coef", "up"), r, sample)["hp"]["kl_coef"] <= 0.1
        down = apply_move(base, ("kl_coef", "down"), r, sample)["hp"]["kl_coef"]
        assert down == 0.0  # 0.001 / 10..100 is below the range: the anchor is dropped
        hi = apply_move(base, ("clip_ratio_high", "up"), r, sample)["hp"]["clip_ratio_high"]
        assert 0.21 <= hi <= 0.4
        lo = apply_move(base, ("clip_ratio_low", "down"), r, sample)["hp"]["clip_ratio_low"]
        assert 0.1 <= lo <= 0.19
    ctl = apply_move(base, ("entropy_control", "adaptive"), random.Random(0), sample)
    assert ctl["entropy_control"] == "adaptive" and ctl["hp"]["entropy_target"] == 0.123
    agg = apply_move(base, ("loss_agg_mode", "seq-mean-token-mean"), random.Random(0), sample)
    assert agg["hp"]["loss_agg_mode"] == "seq-mean-token-mean"


def test_learned_move_needs_a_minimum_gain_and_does_not_explore_what_is_in_flight():
    """``min_gain`` leaves a confident move whose expected gain is too small to be worth a candidate
    to ``explore`` (or the usual mutation); a move a pending node is already trying, or this propose
    call already explored, is not explored again before its result is in."""
    import random

    from engine.operators.proposers.moves import (
        EFFECT_SD,
        features_in_flight,
        fit_moves,
        learned_move,
    )

    base = normalize(None)
    ev = _by_name(*_kl_moves())
    fit = fit_moves(ev)
    rng = random.Random(0)
    gains = [learned_move(fit, base, rng) for _ in range(20)]
    assert all(g is not None and not g.explored and g.move == ("kl_coef", "up") for g in gains)
    smallest = min(g.gain for g in gains)
    kept = [learned_move(fit, base, rng, min_gain=smallest * 0.99) for _ in range(20)]
    assert all(k is not None and k.move == ("kl_coef", "up") for k in kept)
    # above the favoured move's expected gain: nothing is favoured, and exploring tries the untried
    assert all(learned_move(fit, base, rng, min_gain=smallest * 1.01) is None for _ in range(20))
    instead = [learned_move(fit, base, rng, True, smallest * 1.01) for _ in range(40)]
    assert all(d.explored for d in instead)
    assert {d.move for d in instead} == {("entropy_coef", "up")}  # kl_coef was observed
    # a pending node already tries the entropy bonus: the next widest untried moves instead
    pending = dataclasses.replace(
        _evidence("ent", "grpo", None, hp={"entropy_coef": 0.01}), pending=True
    )
    trying = features_in_flight({**ev, "ent": pending})
    assert trying == {("knob", "entropy_coef")}
    assert features_in_flight(ev) == set()  # nothing pending
    later = [learned_move(fit, base, rng, True, smallest * 1.01, trying) for _ in range(60)]
    assert all(d.explored and d.spread == pytest.approx(EFFECT_SD) for d in later)
    assert not {d.move for d in later} & {("entropy_coef", "up"), ("kl_coef", "up")}
    assert len({d.move for d in later}) > 3  # ties drawn at random


def test_propose_explores_an_untried_move_once_per_call(archive):
    """Within one propose call, an explored move counts as tried: the call's proposals explore
    different moves, not the widest one over and over before its first result is in."""
    from engine.operators.proposers.offline import OfflineProposer

    record(archive, "grpo", {"metrics": {"overall": 0.5}, "seeds": [0]})
    cfg = archive.config()
    c = dataclasses.replace(
        cfg, propose=dataclasses.replace(cfg.propose, directed=0.0, learned=1.0, explore=True)
    )
    ctx = build_context(archive, "grpo", c, seed=0)
    for seed in range(3):
        moves = [
            p.motivation.split("judge yet: ")[1].split(",")[0]
            for p in OfflineProposer().propose(archive, "grpo", ctx, c, 4, seed)
            if "untried move" in p.motivation
        ]
        assert len(moves) >= 3 and len(set(moves)) == len(moves), moves
        # the two widest first (kl_coef and entropy_coef up, at 1.5 decades), then the rest
        assert set(moves[:2]) == {"kl_coef up", "entropy_coef up"}


@pytest.mark.slow
def test_propose_learned_share_makes_the_favoured_move(archive):
    """With ``[propose].learned`` the proposer makes the move the archive's evidence favours (and
    says so), with the diagnosis off; with ``explore`` and nothing favoured it makes an untried move
    (and says so); ``learned = 0`` makes none; a share out of range is refused."""

    from engine.config import parse_config
    from engine.errors import ConfigError
    from engine.operators.proposers.moves import fit_moves
    from engine.operators.proposers.offline import archive_evidence

    def per_seed(means):
        rows = [{"seed": s, "metrics": {"overall": m}} for s, m in enumerate(means)]
        return {"metrics": {"overall": sum(means) / 3}, "seeds": [0, 1, 2], "per_seed": rows}

    src = archive.algorithm("grpo")
    record(archive, "grpo", per_seed([0.49, 0.50, 0.51]))
    # nothing observed yet: no move is favoured; exploring, it tries the widest untried moves
    assert not [
        p
        for p in _offered_from_root(archive, directed=0.0, learned=1.0)
        if "favours" in p.motivation or "untried" in p.motivation
    ]
    explored = [
        p
        for p in _offered_from_root(archive, directed=0.0, learned=1.0, explore=True)
        if "untried move" in p.motivation
    ]
    assert len(explored) >= 4
    moves = {p.motivation.split("judge yet: ")[1].split(",")[0]: p for p in explored}
    assert {"kl_coef up", "entropy_coef up"} <= set(moves)  # the widest first, then the rest
    assert all(
        "+- 0.0150 under the prior" in moves[m].motivation
        for m in ("kl_coef up", "entropy_coef up")
    )
    # kl-b is a knob-only mutation of the root: it records no components, only its code says what
    # it moved
    for name, gains, kl, comps in (
        ("kl-a", (0.03, 0.028, 0.032), 0.02, normalize({"hp": {"kl_coef": 0.02}})),
        ("kl-b", (0.02, 0.018, 0.022), 0.01, None),
    ):
        code = src.replace("kl_coef: float = 0.001", f"kl_coef: float = {kl}")
        assert code != src
        archive.spawn(
            "grpo",
            name,
            algorithm=code,
            files={"records/proposal.json": json.dumps({"components": comps})},
        )
        record(archive, name, per_seed([u + g for u, g in zip((0.49, 0.50, 0.51), gains)]))
    ev = archive_evidence(archive, archive.config())
    assert ev["grpo"].seeds == {0: 0.49, 1: 0.50, 2: 0.51}  # the fit's measurement noise
    assert ev["kl-a"].seeds == pytest.approx({0: 0.52, 1: 0.528, 2: 0.542})
    assert ev["kl-b"].hp["kl_coef"] == 0.01  # the remedies' record reads it (directed is on)
    off = dataclasses.replace(
        archive.config(),
        propose=dataclasses.replace(archive.config().propose, directed=0.0),
    )
    # the code is read only with the learned direction or the remedies' record on
    assert archive_evidence(archive, off)["kl-b"].hp is None
    on = dataclasses.replace(
        archive.config(),
        propose=dataclasses.replace(archive.config().propose, learned=0.5),
    )
    ev = archive_evidence(archive, on)
    assert ev["kl-b"].components is None and ev["kl-b"].hp["kl_coef"] == 0.01
    assert fit_moves(ev).seen[("knob", "kl_coef")] == 2  # both observed, kl-b through its code

    favoured = [
        p
        for p in _offered_from_root(archive, directed=0.0, learned=1.0)
        if "favours" in p.motivation
    ]
    assert len(favoured) >= 4
    assert all("favours: kl_coef" in p.motivation for p in favoured)
    ups = [p for p in favoured if "kl_coef up" in p.motivation]
    assert ups and all(p.hyperparameters["kl_coef"] > 0.001 for p in ups)
    assert not [p for p in _offered_from_root(archive, directed=0.0) if "favours" in p.motivation]
    assert parse_config("[propose]\nlearned = 0.5\n").propose.learned == 0.5
    with pytest.raises(ConfigError, match=r"\[propose\]\.learned must lie in \[0, 1\]"):
        parse_config("[propose]\nlearned = -0.1\n")
    assert parse_config("[propose]\nmin_gain = 0.005\n").propose.min_gain == 0.005
    with pytest.raises(ConfigError, match=r"\[propose\]\.min_gain must lie in \[0, 1\)"):
        parse_config("[propose]\nmin_gain = -0.01\n")


def test_offline_proposer_reads_a_parent_trajectory_edited_into_no_series(tmp_path):
    """A parent whose results file was edited by hand to hold numbers where series belong: the
    offline proposer reads those series as not recorded instead of stopping with a TypeError."""
    from engine.operators.proposers.offline import parent_findings, parent_ratios

    arch = Archive.init(tmp_path / "exp")
    traj = {"step": 3, "train/clipfrac": 0.5, "train/entropy": [1.0, 0.5, 0.1, 0.05]}
    record(arch, "grpo", {"metrics": {"overall": 0.5}, "trajectory": traj})
    assert parent_ratios(arch, "grpo") is None
    assert parent_findings(arch, "grpo")[0].startswith("entropy collapse")
