"""MSA-GRPO (regime-aware anchor and scaling, POISE appendix), an edit over the root algorithm.py: card
in msa_grpo.md."""


@dataclass
class Hyperparameters:
    eps: float = 1e-6
    """sigma_outcome anchors the scale where it exceeds eps, else sigma_total does"""
    alpha_uniform: float = 0.5
    """scale alpha_uniform of uniform groups' advantages (the paper gives no value)"""
    length_lambda: float = 0.5
    """exponent lambda of the length ratio (the paper gives no value)"""
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
    """MSA-GRPO advantages [B]. Per prompt group g, with c_i = 1[correct_i]:
    sigma_outcome = population std_g(c), sigma_total = population std_g(R),
    sigma_anchor = sigma_outcome if it exceeds eps, else sigma_total (0 when that is at most eps too);
    A_raw = (R_i - mean_g R) / sigma_anchor (0 where sigma_anchor = 0);
    A_scaled = A_raw in mixed groups (correct and incorrect members), alpha_uniform * A_raw in uniform ones;
    ratio_i = L_i / mean_g(L); A_i = A_scaled * ratio_i^lambda if A_scaled > 0, * ratio_i^-lambda if < 0.
    Lengths are floored at one token."""
    scores = batch.rewards.to(torch.float32)
    correct = batch.correct.to(torch.float32)
    rstats = group_stats(scores, batch.group)
    cstats = group_stats(correct, batch.group)
    sigma_outcome, sigma_total = cstats.std, rstats.std
    anchor = torch.where(sigma_outcome > cfg.eps, sigma_outcome, sigma_total)
    anchor = torch.where(anchor > cfg.eps, anchor, torch.zeros_like(anchor))
    centred = scores - rstats.mean
    a_raw = torch.where(anchor > 0, centred / anchor.clamp(min=cfg.eps), torch.zeros_like(scores))
    mixed = (cstats.max > 0) & (cstats.min < 1)
    a_scaled = torch.where(mixed, a_raw, cfg.alpha_uniform * a_raw)
    lengths = batch.lengths.to(torch.float32).clamp(min=1.0)
    ratio = lengths / group_stats(lengths, batch.group).mean
    return torch.where(
        a_scaled > 0,
        a_scaled * ratio.pow(cfg.length_lambda),
        a_scaled * ratio.pow(-cfg.length_lambda),
    )
