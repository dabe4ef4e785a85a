"""RLOO (Kool et al. 2019; Ahmadian et al. 2024), an edit over the root algorithm.py: card in rloo.md.

A_i = r_i - mean of the other members of i's group (0 baseline for a singleton), as verl's
``compute_rloo_outcome_advantage``; the root's loss and hyperparameters are kept.
"""


def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """Leave-one-out advantages [B]: each reward minus the mean of the other rewards of its group."""
    scores = batch.rewards.to(torch.float32)
    stats = group_stats(scores, batch.group)
    return scores - stats.loo_mean
