"""The interface and the GRPO baseline against verl 0.9.1's own functions (CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer_template import ALGORITHM_FILE
from trainer_template.interface import (
    LOSS_AGG_MODES,
    RolloutBatch,
    agg_loss,
    group_stats,
    kl_penalty,
    ppo_clip_loss,
)
from trainer_template.loader import load_algorithm, make_config

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")


@pytest.fixture(scope="module")
def algo():
    return load_algorithm(ALGORITHM_FILE.read_text(), "grpo")


def _batch(scores: torch.Tensor, group: torch.Tensor) -> RolloutBatch:
    n = scores.shape[0]
    return RolloutBatch(
        rewards=scores,
        group=group,
        valid=torch.ones(n, dtype=torch.bool),
        correct=scores > 0,
        lengths=torch.full((n,), 5, dtype=torch.long),
    )


def _case(kind: str, n_groups: int, g: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    if kind == "binary":
        scores = torch.randint(0, 2, (n_groups * g,), generator=gen).float()
        group = torch.arange(n_groups).repeat_interleave(g)
    elif kind == "continuous":
        scores = torch.randn(n_groups * g, generator=gen)
        group = torch.arange(n_groups).repeat_interleave(g)
    elif kind == "constant":  # every group has equal rewards: std 0
        scores = torch.randint(0, 2, (n_groups,), generator=gen).float().repeat_interleave(g)
        group = torch.arange(n_groups).repeat_interleave(g)
    elif kind == "graded_constant":  # equal graded rewards: float32 gives them a std of ~1e-8
        scores = torch.full((n_groups * g,), 0.9)
        group = torch.arange(n_groups).repeat_interleave(g)
    elif kind == "shuffled":  # graded rewards, members of a group scattered over the batch
        scores = torch.rand(n_groups * g, generator=gen)
        group = torch.arange(n_groups).repeat_interleave(g)
        group = group[torch.randperm(group.numel(), generator=gen)] * 5 + 2
    elif kind == "ragged":  # singleton groups mixed with larger ones, shuffled, non-contiguous ids
        sizes = torch.randint(1, g + 1, (n_groups,), generator=gen)
        sizes[0] = 1
        group = torch.repeat_interleave(torch.arange(n_groups) * 7 + 3, sizes)
        group = group[torch.randperm(group.numel(), generator=gen)]
        scores = torch.randint(0, 2, (group.numel(),), generator=gen).float()
    else:
        raise AssertionError(kind)
    return scores, group


@pytest.mark.parametrize(
    "kind", ["binary", "continuous", "constant", "graded_constant", "shuffled", "ragged"]
)
@pytest.mark.parametrize("n_groups,g", [(1, 1), (1, 8), (4, 2), (16, 8), (32, 16)])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_equals_verl(algo, kind, n_groups, g, seed, norm):
    scores, group = _case(kind, n_groups, g, seed)
    t = 6
    gen = torch.Generator().manual_seed(seed + 100)
    mask = (torch.rand(scores.numel(), t, generator=gen) > 0.3).float()
    mask[:, 0] = 1.0
    token_rewards = torch.zeros(scores.numel(), t)
    token_rewards[:, 0] = scores  # outcome reward on one token; verl sums over tokens
    index = np.array([f"uid{int(x)}" for x in group], dtype=object)
    ref, _ = core_algos.compute_grpo_outcome_advantage(
        token_rewards, mask, index, norm_adv_by_std_in_grpo=norm
    )
    cfg = make_config(algo, {"norm_adv_by_std": norm})
    ours = algo.compute_advantages(_batch(scores, group), cfg)
    assert ours.shape == (scores.numel(),)
    assert torch.equal(ours.unsqueeze(-1) * mask, ref)  # bit-equal, not only close


def test_rloo_prior_equals_verl():
    from engine.archive.edit import prior_source

    rloo = load_algorithm(prior_source("rloo"), "rloo")
    scores, group = _case("ragged", 12, 8, 3)
    mask = torch.ones(scores.numel(), 4)
    tok = torch.zeros_like(mask)
    tok[:, -1] = scores
    index = np.array([int(x) for x in group], dtype=object)
    ref, _ = core_algos.compute_rloo_outcome_advantage(tok, mask, index, config=None)
    ours = rloo.compute_advantages(_batch(scores, group), make_config(rloo))
    assert torch.allclose(ours.unsqueeze(-1) * mask, ref, atol=1e-6)


def _loss_inputs(seed: int, b: int = 6, t: int = 9):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=gen) * 3
    logp = (
        old + torch.randn(b, t, generator=gen) * 0.6
    )  # ratios well outside [0.8, 1.2] and beyond 3
    adv = torch.randn(b, 1, generator=gen).expand(b, t) * 2
    mask = (torch.rand(b, t, generator=gen) > 0.25).float()
    mask[0] = 0.0  # a fully masked sequence
    mask[1, :] = 1.0
    return logp, old, adv.contiguous(), mask


def _verl_actor_cfg(low: float, high: float, mode: str):
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": low,
            "clip_ratio_high": high,
            "clip_ratio_c": 3.0,
            "loss_agg_mode": mode,
            "global_batch_info": {},
        }
    )


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("low,high", [(0.2, 0.2), (0.2, 0.28)])
def test_policy_loss_equals_verl_vanilla(algo, mode, seed, low, high):
    logp, old, adv, mask = _loss_inputs(seed)
    ref_loss, ref_metrics = core_algos.compute_policy_loss_vanilla(
        old_log_prob=old,
        log_prob=logp,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=mode,
        config=_verl_actor_cfg(low, high, mode),
    )
    cfg = make_config(algo, {"loss_agg_mode": mode, "clip_ratio_low": low, "clip_ratio_high": high})
    lp = logp.clone().requires_grad_(True)
    loss, metrics = algo.policy_loss(lp, old, adv, mask, cfg)
    assert torch.allclose(loss, ref_loss, atol=1e-6), (float(loss), float(ref_loss))
    assert metrics["pg_clipfrac"] == pytest.approx(ref_metrics["actor/pg_clipfrac"], abs=1e-6)
    loss.backward()
    assert torch.isfinite(lp.grad).all()


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_equals_verl(mode):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(7, 11, generator=gen)
    mask = (torch.rand(7, 11, generator=gen) > 0.4).float()
    mask[3] = 0.0
    assert torch.allclose(agg_loss(x, mask, mode), core_algos.agg_loss(x, mask, mode), atol=1e-6)
    with pytest.raises(ValueError):
        agg_loss(x, mask, "token-median")


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3", "low_var_kl"])
def test_kl_penalty_equals_verl(kl_type):
    gen = torch.Generator().manual_seed(9)
    logp = -torch.rand(5, 13, generator=gen) * 30  # extreme differences exercise both clamps
    ref = -torch.rand(5, 13, generator=gen) * 30
    assert torch.allclose(
        kl_penalty(logp, ref, kl_type), core_algos.kl_penalty(logp, ref, kl_type), atol=1e-6
    )


def test_kl_and_entropy_terms_enter_the_loss(algo):
    logp, old, adv, mask = _loss_inputs(0)
    ref = old - 0.3
    ent = torch.rand_like(logp)
    base, _ = algo.policy_loss(logp, old, adv, mask, make_config(algo))
    cfg = make_config(algo, {"kl_coef": 0.1, "entropy_coef": 0.01})
    loss, m = algo.policy_loss(logp, old, adv, mask, cfg, ref_log_prob=ref, entropy=ent)
    kl = core_algos.agg_loss(core_algos.kl_penalty(logp, ref, "low_var_kl"), mask, "token-mean")
    h = core_algos.agg_loss(ent, mask, "token-mean")
    assert torch.allclose(loss, base + 0.1 * kl - 0.01 * h, atol=1e-6)
    assert m["kl_loss"] == pytest.approx(float(kl), abs=1e-6)


def test_dual_clip_bounds_negative_advantages():
    logp = torch.tensor([[2.0]])  # ratio e^2 = 7.39 > c = 3
    loss, _ = ppo_clip_loss(logp, torch.zeros(1, 1), torch.tensor([[-1.0]]), 0.2, 0.2, 3.0)
    assert float(loss) == pytest.approx(3.0)
    loss, _ = ppo_clip_loss(logp, torch.zeros(1, 1), torch.tensor([[-1.0]]), 0.2, 0.2, None)
    assert float(loss) == pytest.approx(float(torch.exp(torch.tensor(2.0))))
    with pytest.raises(ValueError):
        ppo_clip_loss(logp, torch.zeros(1, 1), torch.tensor([[-1.0]]), 0.2, 0.2, 1.0)


@pytest.mark.parametrize("layout", ["contiguous", "shuffled", "ragged", "masked"])
def test_row_mean_std_is_bit_equal_to_a_loop(layout):
    """torch.mean / torch.std over each group's members in batch order, as verl's loop computes them."""
    gen = torch.Generator().manual_seed(11)
    sizes = [8] * 12 if layout in ("contiguous", "shuffled") else [1, 3, 8, 8, 5, 16, 2, 8]
    group = torch.repeat_interleave(torch.arange(len(sizes)) * 3 + 1, torch.tensor(sizes))
    if layout != "contiguous":
        group = group[torch.randperm(group.numel(), generator=gen)]
    values = torch.rand(group.numel(), generator=gen)
    values[group == group[0]] = 0.9  # equal graded values: float32 gives them a std of ~1e-8
    mask = torch.rand(group.numel(), generator=gen) > 0.3 if layout == "masked" else None
    mean, std = group_stats(values, group, mask).row_mean_std()
    for i in range(group.numel()):
        members = (group == group[i]) & (mask if mask is not None else True)
        v = values[members]
        if v.numel() == 0:
            assert mean[i] == 0 and std[i] == 0
            continue
        assert torch.equal(mean[i], torch.mean(v))
        assert torch.equal(std[i], torch.std(v) if v.numel() > 1 else torch.tensor(0.0))


def test_group_stats_match_a_loop():
    gen = torch.Generator().manual_seed(4)
    group = torch.randint(0, 9, (200,), generator=gen) * 5
    values = torch.randn(200, generator=gen)
    mask = torch.rand(200, generator=gen) > 0.3
    st = group_stats(values, group, mask)
    for i in range(0, 200, 17):
        members = (group == group[i]) & mask
        v = values[members]
        assert st.count[i] == members.sum()
        if v.numel():
            assert st.mean[i] == pytest.approx(float(v.mean()), abs=1e-5)
            assert st.var[i] == pytest.approx(float(v.var(unbiased=False)), abs=1e-5)
            assert st.min[i] == pytest.approx(float(v.min()))
            assert st.max[i] == pytest.approx(float(v.max()))
        others = values[members & (torch.arange(200) != i)]
        expect = float(others.mean()) if others.numel() else 0.0
        assert st.loo_mean[i] == pytest.approx(expect, abs=1e-5)


def test_rollout_batch_rejects_bad_shapes():
    with pytest.raises(ValueError, match="group"):
        RolloutBatch(
            torch.zeros(3),
            torch.zeros(2, dtype=torch.long),
            torch.ones(3, dtype=torch.bool),
            torch.ones(3, dtype=torch.bool),
            torch.ones(3, dtype=torch.long),
        )
    with pytest.raises(ValueError, match="progress"):
        RolloutBatch(
            torch.zeros(3),
            torch.zeros(3, dtype=torch.long),
            torch.ones(3, dtype=torch.bool),
            torch.ones(3, dtype=torch.bool),
            torch.ones(3, dtype=torch.long),
            progress=1.5,
        )


def test_rollout_batch_lazy_lengths_computed_once_on_first_read():
    mask = (torch.arange(7).unsqueeze(0) < torch.tensor([[7], [1], [4]])).float()
    calls = []

    def count():
        calls.append(1)
        return mask.sum(-1).round().long()

    b = RolloutBatch(
        torch.zeros(3),
        torch.zeros(3, dtype=torch.long),
        torch.ones(3, dtype=torch.bool),
        torch.ones(3, dtype=torch.bool),
        count,
    )
    assert calls == [] and b.size == 3  # other fields never trigger it
    assert b.lengths.tolist() == [7, 1, 4] and b.lengths.dtype == torch.long
    assert b.lengths is b.lengths and calls == [1]  # kept after the first read
    assert torch.equal(b.lengths, mask.sum(-1).round().long())  # exactly the eager sum
    assert "lengths=tensor([7, 1, 4])" in repr(b)
    with pytest.raises(AttributeError, match="no_such"):
        b.no_such


def test_rollout_batch_lazy_lengths_checked_like_eager():
    args = (
        torch.zeros(3),
        torch.zeros(3, dtype=torch.long),
        torch.ones(3, dtype=torch.bool),
        torch.ones(3, dtype=torch.bool),
    )
    with pytest.raises(ValueError, match=r"lengths must have shape \[3\], got \(2,\)"):
        RolloutBatch(*args, torch.ones(2, dtype=torch.long))
    wrong = RolloutBatch(*args, lambda: torch.ones(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"lengths must have shape \[3\], got \(2,\)"):
        wrong.lengths
    with pytest.raises(ValueError, match=r"lengths must have shape \[3\], got \(3, 1\)"):
        RolloutBatch(*args, lambda: torch.ones(3, 1, dtype=torch.long)).lengths
    with pytest.raises(ValueError, match="must return a Tensor"):
        RolloutBatch(*args, lambda: [1, 2, 3]).lengths


def test_training_state_reaches_policy_losses_that_take_it():
    from trainer_template.interface import TrainingState, call_policy_loss

    seen = {}

    def new_style(
        log_prob,
        old_log_prob,
        advantages,
        response_mask,
        cfg,
        ref_log_prob=None,
        entropy=None,
        state=None,
    ):
        seen["state"] = state
        return log_prob.sum(), {}

    def old_style(
        log_prob, old_log_prob, advantages, response_mask, cfg, ref_log_prob=None, entropy=None
    ):
        return log_prob.sum() * 2, {}

    x = torch.ones(2, 3)
    st = TrainingState(progress=0.25, step=3, total_steps=13, entropy=0.4)
    loss, _ = call_policy_loss(new_style, x, x, x, x, None, state=st)
    assert seen["state"] is st and float(loss) == 6.0
    loss, _ = call_policy_loss(
        old_style, x, x, x, x, None, state=st
    )  # no `state` parameter: not passed
    assert float(loss) == 12.0
    with pytest.raises(ValueError, match="progress"):
        TrainingState(progress=1.5)


def test_rollout_batch_rewards_must_be_one_dimensional():
    """rewards fixes B; a [B, 1] (or token-level [B, T]) reward tensor is refused, not broadcast later."""
    rest = (
        torch.zeros(3, dtype=torch.long),
        torch.ones(3, dtype=torch.bool),
        torch.ones(3, dtype=torch.bool),
        torch.ones(3, dtype=torch.long),
    )
    with pytest.raises(ValueError, match=r"rewards must be 1-D \[B\], got \(3, 1\)"):
        RolloutBatch(torch.zeros(3, 1), *rest)
    with pytest.raises(ValueError, match=r"rewards must be 1-D \[B\], got \(\)"):
        RolloutBatch(torch.tensor(1.0), *rest)


def test_group_stats_masked_out_members_never_enter():
    """A member the mask leaves out enters no statistic, whatever its value: a NaN or inf there (e.g.
    the entropy of an invalid response) leaves count / sum / mean / var / std / loo_mean as min / max
    and row_mean_std already were, equal to the statistics with 0 in its place."""
    group = torch.tensor([0, 0, 0, 1, 1, 0, 1])
    mask = torch.tensor([True, True, False, True, False, True, True])
    clean = torch.tensor([0.1, 0.2, 0.0, 0.4, 0.0, 0.7, 0.3])
    dirty = clean.clone()
    dirty[2], dirty[4] = float("nan"), float("inf")
    a, b = group_stats(clean, group, mask), group_stats(dirty, group, mask)
    for name in ("count", "sum", "mean", "var", "std", "min", "max"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert torch.equal(a.unbiased_std(), b.unbiased_std())
    assert torch.equal(a.row_mean_std()[0], b.row_mean_std()[0])
    masked_in = mask.nonzero().reshape(-1)
    assert torch.equal(a.loo_mean[masked_in], b.loo_mean[masked_in])
    assert torch.isfinite(b.loo_mean).all()
