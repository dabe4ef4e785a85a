"""The offline catalog's components compute the published equations they mirror."""

from __future__ import annotations

import json
import random
import subprocess

import pytest
import torch

from engine.archive.edit import apply_edit, prior_source
from engine.operators.proposers.codegen import PRIOR_SPECS, normalize, render
from engine.operators.proposers.offline import intents_for, prior_record
from trainer_template import ALGORITHM_FILE
from trainer_template.interface import RolloutBatch, TrainingState
from trainer_template.loader import load_algorithm, make_config

ROOT = ALGORITHM_FILE.read_text(encoding="utf-8")


def random_batch(seed: int, singletons: bool = True) -> RolloutBatch:
    rng = random.Random(seed)
    sizes = [rng.choice([1, 4, 8] if singletons else [4, 8]) for _ in range(6)]
    ids = rng.sample(range(1000), len(sizes))
    group = [ids[k] for k, s in enumerate(sizes) for _ in range(s)]
    n = len(group)
    valid = [rng.random() < 0.8 for _ in range(n)]
    correct = [v and rng.random() < 0.4 for v in valid]
    return RolloutBatch(
        rewards=torch.tensor([float(c) for c in correct]),
        group=torch.tensor(group),
        valid=torch.tensor(valid),
        correct=torch.tensor(correct),
        lengths=torch.tensor([rng.randint(1, 300) for _ in range(n)]),
        token_entropy=torch.tensor([rng.random() for _ in range(n)]),
    )


def rendered(spec):
    src = apply_edit(ROOT, render(spec))
    return load_algorithm(src, "catalog")


@pytest.mark.parametrize("name", sorted(PRIOR_SPECS))
def test_prior_specs_are_the_priors(name):
    ours = rendered(PRIOR_SPECS[name])
    prior = load_algorithm(prior_source(name), name)
    c1, c2 = make_config(ours), make_config(prior)
    for seed in range(8):
        b = random_batch(seed)
        assert torch.equal(ours.compute_advantages(b, c1), prior.compute_advantages(b, c2)), seed
    for field in ("clip_ratio_low", "clip_ratio_high", "loss_agg_mode", "kl_coef", "entropy_coef"):
        assert getattr(c1, field) == getattr(c2, field), field
    for h, p in ((0.05, 0.0), (0.15, 0.5), (0.4, 1.0)):
        st = TrainingState(progress=p, entropy=h)
        assert ours.entropy_coefficient(c1, st, h) == prior.entropy_coefficient(c2, st, h)


@pytest.mark.parametrize(
    "name,spec",
    [
        ("av_grpo", {"scale": "analytic", "hp": {"std_floor": 0.1}}),
        ("bn_grpo", {"scale": "batch", "adv_clip": "clip", "hp": {"adv_clip": 3.0}}),
    ],
)
def test_analytic_and_batch_scales_are_av_and_bn_outside_singletons(name, spec):
    """The group_mean baseline is GRPO's (a singleton's baseline is 0), so AV / BN-GRPO's equations hold
    on every group of two or more."""
    ours, prior = rendered(spec), load_algorithm(prior_source(name), name)
    for seed in range(8):
        b = random_batch(seed, singletons=False)
        a = ours.compute_advantages(b, make_config(ours))
        assert torch.allclose(a, prior.compute_advantages(b, make_config(prior)), atol=1e-6)


def test_negative_scale_divides_like_vm_av():
    """Longer wrong answers are pushed down less per sequence, as VM-AV-GRPO's A / L_rel."""
    mod = rendered({"length": "negative_scale"})
    b = RolloutBatch(
        rewards=torch.tensor([1.0, 1.0] + [0.0] * 6),
        group=torch.zeros(8, dtype=torch.long),
        valid=torch.ones(8, dtype=torch.bool),
        correct=torch.tensor([True, True] + [False] * 6),
        lengths=torch.tensor([200, 200, 50, 800, 200, 200, 200, 200]),
        token_entropy=torch.ones(8),
    )
    adv = mod.compute_advantages(b, make_config(mod))
    assert float(adv[2]) < float(adv[4]) < float(adv[3]) < 0
    assert "longer_wrong_penalized_less" in intents_for(normalize({"length": "negative_scale"}))


def test_prior_record_for_the_catalogued_priors():
    rec = prior_record("vm_av_grpo")
    assert rec["components"]["baseline"] == "valid_bayes" and rec["prior"] == "vm_av_grpo"
    assert "longer_wrong_penalized_less" in rec["intents"]
    assert prior_record("fa_grpo") is None  # not expressible by the catalog


@pytest.mark.slow  # verifies every catalog prior
def test_seeded_prior_carries_its_components_and_passes_its_intents(cli, tmp_path):
    arch = tmp_path / "exp"
    cli("init", str(arch))
    out = cli("spawn", "grpo", "--prior", "vm_av_grpo", "-C", str(arch))
    assert out.returncode == 0 and "verified" in out.stdout, out.stdout + out.stderr
    rec = subprocess.run(
        ["git", "-C", str(arch), "show", "poise/vm_av_grpo:records/proposal.json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(rec)["components"] == normalize(PRIOR_SPECS["vm_av_grpo"])
    ver = subprocess.run(
        ["git", "-C", str(arch), "show", "poise/vm_av_grpo:verification.json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(ver)["ok"] and "longer_wrong_penalized_less" in json.loads(ver)["intents"]
