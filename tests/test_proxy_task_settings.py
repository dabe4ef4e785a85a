"""The proxy's task settings (``ProxyProtocol.task``): the default keeps every recorded protocol
identity, a variant changes it, and the RL prompts, the held-out prompts and the response cap follow
the settings in training and in scoring."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer_template import ALGORITHM_FILE
from trainer_template.loader import load_algorithm, make_config
from trainer_template.proxy import evalset, rl, task
from trainer_template.proxy.model import TinyGPT
from trainer_template.proxy.protocol import PRESETS, Eval, Task, get_protocol

ROOT = Path(__file__).resolve().parents[1]


def test_the_default_task_is_the_task_module_and_keeps_the_recorded_protocol_hash():
    default = get_protocol("default")
    assert {s: default.task.mul_rate(s) for s in task.SPLITS} == task.MUL_RATE
    assert default.task.max_response == task.MAX_RESPONSE
    recorded = json.loads((ROOT / "benchmarks/results/calibration.json").read_text())
    assert default.hash() == recorded["protocol_hash"]  # measured before the task could vary
    assert "task" not in default.to_dict()
    harder = dataclasses.replace(default, task=Task(mul_rate_hard=0.5))
    assert harder.to_dict()["task"]["mul_rate_hard"] == 0.5
    assert harder.hash() != default.hash()
    assert harder.warmstart_hash() == default.warmstart_hash()  # the same starting policy
    assert len({p.hash() for p in PRESETS.values()}) == len(PRESETS)


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"mul_rate_hard": 1.5}, "mul_rate_hard must be in"),
        ({"mul_rate_medium": -0.1}, "mul_rate_medium must be in"),
        ({"max_response": 40}, "max_response must be in"),
        ({"max_response": 4}, "max_response must be in"),
    ],
)
def test_task_settings_out_of_range_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        Task(**kw)


def _ops(problems):
    return [s for p in problems for s, _ in p.ops]


def test_held_out_prompts_follow_the_task():
    ev = Eval(prompts_per_split=24)
    base = evalset.heldout(ev)
    assert evalset.heldout(ev, Task()) == base  # the explicit default draws the same prompts
    assert task.MUL in _ops(base["hard"]) and task.MUL not in _ops(base["medium"])
    allmul = evalset.heldout(ev, Task(mul_rate_medium=1.0, mul_rate_hard=1.0))
    assert set(_ops(allmul["hard"])) == {task.MUL} and set(_ops(allmul["medium"])) == {task.MUL}
    assert task.MUL not in _ops(allmul["easy"])  # easy prompts never multiply
    assert [p.k for p in allmul["hard"]] == [p.k for p in base["hard"]]


def _grpo():
    module = load_algorithm(ALGORITHM_FILE.read_text(), "grpo")
    return module, make_config(module)


def test_training_and_scoring_respect_the_tasks_response_cap():
    torch.manual_seed(0)
    model = TinyGPT(task.VOCAB_SIZE, 16, 2, 1, max_len=task.PROMPT_LEN + task.MAX_RESPONSE)
    module, cfg = _grpo()
    steps = get_protocol("tiny").rl
    capped = Task(max_response=7)
    traj: dict[str, list] = {}
    rl.train(model, module, cfg, steps, seed=0, trajectory=traj, task_settings=capped)
    assert max(traj["train/response_length"]) <= 7  # an untrained model rarely stops by itself
    ev = Eval(prompts_per_split=4, samples=8)
    short = evalset.evaluate(model, ev, 0, capped)
    full = evalset.evaluate(model, ev, 0)
    assert short["mean_length"] <= 7 < full["mean_length"]


def test_the_sweep_varies_task_settings_and_refuses_bad_ones(sweep):
    base = get_protocol("default")
    name, changes = sweep.parse_variant("harder:task.mul_rate_hard=0.5,steps=200", base)
    assert name == "harder"
    assert changes == {"rl": {"steps": 200}, "eval": {}, "task": {"mul_rate_hard": 0.5}}
    proto = sweep.variant_protocol(base, changes)
    assert proto.task == Task(mul_rate_hard=0.5) and proto.rl.steps == 200
    assert proto.eval == base.eval and proto.hash() != base.hash()
    _, plain = sweep.parse_variant("long:steps=200", base)
    assert "task" not in plain and sweep.variant_protocol(base, plain).task == base.task
    with pytest.raises(ValueError, match="unknown task setting 'mul_rate'"):
        sweep.parse_variant("x:task.mul_rate=0.5", base)
    with pytest.raises(ValueError, match="max_response must be in"):
        sweep.variant_protocol(base, sweep.parse_variant("x:task.max_response=99", base)[1])


def test_the_sweep_builds_a_variants_own_warm_start_and_pins_it(sweep, monkeypatch, tmp_path):
    monkeypatch.setenv("POISE_CACHE_DIR", str(tmp_path))
    base = get_protocol("tiny")
    spec = "small:warmstart.d_model=16,warmstart.heads=2,warmstart.layers=1,"
    spec += "warmstart.skill_steps=4,warmstart.habit_steps=2,warmstart.batch=8"
    _, changes = sweep.parse_variant(spec, base)
    assert changes["warmstart"]["d_model"] == 16 and "task" not in changes
    proto = sweep.variant_protocol(base, changes)
    assert proto.warmstart_sha256 is None and proto.warmstart_hash() != base.warmstart_hash()
    assert sweep.pin_warmstart(proto, build=False) == proto  # nothing cached: left unpinned
    pinned = sweep.pin_warmstart(proto, build=True)  # built in the cache, then pinned
    assert pinned.warmstart_sha256.startswith("sha256:") and pinned.hash() != base.hash()
    assert (tmp_path / f"warmstart-{proto.warmstart_hash()}.pt").is_file()
    assert sweep.pin_warmstart(proto, build=False) == pinned  # read back from the cache
    assert sweep.pin_warmstart(base, build=True) == base  # a pinned warm start stays as it is


def test_the_sweep_takes_a_style_mix_as_a_tuple_and_refuses_a_bad_one(sweep):
    base = get_protocol("default")
    assert sweep.split_items("a=(1,2),b=3, ,c=[4,5]") == ["a=(1,2)", "b=3", "c=[4,5]"]
    spec = "r:warmstart.habit_hard=(0.5,0.15,0.35,0.0),warmstart.filler_max=20,steps=40"
    _, changes = sweep.parse_variant(spec, base)
    assert changes["warmstart"] == {"habit_hard": (0.5, 0.15, 0.35, 0.0), "filler_max": 20}
    assert changes["rl"] == {"steps": 40}
    proto = sweep.variant_protocol(base, changes)
    assert proto.warmstart.habit_hard == (0.5, 0.15, 0.35, 0.0)
    assert proto.warmstart.habit_medium == base.warmstart.habit_medium
    assert proto.warmstart_hash() != base.warmstart_hash()
    # a list is kept as the tuple the frozen protocol hashes
    _, listed = sweep.parse_variant("r:warmstart.habit_hard=[0.5,0.15,0.35,0.0]", base)
    assert listed["warmstart"]["habit_hard"] == (0.5, 0.15, 0.35, 0.0)
    for bad, why in (
        ("r:warmstart.habit_hard=(0.5,0.5)", "takes 4 non-negative numbers"),
        ("r:warmstart.habit_hard=(1,0,0,-1)", "takes 4 non-negative numbers"),
        ("r:warmstart.habit_hard=(0,0,0,0)", "takes 4 non-negative numbers"),
        ("r:warmstart.habit_hard=0.5", "takes 4 non-negative numbers"),
        ("r:lr=(1e-4,2e-4)", "lr takes one value"),
    ):
        with pytest.raises(ValueError, match=why):
            sweep.parse_variant(bad, base)


def test_the_sweep_never_summarizes_rows_of_different_protocols_together(sweep):
    large, default = get_protocol("large"), get_protocol("default")
    gpu, cpu = large.hash("cuda"), large.hash("cpu")
    here = large.hash()
    rows = [{"mechanism": "grpo", "seed": s, "protocol_hash": gpu} for s in (0, 1)]
    # a GPU preset's rows summarized elsewhere keep the hash of the device that trained them
    assert sweep.measured_hash("L", rows, large, here=False) == gpu
    if here != gpu:  # training here into rows measured on a GPU is refused
        with pytest.raises(ValueError, match="measured under protocol sha256:"):
            sweep.measured_hash("L", rows, large, here=True)
    mixed = [*rows, {"mechanism": "grpo", "seed": 2, "protocol_hash": cpu}]
    with pytest.raises(ValueError, match="different protocols .*2 under .*1 under"):
        sweep.measured_hash("L", mixed, large, here=False)
    with pytest.raises(ValueError, match="record no protocol hash"):
        sweep.measured_hash("L", [{"mechanism": "grpo", "seed": 0}], large, here=False)
    # rows from before rows recorded a hash: a CPU protocol's hash is every machine's
    assert sweep.measured_hash("d", [{"mechanism": "grpo", "seed": 0}], default, True) == (
        default.hash()
    )
    assert sweep.measured_hash("d", [], large, here=True) == here


def test_the_sweep_reads_rows_by_the_papers_weighting_when_asked(sweep):
    assert sum(sweep.PAPER32_WEIGHTS.values()) == pytest.approx(1.0)
    metrics = {
        "hard/pass@32": 0.5,
        "medium/pass@32": 1.0,
        "easy/acc@1": 1.0,
        "medium/acc@1": 0.8,
        "hard/acc@1": 0.1,
    }
    row = {"variant": "p", "mechanism": "grpo", "seed": 0, "overall": 0.3, "metrics": metrics}
    assert sweep.rescore([row], "overall") == [row]  # the protocol's Overall, as recorded
    (got,) = sweep.rescore([row], "paper32")
    assert got["overall"] == pytest.approx(0.4 * 0.5 + 0.15 * 1.0 + 0.15 * (1.0 + 0.8 + 0.1))
    assert row["overall"] == 0.3  # the row read is not changed
    narrow = {**row, "metrics": {k: v for k, v in metrics.items() if "pass@32" not in k}}
    with pytest.raises(ValueError, match="no hard/pass@32 .*eval.samples=64"):
        sweep.rescore([narrow], "paper32")
    with pytest.raises(ValueError, match="unknown score 'best'"):
        sweep.rescore([row], "best")
    # a sweep that could not be read by paper32 is refused before it trains
    base = get_protocol("default")
    wide = sweep.variant_protocol(base, sweep.parse_variant("w:eval.samples=64", base)[1])
    sweep.check_score("paper32", {"w": wide})
    sweep.check_score("overall", {"d": base})
    with pytest.raises(ValueError, match="variant\\(s\\) d .*eval.samples=64"):
        sweep.check_score("paper32", {"w": wide, "d": base})


class _Oracle(torch.nn.Module):
    """Knows every chain: reads the problem off the prompt and puts its logit mass on the next token
    of the written chain (``sure``), or on nothing in particular (uniform logits)."""

    def __init__(self, sure: bool):
        super().__init__()
        self.sure = sure

    def forward(self, x):
        logits = torch.zeros(*x.shape, task.VOCAB_SIZE)
        if not self.sure:
            return logits
        for b, row in enumerate(x.tolist()):
            start = 10 * (row[1] - task.DIGIT0) + row[2] - task.DIGIT0
            ops = []
            for op, d in zip(row[3 : 3 + 2 * task.MAX_K : 2], row[4 : 4 + 2 * task.MAX_K : 2]):
                if op == task.NOOP:
                    break
                sign = task.MUL if op == task.TIMES else 1 if op == task.PLUS else -1
                ops.append((sign, d - task.DIGIT0))
            p = task.Problem(start, tuple(ops))
            seq = task.encode_prompt(p) + task.encode_response(p)
            for t in range(min(len(row), len(seq) - 1)):
                logits[b, t, seq[t + 1]] = 50.0
        return logits


def test_the_sweep_table_says_how_many_seeds_would_resolve_each_difference(sweep):
    from engine.stats import seeds_to_resolve

    assert sweep.resolve_text({"mechanism": "grpo", "overall": 0.5}) == "-"
    row = {"mechanism": "msa_grpo", "diff": 0.005, "diff_sd": 0.023}
    assert sweep.resolve_text(row) == str(seeds_to_resolve(0.005, 0.023))
    assert int(sweep.resolve_text(row)) > int(sweep.resolve_text({**row, "diff": -0.01}))
    assert sweep.resolve_text({**row, "diff": 1e-7}) == ">10000"


def test_step_confidence_reads_the_gold_digit_of_every_step(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_step_confidence as bench

    sure = bench.step_confidence(_Oracle(sure=True), chains=3)
    assert set(sure) == {"easy/+-", "medium/+-", "hard/+-", "hard/*"}
    # every digit of every step but the first (which also picks the style): 2k - 1 per chain
    assert sum(c["n"] for c in sure.values()) == 3 * sum(2 * k - 1 for k in range(1, 9))
    assert all(c["mean_p"] == pytest.approx(1.0) and c["mean_miss"] < 1e-9 for c in sure.values())
    blind = bench.step_confidence(_Oracle(sure=False), chains=3)
    assert all(c["mean_p"] == pytest.approx(1 / task.VOCAB_SIZE) for c in blind.values())
    assert all(c["below_0_9"] == 1.0 for c in blind.values())
    hard = blind["hard/+-"]["n"], blind["hard/*"]["n"]
    assert bench.push_share(blind) == pytest.approx(hard[0] / sum(hard))
    assert bench.push_share({"hard/+-": blind["hard/+-"]}) is None


def test_rank_stability_reports_spearman_on_halves_and_a_seed_bootstrap(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import rank_stability as rs
    from proxy_runs import PAPER_OVERALL

    def rows(sign: float, seeds=range(6), noise=0.0):
        return [
            {"variant": "v", "mechanism": m, "seed": s, "overall": sign * p / 100 + noise * (s % 2)}
            for s in seeds
            for m, p in PAPER_OVERALL.items()
        ]

    agree = rs.rank_stability(rows(1.0), list(range(6)), resamples=200)
    assert agree["spearman"] == pytest.approx(1.0)
    assert agree["first_half"] == {"seeds": [0, 1, 2], "spearman": pytest.approx(1.0)}
    assert agree["bootstrap_interval"] == [pytest.approx(1.0)] * 2
    assert agree["share_at_least_0_6"] == 1.0
    against = rs.rank_stability(rows(-1.0), list(range(6)), resamples=200)
    assert against["spearman"] == pytest.approx(-1.0) and against["share_at_least_0_6"] == 0.0
    # a seed without a run of every mechanism is left out; so is one at or above the limit
    partial = rows(1.0, seeds=range(8))
    partial = [r for r in partial if not (r["seed"] == 2 and r["mechanism"] == "sa_grpo")]
    assert rs.complete_seeds(partial, list(PAPER_OVERALL), below=7) == [0, 1, 3, 4, 5, 6]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in partial))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "rank_stability.py"), str(path)]
    ok = subprocess.run([*cmd, "--variant", "v", "--seeds", "8"], capture_output=True, text=True)
    assert ok.returncode == 0 and "+1.000 over 7 seeds" in ok.stdout, ok.stderr
    few = subprocess.run([*cmd, "--variant", "v", "--seeds", "3"], capture_output=True, text=True)
    assert few.returncode != 0 and "at least 4 are needed" in few.stderr


def test_a_decomposed_multiplication_step_writes_its_partial_products_and_still_scores():
    # 47 * 6 = 282 -> 82; + 3 -> 85; 85 * 9 = 765 -> 65
    p = task.Problem(47, ((task.MUL, 6), (1, 3), (task.MUL, 9)))
    plain = task.encode_response(p)
    dec = task.encode_response(p, decompose=[True, True, True])
    # units 7 * 6 = 42, tens 4 * 6 = 24 -> 4: 40 + 42 = 82; the addition is written at once;
    # units 5 * 9 = 45, tens 8 * 9 = 72 -> 2: 20 + 45 = 65
    assert task.decode(dec) == "= 4 2 4 8 2 ; 8 5 ; = 4 5 2 6 5 ; < 6 5 > <eos>"
    assert len(dec) == len(plain) + 8
    assert task.encode_response(p, decompose=[False]) == plain  # missing entries: at once
    assert task.decode(task.encode_response(p, "giveup", stop=1, decompose=[True])) == (
        "= 4 2 4 8 2 ; <eos>"
    )
    out = torch.full((2, task.MAX_RESPONSE), task.PAD)
    out[0, : len(dec)] = torch.tensor(dec)
    out[1, : len(plain)] = torch.tensor(plain)
    valid, correct, lengths = task.score(out, [p, p])
    assert valid.all() and correct.all() and lengths.tolist() == [len(dec), len(plain)]


def test_warm_start_decomposition_is_off_by_default_and_keeps_every_recorded_hash():
    from trainer_template.proxy import warmstart

    default = get_protocol("default")
    assert not {"skill_decompose", "habit_decompose"} & set(default.to_dict()["warmstart"])
    assert warmstart.checkpoint_name(default) == "warmstart-a3556b6cbf685a7d.pt"  # the shipped one
    dec = dataclasses.replace(
        default, warmstart=dataclasses.replace(default.warmstart, habit_decompose=0.3)
    )
    assert dec.to_dict()["warmstart"]["habit_decompose"] == 0.3
    assert "skill_decompose" not in dec.to_dict()["warmstart"]
    assert dec.warmstart_hash() != default.warmstart_hash() and dec.hash() != default.hash()
    # the habits phase decomposes hard chains' products at its rate; the skill phase at 0 never
    ws = dataclasses.replace(dec.warmstart, batch=256, habit_hard=(0.0, 1.0, 0.0, 0.0))
    seqs, mask = warmstart.sft_batch(torch.Generator().manual_seed(0), ws, "habits")
    eq = (seqs[:, task.PROMPT_LEN :] == task.EQ).any(1)
    hard_mul = (seqs[:, 3 : task.PROMPT_LEN - 1 : 2] == task.TIMES).any(1)
    assert eq.any() and not (eq & ~hard_mul).any()  # only chains with a product decompose
    seqs, _ = warmstart.sft_batch(torch.Generator().manual_seed(0), ws, "skill")
    assert not (seqs[:, task.PROMPT_LEN :] == task.EQ).any()
    # the default's batches are the ones the shipped warm start was built from (hashed before
    # decomposition existed): a setting at rate 0 draws nothing
    h = hashlib.sha256()
    for phase, seed in (("skill", 1), ("habits", 2)):
        gen = torch.Generator().manual_seed(seed)
        for _ in range(20):
            seqs, mask = warmstart.sft_batch(gen, default.warmstart, phase)
            h.update(seqs.numpy().tobytes())
            h.update(mask.numpy().tobytes())
    assert h.hexdigest().startswith("f6731b0425e17d7f")
