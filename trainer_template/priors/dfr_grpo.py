"""DFR-GRPO — decoupled format / reasoning streams.

Two advantage streams, summed:
  format:    A^f_i = format_weight * (v_i - mean_g(v))      (v_i = 1 if format-valid)
  reasoning: over the valid members V_g,  A^r_i = (c_i - mean_{V_g}(c)) / (std_{V_g}(c) + eps) for
             valid i in groups with a correct member; 0 for invalid i.
  all-fail groups (no correct member): an entropy-centred signal replaces the reasoning stream,
             A^r_i = entropy_coef_fail * (H_i - mean_{V_g}(H)) / (std_{V_g}(H) + eps) for valid i,
             with H_i the response's mean token entropy (``token_entropy``; 0 when absent), rewarding
             exploration where no answer succeeded. The sign and scale of that signal are assumed.

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
    """numerical floor added to the stds"""
    format_weight: float = 0.5
    """weight of the format stream"""
    entropy_coef_fail: float = 0.1
    """weight of the entropy-centred signal in all-fail groups"""
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
    """Format stream plus a reasoning stream over valid samples (entropy-centred when all fail) [B]."""
    valid = batch.valid.to(torch.bool)
    v = valid.to(torch.float32)
    c = (batch.correct.to(torch.bool) & valid).to(torch.float32)
    fmt = cfg.format_weight * (v - group_stats(v, batch.group).mean)
    cs = group_stats(c, batch.group, mask=valid)
    reason = (c - cs.mean) / (cs.std + cfg.eps)
    if batch.token_entropy is not None:
        h = batch.token_entropy.to(torch.float32)
        hs = group_stats(h, batch.group, mask=valid)
        explore = cfg.entropy_coef_fail * (h - hs.mean) / (hs.std + cfg.eps)
    else:
        explore = torch.zeros_like(c)
    reason = torch.where(cs.sum > 0, reason, explore)
    return fmt + torch.where(valid, reason, torch.zeros_like(reason))


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
