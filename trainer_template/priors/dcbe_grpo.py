"""DCBE-GRPO (relative-length efficiency term with difficulty gating, POISE appendix: a failure case),
an edit over the root algorithm.py: card in dcbe_grpo.md."""


@dataclass
class Hyperparameters:
    eps: float = 1e-6
    """numerical floor added to the group std"""
    norm_adv_by_std: bool = True
    """divide by the group std (False gives Dr.GRPO's centred advantage)"""
    length_coef: float = 0.5
    """weight lambda of the efficiency term (the paper gives no value)"""
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
    """mean token entropy (nats) the dynamic entropy controller steers towards (> 0)"""
    entropy_coef_max: float = 0.01
    """largest entropy weight the controller adds (below the target) or removes (above it)"""


def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """DCBE-GRPO advantages [B], per prompt group g:
    A_acc = the root's GRPO advantage (grpo_advantages); mu_L = mean length of the group's correct subset;
    RLI_i = (mu_L - L_i) / (mu_L + eps); alpha_diff = (N_correct / N_total)^2;
    A_i = A_acc_i + lambda alpha_diff RLI_i 1[correct_i] (lambda = length_coef); no floor, no clip."""
    a_acc = grpo_advantages(batch, cfg)
    correct = batch.correct.to(torch.bool)
    alpha_diff = group_stats(correct.to(torch.float32), batch.group).mean.square()
    lengths = batch.lengths.to(torch.float32)
    mu_l = group_stats(lengths, batch.group, mask=correct).mean
    rli = (mu_l - lengths) / (mu_l + cfg.eps)
    rli = torch.where(correct, rli, torch.zeros_like(rli))
    return a_acc + cfg.length_coef * alpha_diff * rli


def entropy_coefficient(
    cfg: Hyperparameters, state: TrainingState | None, measured_entropy: float
) -> float:
    """Dynamic entropy controller: entropy_coef + entropy_coef_max * clip((H* - H) / H*, -1, 1), H the
    measured mean token entropy, H* = entropy_target: a bonus below the target, a penalty above it."""
    error = (cfg.entropy_target - measured_entropy) / cfg.entropy_target
    return cfg.entropy_coef + cfg.entropy_coef_max * min(max(error, -1.0), 1.0)
