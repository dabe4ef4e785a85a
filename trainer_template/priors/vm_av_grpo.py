"""VM-AV-GRPO (validity-masked analytic-variance GRPO, POISE appendix and case study), an edit over
the root algorithm.py: card in vm_av_grpo.md."""


@dataclass
class Hyperparameters:
    alpha: float = 1.0
    """Beta-prior pseudo-successes alpha added to the valid subset's reward sum (the paper gives no value)"""
    beta: float = 1.0
    """Beta-prior pseudo-failures beta (the paper gives no value)"""
    sigma_floor: float = 0.1
    """floor sigma_floor of sigma_valid = sqrt(mu_valid (1 - mu_valid)) (> 0; the paper gives no value)"""
    invalid_advantage: float = -1.0
    """A_floor, the advantage of every format-invalid sample (the paper gives no value)"""
    len_ratio_min: float = 0.5
    """lower clip of L_rel = L_i / mean valid length (the paper: 0.5)"""
    len_ratio_max: float = 2.0
    """upper clip of L_rel (the paper: 2.0)"""
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
    entropy_target: float = 0.2
    """mean token entropy (nats) below which the adaptive entropy bonus acts (> 0)"""
    entropy_coef_max: float = 0.01
    """entropy weight added at zero measured entropy; it falls linearly to 0 at entropy_target"""


def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """VM-AV-GRPO advantages [B]. Over the format-valid members V of each prompt group:
    mu_valid = (sum_{j in V} R_j + alpha) / (|V| + alpha + beta), sigma_valid = sqrt(mu_valid (1 - mu_valid));
    valid i: A_i = (R_i - mu_valid) / max(sigma_valid, sigma_floor), and where A_i < 0 it is divided by
    L_rel = clip(L_i / mean_{j in V} L_j, len_ratio_min, len_ratio_max); invalid i: A_i = invalid_advantage.
    mu_valid (1 - mu_valid) below 0 (rewards outside [0, 1]) counts as 0; the mean valid length is
    floored at one token."""
    scores = batch.rewards.to(torch.float32)
    valid = batch.valid.to(torch.bool)
    vstats = group_stats(scores, batch.group, mask=valid)
    mu = (vstats.sum + cfg.alpha) / (vstats.count + cfg.alpha + cfg.beta)
    sigma = (mu * (1.0 - mu)).clamp(min=0.0).sqrt()
    adv = (scores - mu) / sigma.clamp(min=cfg.sigma_floor)
    lengths = batch.lengths.to(torch.float32)
    mean_len = group_stats(lengths, batch.group, mask=valid).mean.clamp(min=1.0)
    l_rel = (lengths / mean_len).clamp(cfg.len_ratio_min, cfg.len_ratio_max)
    adv = torch.where(adv < 0, adv / l_rel, adv)
    return torch.where(valid, adv, torch.full_like(adv, cfg.invalid_advantage))


def entropy_coefficient(
    cfg: Hyperparameters, state: TrainingState | None, measured_entropy: float
) -> float:
    """Adaptive entropy control: entropy_coef + entropy_coef_max * clip((H* - H) / H*, 0, 1), with H the
    measured mean token entropy and H* = entropy_target: an entropy bonus only while H is below H*,
    growing as H falls."""
    shortfall = (cfg.entropy_target - measured_entropy) / cfg.entropy_target
    return cfg.entropy_coef + cfg.entropy_coef_max * min(max(shortfall, 0.0), 1.0)
