"""FA-GRPO (failure-aware two-regime GRPO, POISE appendix), an edit over the root algorithm.py: card in
fa_grpo.md."""


@dataclass
class Hyperparameters:
    eps: float = 1e-6
    """numerical floor added to the group std"""
    adv_clip: float = 3.0
    """advantages of groups with a positive reward are clipped to [-adv_clip, adv_clip] (the paper: 3)"""
    invalid_penalty: float = -2.0
    """advantage of a format-invalid sample in a group whose best reward is not positive (the paper: -2.0)"""
    wrong_penalty: float = -0.5
    """advantage of a valid but wrong sample in such a group (the paper: -0.5)"""
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
    entropy_coef: float = 0.0
    """weight of the entropy bonus (subtracted from the loss)"""


def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """FA-GRPO advantages [B]. Groups whose best reward is positive (R_max > 0), every member:
    A_i = clip((R_i - mu_g) / (sigma_g + eps), -adv_clip, adv_clip), sigma_g the population std;
    other groups: invalid_penalty for format-invalid samples, wrong_penalty for valid ones."""
    scores = batch.rewards.to(torch.float32)
    valid = batch.valid.to(torch.bool)
    stats = group_stats(scores, batch.group)
    z = ((scores - stats.mean) / (stats.std + cfg.eps)).clamp(-cfg.adv_clip, cfg.adv_clip)
    penalty = torch.where(
        valid,
        torch.full_like(scores, cfg.wrong_penalty),
        torch.full_like(scores, cfg.invalid_penalty),
    )
    return torch.where(stats.max > 0, z, penalty)
