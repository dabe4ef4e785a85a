"""SA-GRPO (dual anchor, fixed scale, POISE appendix: a regression case), an edit over the root
algorithm.py: card in sa_grpo.md."""


@dataclass
class Hyperparameters:
    anchor_weight: float = 0.5
    """weight alpha of the group mean in the anchor (the paper gives no value)"""
    fixed_scale: float = 0.5
    """the fixed scale sigma_fixed (the paper gives no value)"""
    clip_ratio_low: float = 0.2
    """PPO clip epsilon below 1"""
    clip_ratio_high: float = 0.2
    """PPO clip epsilon above 1 (DAPO clip-higher raises it)"""
    clip_ratio_c: float = 3.0
    """dual-clip bound for negative advantages (verl's default; must exceed 1)"""
    loss_agg_mode: str = "token-mean"
    """token-mean | seq-mean-token-mean | seq-mean-token-sum-norm"""
    kl_coef: float = 0.001
    """weight of the KL-to-reference loss term (verl's GRPO recipe: 0.001; 0 disables it)"""
    kl_type: str = "low_var_kl"
    """k1 | k2 | k3 | low_var_kl"""
    entropy_coef: float = 0.001
    """weight of the entropy bonus (subtracted from the loss)"""


def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """SA-GRPO advantages [B]: mu_anchor = alpha mu_group + (1 - alpha) mu_batch (alpha = anchor_weight),
    A_i = (R_i - mu_anchor) / sigma_fixed (sigma_fixed = fixed_scale)."""
    scores = batch.rewards.to(torch.float32)
    anchor = (
        cfg.anchor_weight * group_stats(scores, batch.group).mean
        + (1.0 - cfg.anchor_weight) * scores.mean()
    )
    return (scores - anchor) / cfg.fixed_scale
