"""FA-GRPO — failure-aware two-regime GRPO.

Two regimes per group:
  mixed groups (some correct, some not): the GRPO z-score A_i = (r_i - mean_g) / (std_g + eps);
  degenerate groups (all rewards equal): fixed penalties instead of a zero signal:
    all-fail: A_i = -fail_penalty for valid samples, -invalid_penalty for invalid ones;
    all-correct: A_i = 0.
In mixed groups invalid samples are capped at -invalid_penalty (A_i = min(A_i, -invalid_penalty)).
Penalty values are assumptions (the mechanism is described as two-regime with fixed penalties).

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
    fail_penalty: float = 0.1
    """advantage magnitude of a valid sample in an all-fail group"""
    invalid_penalty: float = 0.5
    """advantage magnitude of an invalid sample in a degenerate group (and its cap in mixed groups)"""
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


def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """GRPO z-scores in mixed groups, fixed penalties in all-fail groups [B]."""
    scores = batch.rewards.to(torch.float32)
    valid = batch.valid.to(torch.bool)
    stats = group_stats(scores, batch.group)
    mixed = stats.max > stats.min
    z = (scores - stats.mean) / (stats.unbiased_std() + cfg.eps)
    z = torch.where(valid, z, torch.minimum(z, torch.full_like(z, -cfg.invalid_penalty)))
    correct_frac = group_stats(batch.correct.to(torch.float32), batch.group).mean
    fail = torch.where(
        valid, torch.full_like(z, -cfg.fail_penalty), torch.full_like(z, -cfg.invalid_penalty)
    )
    degenerate = torch.where(correct_frac > 0, torch.zeros_like(z), fail)
    return torch.where(mixed, z, degenerate)


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
