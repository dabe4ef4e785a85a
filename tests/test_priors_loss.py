"""The loss side of the priors: GRPO's KL term, BN / SA-GRPO's KL and entropy terms, the entropy
controllers of VM-AV, DACE and DCBE-GRPO (direction, purity), and the root's distance to the paper's
GRPO equation."""

from __future__ import annotations

import math

import pytest
import torch

from engine.archive.edit import prior_source
from trainer_template.interface import (
    RolloutBatch,
    TrainingState,
    agg_loss,
    call_policy_loss,
    kl_penalty,
    ppo_clip_loss,
)
from trainer_template.loader import load_algorithm, make_config
from trainer_template.priors import list_priors


@pytest.fixture(scope="module")
def modules():
    return {n: load_algorithm(prior_source(n), n) for n in list_priors()}


def loss_inputs(seed=0, b=6, t=9):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=gen) * 3 - 0.1
    logp = old + 0.3 * torch.randn(b, t, generator=gen)
    adv = torch.randn(b, 1, generator=gen).expand(b, t).contiguous()
    mask = (torch.rand(b, t, generator=gen) > 0.2).float()
    mask[:, 0] = 1.0
    ref = old + 0.2 * torch.randn(b, t, generator=gen)
    return logp, old, adv, mask, ref


def surrogate(logp, old, adv, mask):
    pg, _ = ppo_clip_loss(logp, old, adv, 0.2, 0.2, 3.0)
    return agg_loss(pg, mask, "token-mean")


def test_grpo_has_verls_kl_term_by_default(modules):
    mod = modules["grpo"]
    cfg = make_config(mod)
    assert (cfg.kl_coef, cfg.kl_type, cfg.entropy_coef) == (0.001, "low_var_kl", 0.0)
    logp, old, adv, mask, ref = loss_inputs()
    loss, m = mod.policy_loss(logp, old, adv, mask, cfg, ref_log_prob=ref)
    kl = agg_loss(kl_penalty(logp, ref, "low_var_kl"), mask, "token-mean")
    assert float(kl) > 0
    assert torch.allclose(loss, surrogate(logp, old, adv, mask) + 0.001 * kl, atol=1e-7)
    assert m["kl_loss"] == pytest.approx(float(kl))
    # without a reference (verl computes the KL itself) the loss is the bare surrogate
    bare, _ = mod.policy_loss(logp, old, adv, mask, cfg)
    assert torch.equal(bare, surrogate(logp, old, adv, mask))


@pytest.mark.parametrize("name", ["bn_grpo", "sa_grpo"])
def test_bn_and_sa_carry_kl_and_entropy_terms(modules, name):
    """L = L_clip + beta_KL KL - beta_ent H (the paper's objective E[L^CLIP - beta D_KL + beta H], as a loss)."""
    mod = modules[name]
    cfg = make_config(mod)
    assert cfg.kl_coef == 0.001 and cfg.entropy_coef == 0.001
    logp, old, adv, mask, ref = loss_inputs(1)
    ent = torch.rand_like(logp)
    loss, _ = mod.policy_loss(logp, old, adv, mask, cfg, ref_log_prob=ref, entropy=ent)
    kl = agg_loss(kl_penalty(logp, ref, "low_var_kl"), mask, "token-mean")
    h = agg_loss(ent, mask, "token-mean")
    assert torch.allclose(loss, surrogate(logp, old, adv, mask) + 0.001 * kl - 0.001 * h, atol=1e-7)


def entropy_grad(mod, cfg, measured, progress=0.5, with_state=True):
    """d loss / d entropy (summed): negative when the loss rewards entropy."""
    logp, old, adv, mask, ref = loss_inputs(2)
    logp.requires_grad_(True)
    ent = torch.full_like(logp, 0.5).requires_grad_(True)
    state = TrainingState(progress=progress, step=5, total_steps=11, entropy=measured)
    loss, m = call_policy_loss(
        mod.policy_loss,
        logp,
        old,
        adv,
        mask,
        cfg,
        ref_log_prob=ref,
        entropy=ent,
        state=state if with_state else None,
    )
    loss.backward()
    return 0.0 if ent.grad is None else float(ent.grad.sum()), m


CONTROLLERS = {
    # prior: (a measured entropy below its target, one above it, does it penalise above the target)
    "vm_av_grpo": (0.05, 0.5, False),
    "dace_grpo": (0.05, 0.5, False),
    "dcbe_grpo": (0.05, 0.5, True),
}


@pytest.mark.parametrize("name", sorted(CONTROLLERS))
def test_entropy_controller_direction(modules, name):
    mod = modules[name]
    cfg = make_config(mod)
    low, high, two_sided = CONTROLLERS[name]
    g_low, m_low = entropy_grad(mod, cfg, low)
    assert g_low < 0, "entropy below the target: the loss must reward entropy"
    assert m_low["entropy_coef"] > 0
    g_high, _ = entropy_grad(mod, cfg, high)
    if two_sided:
        assert g_high > 0, "entropy above the target: the dynamic controller penalises it"
    else:
        assert g_high == 0, "entropy above the target: no bonus"
    # the further below the target, the stronger the bonus
    g_lower, _ = entropy_grad(mod, cfg, low / 2)
    assert g_lower < g_low


def test_controllers_read_the_batch_entropy_without_a_state(modules):
    """No TrainingState (a direct call): the measured entropy is the micro-batch's, 0.5 here, and
    progress counts as 0; each target is raised to 1.0 so that 0.5 lies below it."""
    raised = {
        "vm_av_grpo": {"entropy_target": 1.0},
        "dcbe_grpo": {"entropy_target": 1.0},
        "dace_grpo": {"entropy_target_start": 1.0},
    }
    for name, overrides in raised.items():
        mod = modules[name]
        g, _ = entropy_grad(mod, make_config(mod, overrides), None, with_state=False)
        assert g < 0, name
        g, _ = entropy_grad(mod, make_config(mod), None, with_state=False)
        assert g >= 0, name  # 0.5 is above the default targets


def test_dace_target_anneals(modules):
    """H = 0.2: below the early target 0.3 (a bonus), above the late target 0.1 (none)."""
    mod = modules["dace_grpo"]
    cfg = make_config(mod)
    early, _ = entropy_grad(mod, cfg, 0.2, progress=0.0)
    late, _ = entropy_grad(mod, cfg, 0.2, progress=1.0)
    assert early < 0 and late == 0
    coef = mod.entropy_coefficient
    assert coef(cfg, TrainingState(progress=0.0), 0.15) == pytest.approx(0.01 * 0.5)
    assert coef(cfg, TrainingState(progress=0.5), 0.1) == pytest.approx(0.01 * 0.5)


@pytest.mark.parametrize("name", sorted(CONTROLLERS))
def test_controllers_are_pure(modules, name):
    """No hidden state: the same inputs give the same loss, whatever was called in between."""
    mod = modules[name]
    cfg = make_config(mod)
    logp, old, adv, mask, ref = loss_inputs(3)
    ent = torch.rand_like(logp)

    def loss(h, p):
        st = TrainingState(progress=p, entropy=h)
        return mod.policy_loss(logp, old, adv, mask, cfg, ref_log_prob=ref, entropy=ent, state=st)[
            0
        ]

    first = loss(0.05, 0.2)
    for h, p in ((0.9, 1.0), (0.0, 0.0), (0.3, 0.7)):
        loss(h, p)
    assert torch.equal(first, loss(0.05, 0.2))
    before = {k: v for k, v in vars(mod).items() if not k.startswith("__")}
    loss(0.1, 0.5)
    assert {k: v for k, v in vars(mod).items() if not k.startswith("__")}.keys() == before.keys()


@pytest.mark.parametrize("name", [n for n in list_priors() if n not in CONTROLLERS])
def test_constant_entropy_weight_elsewhere(modules, name):
    mod = modules[name]
    cfg = make_config(mod)
    for h in (0.0, 0.2, 5.0):
        assert mod.entropy_coefficient(cfg, TrainingState(entropy=h), h) == cfg.entropy_coef


def test_root_against_the_papers_grpo_on_a_group_of_eight(modules):
    """verl (the root): unbiased std, eps outside; the paper: population std, eps under the square root.
    On one success in eight the paper's advantages are sqrt(8/7) = 1.069 times the root's."""
    r = torch.tensor([1.0] + [0.0] * 7)
    b = RolloutBatch(
        rewards=r,
        group=torch.zeros(8, dtype=torch.long),
        valid=torch.ones(8, dtype=torch.bool),
        correct=r > 0.5,
        lengths=torch.full((8,), 10),
    )
    root = modules["grpo"].compute_advantages(b, make_config(modules["grpo"]))
    eps = 1e-6
    mu = r.mean()
    paper = (r - mu) / torch.sqrt(((r - mu) ** 2).mean() + eps)
    assert float(root[0]) == pytest.approx(2.4749, abs=1e-4)
    assert float(paper[0]) == pytest.approx(2.6458, abs=1e-4)
    assert torch.allclose(paper / root, torch.full((8,), math.sqrt(8 / 7)), atol=1e-5)
    assert float((paper - root).abs().max()) == pytest.approx(0.1709, abs=1e-4)
    doc = modules["grpo"].__doc__
    assert "population std" in doc and "sqrt(G / (G - 1))" in doc and "1.069" in doc
