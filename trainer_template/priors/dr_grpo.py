"""Dr.GRPO (Liu et al. 2025), an edit over the root algorithm.py: card in dr_grpo.md.

A_i = r_i - mean_g(r) (no division by the group std) and ``seq-mean-token-sum-norm`` aggregation
(sum over tokens / a constant T, mean over sequences): only the two defaults change.
"""


@dataclass
class Hyperparameters:
    eps: float = 1e-6
    """numerical floor added to the group std"""
    norm_adv_by_std: bool = False
    """divide by the group std (False gives Dr.GRPO's centred advantage)"""
    clip_ratio_low: float = 0.2
    """PPO clip epsilon below 1"""
    clip_ratio_high: float = 0.2
    """PPO clip epsilon above 1 (DAPO clip-higher raises it)"""
    clip_ratio_c: float = 3.0
    """dual-clip bound for negative advantages (verl's default; must exceed 1)"""
    loss_agg_mode: str = "seq-mean-token-sum-norm"
    """token-mean | seq-mean-token-mean | seq-mean-token-sum-norm"""
    kl_coef: float = 0.001
    """weight of the KL-to-reference loss term (verl's GRPO recipe: 0.001; 0 disables it)"""
    kl_type: str = "low_var_kl"
    """k1 | k2 | k3 | low_var_kl"""
    entropy_coef: float = 0.0
    """weight of the entropy bonus (subtracted from the loss)"""
