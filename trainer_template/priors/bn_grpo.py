"""BN-GRPO (group-centred, batch-scaled GRPO, POISE appendix), an edit over the root algorithm.py: card
in bn_grpo.md."""


@dataclass
class Hyperparameters:
    eps: float = 1e-6
    """numerical floor added to sigma_batch"""
    adv_clip: float = 3.0
    """advantages are clipped to [-adv_clip, adv_clip] (the paper: 3)"""
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
    """BN-GRPO advantages [B]: A_raw_i = R_i - mu_g (the group mean), sigma_batch = sqrt(mean over
    the whole batch of A_raw^2), A_i = clip(A_raw_i / (sigma_batch + eps), -adv_clip, adv_clip)."""
    scores = batch.rewards.to(torch.float32)
    a_raw = scores - group_stats(scores, batch.group).mean
    sigma_batch = a_raw.square().mean().sqrt()
    return (a_raw / (sigma_batch + cfg.eps)).clamp(-cfg.adv_clip, cfg.adv_clip)
