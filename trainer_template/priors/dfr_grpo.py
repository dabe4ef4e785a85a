"""DFR-GRPO (decoupled format / reasoning streams, POISE appendix), an edit over the root algorithm.py:
card in dfr_grpo.md."""


@dataclass
class Hyperparameters:
    eps: float = 1e-6
    """numerical floor added to the stds"""
    format_weight: float = 0.5
    """weight lambda_fmt of the format stream (the paper gives no value)"""
    fail_entropy_weight: float = 0.1
    """scale of the entropy signal that is the reasoning stream of all-fail groups (the paper gives none)"""
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
    """DFR-GRPO advantages [B]: A_i = A_reason_i + format_weight * A_format_i, per prompt group g.
    A_format_i = (v_i - mean_g v) / (std_g v + eps), v_i = 1[format-valid] (population std).
    A_reason over the valid members V of g (0 for invalid i), c_i = 1[correct_i]:
      groups with a correct member: (c_i - mean_V c) / (std_V c + eps);
      all-fail groups: fail_entropy_weight * (H_i - mean_V H) / (std_V H + eps), a zero-centred signal
      from the response's mean token entropy H_i (``batch.token_entropy``, required)."""
    if batch.token_entropy is None:
        raise ValueError(
            "DFR-GRPO needs RolloutBatch.token_entropy (each response's mean token entropy); "
            "the harness passed none"
        )
    valid = batch.valid.to(torch.bool)
    v = valid.to(torch.float32)
    c = (batch.correct.to(torch.bool) & valid).to(torch.float32)
    vs = group_stats(v, batch.group)
    a_format = (v - vs.mean) / (vs.std + cfg.eps)
    cs = group_stats(c, batch.group, mask=valid)
    a_correct = (c - cs.mean) / (cs.std + cfg.eps)
    h = batch.token_entropy.to(torch.float32)
    hs = group_stats(h, batch.group, mask=valid)
    a_entropy = cfg.fail_entropy_weight * (h - hs.mean) / (hs.std + cfg.eps)
    a_reason = torch.where(cs.sum > 0, a_correct, a_entropy)
    a_reason = torch.where(valid, a_reason, torch.zeros_like(a_reason))
    return a_reason + cfg.format_weight * a_format
