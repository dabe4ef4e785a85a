"""CAG-GRPO (cost-form efficiency term, POISE appendix: a length-compression success), an edit over the
root algorithm.py: card in cag_grpo.md."""


@dataclass
class Hyperparameters:
    eps: float = 1e-6
    """numerical floor added to the group std"""
    norm_adv_by_std: bool = True
    """divide by the group std (False gives Dr.GRPO's centred advantage)"""
    beta_base: float = 0.5
    """base weight beta_base of the efficiency cost (the paper gives no value)"""
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
    """CAG-GRPO advantages [B], per prompt group g:
    A_acc = the root's GRPO advantage (grpo_advantages); mu_L = mean length of the group's correct
    subset (floored at one token); A_eff_i = min((mu_L - L_i) / mu_L, 0);
    beta_g = beta_base * SR_g^2, SR_g the group's success rate (mean of 1[correct]);
    A_i = A_acc_i + beta_g A_eff_i 1[correct_i]."""
    a_acc = grpo_advantages(batch, cfg)
    correct = batch.correct.to(torch.bool)
    success_rate = group_stats(correct.to(torch.float32), batch.group).mean
    lengths = batch.lengths.to(torch.float32)
    mu_l = group_stats(lengths, batch.group, mask=correct).mean.clamp(min=1.0)
    a_eff = ((mu_l - lengths) / mu_l).clamp(max=0.0)
    a_eff = torch.where(correct, a_eff, torch.zeros_like(a_eff))
    return a_acc + cfg.beta_base * success_rate.square() * a_eff
