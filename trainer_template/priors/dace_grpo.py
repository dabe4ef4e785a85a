"""DACE-GRPO (difficulty-aware compression, POISE appendix: a length-compression success), an edit over
the root algorithm.py: card in dace_grpo.md."""


@dataclass
class Hyperparameters:
    eps: float = 1e-6
    """numerical floor added to the group std"""
    norm_adv_by_std: bool = True
    """divide by the group std (False gives Dr.GRPO's centred advantage)"""
    alpha: float = 0.5
    """difficulty weight alpha of the accuracy advantage (the paper gives no value)"""
    beta: float = 0.5
    """weight beta of the efficiency advantage (the paper gives no value)"""
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
    entropy_target_start: float = 0.3
    """annealed entropy target H_target at progress 0 (nats per token)"""
    entropy_target_end: float = 0.1
    """annealed entropy target at progress 1 (> 0)"""
    entropy_coef_max: float = 0.01
    """entropy weight added at zero measured entropy; it falls linearly to 0 at H_target(t)"""


def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """DACE-GRPO advantages [B], per prompt group g:
    A_acc = the root's GRPO advantage (grpo_advantages); PassRate_g = mean_g 1[R_j > 0.5];
    A_eff_i = (mean_C L - L_i) / (std_C L + eps): the negative length z-scored over the group's correct
    subset C (population std), 0 where |C| < 2;
    A_i = A_acc_i (1 + alpha (1 - PassRate_g)) + beta A_eff_i PassRate_g 1[correct_i]."""
    a_acc = grpo_advantages(batch, cfg)
    scores = batch.rewards.to(torch.float32)
    pass_rate = group_stats((scores > 0.5).to(torch.float32), batch.group).mean
    correct = batch.correct.to(torch.bool)
    lengths = batch.lengths.to(torch.float32)
    ls = group_stats(lengths, batch.group, mask=correct)
    a_eff = torch.where(
        ls.count >= 2, (ls.mean - lengths) / (ls.std + cfg.eps), torch.zeros_like(lengths)
    )
    a_eff = torch.where(correct, a_eff, torch.zeros_like(a_eff))
    return a_acc * (1.0 + cfg.alpha * (1.0 - pass_rate)) + cfg.beta * a_eff * pass_rate


def entropy_coefficient(
    cfg: Hyperparameters, state: TrainingState | None, measured_entropy: float
) -> float:
    """Annealed entropy target: H_target(t) = start + (end - start) t, t the training progress (0 without
    a state); entropy_coef + entropy_coef_max * clip((H_target(t) - H) / H_target(t), 0, 1) with H the
    measured mean token entropy: exploration early (high target), consolidation late (low target)."""
    t = state.progress if state is not None else 0.0
    target = cfg.entropy_target_start + (cfg.entropy_target_end - cfg.entropy_target_start) * t
    shortfall = (target - measured_entropy) / target
    return cfg.entropy_coef + cfg.entropy_coef_max * min(max(shortfall, 0.0), 1.0)
