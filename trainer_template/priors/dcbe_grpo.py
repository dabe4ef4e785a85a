"""DCBE-GRPO — decoupled correctness baseline with a bounded efficiency term (length compression).

The efficiency term acts on correct answers but is bounded so that it can never flip their sign:
    A_i = max(z_i + length_coef * (1 - rho_i), min_positive)   for correct i in mixed groups,
    A_i = length_coef * (1 - rho_i)                              for correct i in all-correct groups,
    A_i = z_i                                                    otherwise,
rho_i = l_i / mean length of the correct members of g, clipped to [0.5, 2]. All-correct groups, which
GRPO ignores, thus still teach brevity. The exact equations are assumptions from the family's
description.

Only the region between the ALGO LOGIC markers is meant to be edited by a candidate; the two
function signatures are the fixed interface (trainer_template/interface.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer_template.interface import (
    RolloutBatch,
    TrainingState,
    agg_loss,
    group_stats,
    kl_penalty,
    ppo_clip_loss,
)


# ALGO LOGIC: everything below is the mechanism; candidates edit it.
@dataclass
class Hyperparameters:
    eps: float = 1e-6
    """numerical floor added to the group std"""
    length_coef: float = 0.2
    """weight of the length term"""
    len_ratio_min: float = 0.5
    """lower clip of the relative length"""
    len_ratio_max: float = 2.0
    """upper clip of the relative length"""
    min_positive: float = 0.05
    """lower bound of a correct sample's advantage in a mixed group"""
    clip_ratio_low: float = 0.2
    """PPO clip epsilon below 1"""
    clip_ratio_high: float = 0.2
    """PPO clip epsilon above 1 (DAPO clip-higher raises it)"""
    clip_ratio_c: float = 3.0
    """dual-clip bound for negative advantages (verl's default; must exceed 1)"""
    loss_agg_mode: str = "token-mean"
    """token-mean | seq-mean-token-mean | seq-mean-token-sum-norm"""
    kl_coef: float = 0.0
    """weight of the KL-to-reference loss term (0 disables it)"""
    kl_type: str = "low_var_kl"
    """k1 | k2 | k3 | low_var_kl"""
    entropy_coef: float = 0.0
    """weight of the entropy bonus (subtracted from the loss)"""


def _relative_length(batch: RolloutBatch, lo: float, hi: float) -> torch.Tensor:
    """l_i / mean of the lengths of the correct members of its group (all members when none), clipped [B]."""
    lengths = batch.lengths.to(torch.float32)
    correct = batch.correct.to(torch.bool)
    sc = group_stats(lengths, batch.group, mask=correct)
    sa = group_stats(lengths, batch.group)
    ref = torch.where(sc.count > 0, sc.mean, sa.mean).clamp(min=1.0)
    return (lengths / ref).clamp(lo, hi)


def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """GRPO with a sign-preserving shortness term for correct samples [B]."""
    scores = batch.rewards.to(torch.float32)
    stats = group_stats(scores, batch.group)
    singleton = stats.count < 2
    mean = torch.where(singleton, torch.zeros_like(scores), stats.mean)
    std = torch.where(singleton, torch.ones_like(scores), stats.unbiased_std())
    adv = (scores - mean) / (std + cfg.eps)
    correct = batch.correct.to(torch.bool)
    mixed = stats.max > stats.min
    rho = _relative_length(batch, cfg.len_ratio_min, cfg.len_ratio_max)
    eff = cfg.length_coef * (1.0 - rho)
    bounded = torch.clamp(adv + eff, min=cfg.min_positive)
    out = torch.where(mixed, bounded, eff)
    return torch.where(correct, out, adv)


def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cfg: Hyperparameters,
    ref_log_prob: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    state: TrainingState | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip loss. log_prob, old_log_prob, advantages, response_mask, entropy: [B, T]; returns a scalar."""
    pg_losses, clipped = ppo_clip_loss(
        log_prob,
        old_log_prob,
        advantages,
        cfg.clip_ratio_low,
        cfg.clip_ratio_high,
        cfg.clip_ratio_c,
    )
    loss = agg_loss(pg_losses, response_mask, cfg.loss_agg_mode)
    mask = response_mask.to(log_prob.dtype)
    metrics = {
        "pg_loss": float(loss.detach()),
        "pg_clipfrac": float((clipped.to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1.0)),
    }
    if cfg.kl_coef > 0 and ref_log_prob is not None:
        kl = agg_loss(
            kl_penalty(log_prob, ref_log_prob, cfg.kl_type), response_mask, cfg.loss_agg_mode
        )
        loss = loss + cfg.kl_coef * kl
        metrics["kl_loss"] = float(kl.detach())
    if cfg.entropy_coef != 0 and entropy is not None:
        ent = agg_loss(entropy, response_mask, cfg.loss_agg_mode)
        loss = loss - cfg.entropy_coef * ent
        metrics["entropy"] = float(ent.detach())
    return loss, metrics
