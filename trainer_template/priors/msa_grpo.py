"""MSA-GRPO — multi-regime scaled-anchor GRPO.

Regime-aware anchor and scaling per group, with p_g the group success rate (mean reward):
  mixed (0 < p_g < 1):  z_i = (r_i - p_g) / max(sqrt(p_g (1 - p_g)), sigma_min)
  saturated (p_g in {0, 1}): anchor = the common reward, z_i = 0 (no signal to amplify).
Length shaping with the relative length rho_i = l_i / mean_g(l), clipped to [0.5, 2]:
  A_i = z_i * rho_i^(-lambda) if z_i > 0 (shorter correct answers get more credit),
  A_i = z_i * rho_i^(+lambda) if z_i < 0 (longer wrong answers are pushed down harder).
Assumed from the mechanism's description (regime-aware anchor and scaling, length ratio^lambda).

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
    sigma_min: float = 0.1
    """floor of the group scale"""
    length_lambda: float = 0.5
    """exponent of the relative-length factor (0 disables length shaping)"""
    len_ratio_min: float = 0.5
    """lower clip of the relative length"""
    len_ratio_max: float = 2.0
    """upper clip of the relative length"""
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
    """Regime-aware scaled advantages with a relative-length exponent [B]."""
    scores = batch.rewards.to(torch.float32)
    stats = group_stats(scores, batch.group)
    p = stats.mean.clamp(0.0, 1.0)
    mixed = stats.max > stats.min
    scale = torch.sqrt(p * (1.0 - p)).clamp(min=cfg.sigma_min)
    z = torch.where(mixed, (scores - stats.mean) / scale, torch.zeros_like(scores))
    lengths = batch.lengths.to(torch.float32)
    rho = (lengths / group_stats(lengths, batch.group).mean.clamp(min=1.0)).clamp(
        cfg.len_ratio_min, cfg.len_ratio_max
    )
    return torch.where(z > 0, z * rho.pow(-cfg.length_lambda), z * rho.pow(cfg.length_lambda))


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
