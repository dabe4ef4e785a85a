"""BN-GRPO — batch-normalised GRPO.

Group-centred, batch-scaled, clipped (as REINFORCE++-baseline scales by the batch):
    c_i = r_i - mean_g(r);   A_i = clip(c_i / (std_batch(c) + eps), -adv_clip, adv_clip)
std_batch is the unbiased std of the centred rewards over the whole batch; singleton groups are centred
to 0.

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
    """numerical floor added to the batch std"""
    adv_clip: float = 5.0
    """symmetric clip of the normalised advantage"""
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
    """Group-centred rewards scaled by their batch std and clipped [B]."""
    scores = batch.rewards.to(torch.float32)
    centred = scores - group_stats(scores, batch.group).mean
    std = centred.std() if centred.numel() > 1 else centred.new_tensor(0.0)
    return (centred / (std + cfg.eps)).clamp(-cfg.adv_clip, cfg.adv_clip)


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
