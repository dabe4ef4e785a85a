"""AV-GRPO (analytic-variance GRPO, POISE appendix), an edit over the root algorithm.py: card in
av_grpo.md."""


@dataclass
class Hyperparameters:
    sigma_min: float = 0.1
    """floor sigma_min of the analytic std (> 0; the paper gives no value)"""
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
    """AV-GRPO advantages [B] (population moments over each prompt group g):
    mu_g = mean_g(R), mu2_g = mean_g(R^2), sigma_analytic = sqrt(mu2_g - mu_g^2),
    A_i = (R_i - mu_g) / max(sigma_analytic, sigma_min).
    A float32 round-off of mu2_g - mu_g^2 below zero (identical graded rewards) counts as 0."""
    if not cfg.sigma_min > 0:
        raise ValueError(f"sigma_min must be positive, got {cfg.sigma_min}")
    scores = batch.rewards.to(torch.float32)
    mu = group_stats(scores, batch.group).mean
    mu2 = group_stats(scores * scores, batch.group).mean
    sigma = (mu2 - mu * mu).clamp(min=0.0).sqrt()
    return (scores - mu) / sigma.clamp(min=cfg.sigma_min)
