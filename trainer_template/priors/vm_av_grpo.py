"""VM-AV-GRPO — validity-masked analytic-variance GRPO.

Statistics run over the format-valid members V_g of each group, Bayesian-smoothed with a Beta(alpha, beta)
prior:   mu_g = (sum_{j in V_g} r_j + alpha) / (|V_g| + alpha + beta)
         s_g  = max(sqrt(mu_g (1 - mu_g)), sigma_floor)
valid i:   A_i = (r_i - mu_g) / s_g;   invalid i:  A_i = invalid_advantage (a floor penalty).
Validity-gated length normalisation: a valid sample with A_i < 0 is scaled by its relative length
l_i / mean_{j in V_g}(l_j), clipped to [len_ratio_min, len_ratio_max] = [0.5, 2] (longer wrong answers
are pushed down harder, short ones less); invalid samples are never length-scaled.

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
    alpha: float = 1.0
    """Beta-prior pseudo-successes added to the valid-subset mean"""
    beta: float = 1.0
    """Beta-prior pseudo-failures added to the valid-subset mean"""
    sigma_floor: float = 0.1
    """floor of the scale sqrt(mu (1 - mu))"""
    invalid_advantage: float = -1.0
    """advantage assigned to every format-invalid sample"""
    len_ratio_min: float = 0.5
    """lower clip of the relative length of negative valid samples"""
    len_ratio_max: float = 2.0
    """upper clip of the relative length of negative valid samples"""
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
    """Smoothed valid-subset advantages [B]; invalid samples get ``invalid_advantage``."""
    scores = batch.rewards.to(torch.float32)
    valid = batch.valid.to(torch.bool)
    stats = group_stats(scores, batch.group, mask=valid)
    mu = (stats.sum + cfg.alpha) / (stats.count + cfg.alpha + cfg.beta)
    p = mu.clamp(0.0, 1.0)
    scale = torch.sqrt(p * (1.0 - p)).clamp(min=cfg.sigma_floor)
    adv = (scores - mu) / scale
    lengths = batch.lengths.to(torch.float32)
    mean_len = group_stats(lengths, batch.group, mask=valid).mean.clamp(min=1.0)
    ratio = (lengths / mean_len).clamp(cfg.len_ratio_min, cfg.len_ratio_max)
    adv = torch.where(adv < 0, adv * ratio, adv)
    return torch.where(valid, adv, torch.full_like(adv, cfg.invalid_advantage))


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
