"""GRPO — group-relative policy optimization (the root node of every archive).

Advantage (Shao et al. 2024), bit-equal to verl 0.9.1's ``compute_grpo_outcome_advantage`` (tested with
torch.equal, graded and shuffled groups included):
    A_i = (r_i - mean_g(r)) / (std_g(r) + eps)     std_g: unbiased (divided by G - 1), eps outside;
    singleton groups use mean 0 and std 1.
The POISE paper writes GRPO with the population std and eps under the square root,
    A_i = (r_i - mu_g) / sqrt(mean_g((r - mu_g)^2) + eps),
which is larger by the constant sqrt(G / (G - 1)) on every group with a spread (1.069 at G = 8: one
success in eight gets 2.4749 here, 2.6458 there) and gives singleton groups 0 instead of r_i / (1 + eps).
The root follows verl so that a node trains the same on the proxy and on verl.

Loss: PPO clipped surrogate with separate low/high clip ratios and verl's dual clip, verl's aggregation
modes, the KL-to-reference term of verl's GRPO recipe (``kl_coef`` 0.001, ``low_var_kl``) and an
entropy bonus whose weight ``entropy_coefficient`` gives (GRPO: the constant ``entropy_coef``, 0).
On verl the adapter leaves the KL and entropy terms to verl's actor, which adds the same terms with the
node's coefficients, so the total objective is the same in both harnesses.

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
    masked_mean,
    ppo_clip_loss,
)


# ALGO LOGIC: everything below is the mechanism; candidates edit it.
@dataclass
class Hyperparameters:
    eps: float = 1e-6
    """numerical floor added to the group std"""
    norm_adv_by_std: bool = True
    """divide by the group std (False gives Dr.GRPO's centred advantage)"""
    clip_ratio_low: float = 0.2
    """PPO clip epsilon below 1"""
    clip_ratio_high: float = 0.3306
    """PPO clip epsilon above 1 (DAPO clip-higher raises it)"""
    clip_ratio_c: float = 3.0
    """dual-clip bound for negative advantages (verl's default; must exceed 1)"""
    loss_agg_mode: str = "token-mean"
    """token-mean | seq-mean-token-mean | seq-mean-token-sum-norm"""
    kl_coef: float = 0.1
    """weight of the KL-to-reference loss term (verl's GRPO recipe: 0.001; 0 disables it)"""
    kl_type: str = "low_var_kl"
    """k1 | k2 | k3 | low_var_kl"""
    entropy_coef: float = 0.0
    """weight of the entropy bonus (subtracted from the loss)"""
    length_lambda: float = 0.802
    """exponent of the clipped relative length dividing negative valid advantages"""


def grpo_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """GRPO advantages [B], bit-equal to verl's compute_grpo_outcome_advantage (unbiased std, eps
    outside; the group moments computed row-wise as verl's per-group torch.mean / torch.std)."""
    scores = batch.rewards.to(torch.float32)
    stats = group_stats(scores, batch.group)
    singleton = stats.count < 2
    row_mean, row_std = stats.row_mean_std()
    mean = torch.where(singleton, torch.zeros_like(scores), row_mean)
    std = torch.where(singleton, torch.ones_like(scores), row_std)
    centred = scores - mean
    if cfg.norm_adv_by_std:
        return centred / (std + cfg.eps)
    return centred


def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """Sequence-level advantages [B]. baseline: group mean; scale: group std; length: validity-gated length normalisation of negative advantages (VM-AV-GRPO)."""
    scores = batch.rewards.to(torch.float32)
    valid = batch.valid.to(torch.bool)
    stats = group_stats(scores, batch.group)
    singleton = stats.count < 2
    baseline = torch.where(singleton, torch.zeros_like(scores), stats.mean)
    scale = torch.where(singleton, torch.ones_like(scores), stats.unbiased_std()) + cfg.eps
    adv = (scores - baseline) / scale
    lengths = batch.lengths.to(torch.float32)
    mean_valid = group_stats(lengths, batch.group, valid).mean.clamp(min=1.0)
    l_rel = (lengths / mean_valid).clamp(0.5, 2.0)
    adv = torch.where((adv < 0) & valid, adv / l_rel.pow(cfg.length_lambda), adv)
    return adv


def entropy_coefficient(
    cfg: Hyperparameters, state: TrainingState | None, measured_entropy: float
) -> float:
    """Weight of the entropy bonus this step. ``measured_entropy``: mean per-token entropy (nats), the
    harness's ``state.entropy`` when given, else this micro-batch's. GRPO: the constant entropy_coef."""
    return cfg.entropy_coef


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
    """PPO-clip loss + kl_coef * KL(policy || reference) - entropy_coefficient * entropy.

    log_prob, old_log_prob, advantages, response_mask, ref_log_prob, entropy: [B, T]; returns a scalar.
    A term is skipped when its input is None (verl adds both terms itself)."""
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
    if entropy is not None:
        measured = state.entropy if state is not None and state.entropy is not None else None
        if measured is None:
            measured = float(masked_mean(entropy.detach(), response_mask))
        coef = float(entropy_coefficient(cfg, state, measured))
        if coef != 0:
            ent = agg_loss(entropy, response_mask, cfg.loss_agg_mode)
            loss = loss - coef * ent
            metrics["entropy"] = float(ent.detach())
            metrics["entropy_coef"] = coef
    return loss, metrics
