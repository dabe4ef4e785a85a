"""The fixed mechanism interface shared by every candidate (CPU proxy and verl alike).

A candidate's ``algorithm.py`` defines exactly two functions with these signatures::

    compute_advantages(batch: RolloutBatch, cfg) -> Tensor[B]
    policy_loss(log_prob, old_log_prob, advantages, response_mask, cfg,
                ref_log_prob=None, entropy=None, state=None) -> (loss, metrics)

``state`` is a :class:`TrainingState` (training progress and the entropy measured on the batch) that
both harnesses pass, so loss-side controllers (annealed or adaptive entropy terms) need no hidden state.

``cfg`` is an instance of the module's own ``Hyperparameters`` dataclass. This module also provides
the vectorized group statistics and loss utilities every mechanism may use; candidates never edit it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "RolloutBatch",
    "TrainingState",
    "call_policy_loss",
    "GroupStats",
    "group_stats",
    "masked_mean",
    "agg_loss",
    "kl_penalty",
    "ppo_clip_loss",
    "LOSS_AGG_MODES",
    "KL_TYPES",
]

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_TYPES = ("k1", "k2", "k3", "low_var_kl")


@dataclass
class RolloutBatch:
    """B sampled responses, grouped by prompt. All tensors are 1-D of length B on one device.

    rewards:       [B] float   scalar outcome reward of each response (e.g. 1.0 correct, 0.0 not).
    group:         [B] long    prompt-group id; responses to the same prompt share it (any integers).
    valid:         [B] bool    format-valid (a parsable boxed / delimited answer was produced).
    correct:       [B] bool    the extracted answer equals the gold answer.
    lengths:       [B] long    number of response tokens (padding excluded).
    token_entropy: [B] float   mean per-token policy entropy of each response; the harnesses fill it
                               (None only where a harness cannot: a mechanism needing it raises).
    progress:      float       training progress in [0, 1] (for schedules); 0.0 when unknown.

    A harness whose lengths cost a pass over a [B, T] mask may pass ``lengths`` as a function of no
    arguments returning the [B] tensor: it runs on the first read of ``batch.lengths`` (never, for a
    mechanism that does not read it), is checked like an eager value, and is kept for later reads.
    """

    rewards: Tensor
    group: Tensor
    valid: Tensor
    correct: Tensor
    lengths: Tensor | Callable[[], Tensor]
    token_entropy: Tensor | None = None
    progress: float = 0.0

    def __post_init__(self) -> None:
        if self.rewards.dim() != 1:
            raise ValueError(
                f"RolloutBatch.rewards must be 1-D [B], got {tuple(self.rewards.shape)}"
            )
        n = self.rewards.shape[0]
        if callable(self.lengths) and not isinstance(self.lengths, Tensor):
            self.__dict__["_lengths_fn"] = self.__dict__.pop("lengths")  # read through __getattr__
        for name in ("group", "valid", "correct") + (
            () if "_lengths_fn" in self.__dict__ else ("lengths",)
        ):
            _check_1d(name, getattr(self, name), n)
        if self.token_entropy is not None and tuple(self.token_entropy.shape) != (n,):
            raise ValueError(f"RolloutBatch.token_entropy must have shape [{n}]")
        if not 0.0 <= float(self.progress) <= 1.0:
            raise ValueError("RolloutBatch.progress must lie in [0, 1]")

    def __getattr__(self, name: str):
        # Only reached when ``lengths`` is not yet in the instance dict, i.e. given as a function.
        fn = self.__dict__.get("_lengths_fn") if name == "lengths" else None
        if fn is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = fn()
        if not isinstance(value, Tensor):
            raise ValueError(
                f"RolloutBatch.lengths function must return a Tensor, got {type(value).__name__}"
            )
        _check_1d("lengths", value, self.rewards.shape[0])
        del self.__dict__["_lengths_fn"]
        self.__dict__["lengths"] = value
        return value

    @property
    def size(self) -> int:
        return int(self.rewards.shape[0])


@dataclass(frozen=True)
class TrainingState:
    """What the harness knows about training when it calls ``policy_loss`` (same in both harnesses).

    progress:    float in [0, 1]   global step / (total steps - 1); 0.0 when unknown.
    step:        int               the global RL step (0-based).
    total_steps: int               RL steps of the run (0 when unknown).
    entropy:     float | None      mean per-token policy entropy (nats) of this step's responses,
                                   measured by the harness at rollout (None when not measured).
    """

    progress: float = 0.0
    step: int = 0
    total_steps: int = 0
    entropy: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.progress) <= 1.0:
            raise ValueError("TrainingState.progress must lie in [0, 1]")


@functools.lru_cache(maxsize=256)
def _takes_state(fn: Callable) -> bool:
    try:
        return "state" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def call_policy_loss(fn: Callable, *args, state: TrainingState | None = None, **kwargs):
    """Call a mechanism's ``policy_loss``, passing ``state`` when its signature has that parameter
    (mechanisms written before ``state`` existed keep working unchanged)."""
    if _takes_state(fn):
        kwargs["state"] = state
    return fn(*args, **kwargs)


def _check_1d(name: str, t: Tensor, n: int) -> None:
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(f"RolloutBatch.{name} must have shape [{n}], got {tuple(t.shape)}")


class GroupStats:
    """Per-sample views of per-group statistics (every field is [B], gathered at each sample's group).

    count: members of the group that pass the mask (a masked-out member enters no statistic, whatever
    its value, NaN included); sum/mean/var/std over those members (population
    variance, i.e. divided by count; 0 where count < 1); min/max over masked members (0 where none);
    loo_mean: leave-one-out mean of the *other* masked members (the sample itself excluded when it is
    masked in; 0 where no other member exists). ``index`` is the group index [B] in [0, n_slots);
    ``n_groups`` the number of distinct groups. Each statistic is computed on first access only.
    ``row_mean_std()`` gives mean and unbiased std bit-equal to a per-group ``torch.mean`` / ``torch.std``.
    """

    def __init__(self, values: Tensor, index: Tensor, n_slots: int, mask: Tensor):
        self.index = index
        self._values, self._mask, self._mf = values, mask, mask.to(values.dtype)
        # masked-out members read as 0 (not value * 0, which is NaN for a NaN or inf left out)
        self._masked = torch.where(mask, values, torch.zeros_like(values))
        self._zeros = torch.zeros(n_slots, dtype=values.dtype, device=values.device)
        self._count_g = self._zeros.clone().index_add_(0, index, self._mf)
        self._sum_g = self._zeros.clone().index_add_(0, index, self._masked)
        self._mean_g = torch.where(
            self._count_g > 0, self._sum_g / self._count_g.clamp(min=1.0), self._zeros
        )
        self._cache: dict[str, Tensor] = {}

    def _get(self, key: str, fn) -> Tensor:
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]

    @property
    def n_groups(self) -> int:
        return int(torch.unique(self.index).numel())

    @property
    def count(self) -> Tensor:
        return self._get("count", lambda: self._count_g[self.index])

    @property
    def sum(self) -> Tensor:
        return self._get("sum", lambda: self._sum_g[self.index])

    @property
    def mean(self) -> Tensor:
        return self._get("mean", lambda: self._mean_g[self.index])

    @property
    def var(self) -> Tensor:
        def compute() -> Tensor:
            dev = torch.where(self._mask, self._values - self.mean, torch.zeros_like(self._values))
            ss = self._zeros.clone().index_add_(0, self.index, dev * dev)
            return torch.where(self._count_g > 0, ss / self._count_g.clamp(min=1.0), self._zeros)[
                self.index
            ]

        return self._get("var", compute)

    @property
    def std(self) -> Tensor:
        return self._get("std", lambda: self.var.clamp(min=0).sqrt())

    def _extreme(self, reduce: str) -> Tensor:
        big = torch.finfo(self._values.dtype).max
        fill = big if reduce == "amin" else -big
        src = torch.where(self._mask, self._values, torch.full_like(self._values, fill))
        out = self._zeros.clone().fill_(fill).scatter_reduce(0, self.index, src, reduce)
        return torch.where(self._count_g > 0, out, self._zeros)[self.index]

    @property
    def min(self) -> Tensor:
        return self._get("min", lambda: self._extreme("amin"))

    @property
    def max(self) -> Tensor:
        return self._get("max", lambda: self._extreme("amax"))

    @property
    def loo_mean(self) -> Tensor:
        def compute() -> Tensor:
            others = self.count - self._mf
            loo = (self.sum - self._masked) / others.clamp(min=1.0)
            return torch.where(others > 0, loo, torch.zeros_like(self._values))

        return self._get("loo_mean", compute)

    def unbiased_std(self) -> Tensor:
        """Sample standard deviation (divided by count - 1), as torch.std; 0 for count < 2."""
        c = self.count
        var = torch.where(c > 1, self.var * c / (c - 1).clamp(min=1), torch.zeros_like(self.var))
        return var.sqrt()

    def row_mean_std(self) -> tuple[Tensor, Tensor]:
        """(mean, unbiased std) [B] of each group's masked members, bit-equal to ``torch.mean`` /
        ``torch.std`` of each group's members in batch order, i.e. to a per-group loop such as verl's
        ``compute_grpo_outcome_advantage`` (float32 row mean; std as torch computes it for one tensor:
        squared deviations summed in float64). One row reduction per distinct group size (a batch
        whose groups are already contiguous needs no sort); std 0 for count < 2, both 0 where a group
        has no masked member. ``std`` (above) differs in the last bits."""

        def moments(rows: Tensor) -> tuple[Tensor, Tensor]:
            s = rows.shape[1]
            mean = rows.mean(dim=1)
            if s < 2:
                return mean, torch.zeros_like(mean)
            # torch.std of one tensor: squared deviations about the float32 mean summed in float64
            dev = rows.to(torch.float64) - mean.to(torch.float64).unsqueeze(1)
            return mean, (dev.square().sum(dim=1) / (s - 1)).sqrt().to(rows.dtype)

        def compute() -> tuple[Tensor, Tensor]:
            values, n = self._values, self._values.shape[0]
            everyone = bool(self._mask.all())
            # members: the masked-in samples grouped, batch order within a group (None: all, as is)
            members = None if everyone else torch.nonzero(self._mask).reshape(-1)
            keys = self.index if members is None else self.index[members]
            if keys.numel() == 0:
                return values.new_zeros(n), values.new_zeros(n)
            if keys.numel() > 1 and not bool((keys[1:] >= keys[:-1]).all()):
                perm = torch.argsort(keys.to(torch.int32), stable=True)  # batch order within groups
                members = perm if members is None else members[perm]
                keys = keys[perm]
            size = self._count_g[keys].to(torch.long)
            if everyone and bool((size == size[0]).all()):  # one group size: one reshape
                s = int(size[0])
                if members is None:  # groups already contiguous
                    mean, std = moments(values.reshape(-1, s))
                    return mean.repeat_interleave(s), std.repeat_interleave(s)
                mean, std = moments(values[members].reshape(-1, s))
                out_m, out_s = torch.empty_like(values), torch.empty_like(values)
                out_m[members], out_s[members] = mean.repeat_interleave(s), std.repeat_interleave(s)
                return out_m, out_s
            if members is None:
                members = torch.arange(n, device=values.device)
            mean_g, std_g = self._zeros.clone(), self._zeros.clone()
            for s in torch.unique(size).tolist():
                sel = members[size == s]
                slots = self.index[sel[::s]]
                mean_g[slots], std_g[slots] = moments(values[sel].reshape(-1, s))
            return mean_g[self.index], std_g[self.index]

        return self._get("row_mean_std", compute)


def group_stats(values: Tensor, group: Tensor, mask: Tensor | None = None) -> GroupStats:
    """Vectorized group statistics of ``values`` [B] over ``group`` ids [B] (no Python loop over groups).

    ``mask`` [B] bool selects the members that enter the statistics (default: all). Dense non-negative
    ids (< B, as the harnesses pass) index the statistics directly; any other ids go through
    ``torch.unique(return_inverse=True)``. ``index_add_`` / ``scatter_reduce``; O(B).
    """
    values = values.to(torch.float32) if not torch.is_floating_point(values) else values
    n = values.shape[0]
    group = group.reshape(-1)
    if (
        n
        and not torch.is_floating_point(group)
        and bool((group >= 0).all())
        and int(group.max()) < n
    ):
        index, slots = group.to(torch.long), n
    else:
        _, index = torch.unique(group, return_inverse=True)
        slots = max(n, 1)
    m = torch.ones_like(values, dtype=torch.bool) if mask is None else mask.to(torch.bool)
    return GroupStats(values, index, slots, m)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is true (all positions when dim is None)."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def agg_loss(loss_mat: Tensor, loss_mask: Tensor, loss_agg_mode: str) -> Tensor:
    """Aggregate a [B, T] per-token loss to a scalar, with verl's mode names.

    token-mean:              sum(loss * mask) / sum(mask)
    seq-mean-token-mean:     mean_b [ sum_t(loss * mask) / sum_t(mask) ]   (over sequences with tokens)
    seq-mean-token-sum-norm: mean_b [ sum_t(loss * mask) ] / T   (Dr.GRPO; T = the padded response length)

    Sequence means run over sequences with at least one token; equals verl 0.9.1's ``agg_loss`` on one
    data-parallel rank with no global-batch information.
    """
    mask = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        return (loss_mat * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_agg_mode == "seq-mean-token-mean":
        tok = mask.sum(-1)
        seq = (loss_mat * mask).sum(-1) / tok.clamp(min=1.0)
        has = (tok > 0).to(loss_mat.dtype)
        return (seq * has).sum() / has.sum().clamp(min=1.0)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        has = (mask.sum(-1) > 0).to(loss_mat.dtype)
        seq = (loss_mat * mask).sum(-1)
        return (seq * has).sum() / has.sum().clamp(min=1.0) / loss_mat.shape[-1]
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; expected one of {LOSS_AGG_MODES}")


def kl_penalty(log_prob: Tensor, ref_log_prob: Tensor, kl_type: str = "low_var_kl") -> Tensor:
    """Per-token KL estimate between the policy and the reference, [B, T].

    k1: logp - ref; k2: 0.5 (logp - ref)^2; k3 / low_var_kl: exp(d) - d - 1 with d = ref - logp clamped
    to [-20, 20], the result clamped to [-10, 10] (verl treats k3 and low_var_kl identically).
    """
    diff = log_prob - ref_log_prob
    if kl_type == "k1":
        return diff
    if kl_type == "k2":
        return 0.5 * diff.square()
    if kl_type in ("k3", "low_var_kl"):
        kl = ref_log_prob - log_prob
        kl = kl.clamp(min=-20.0, max=20.0)
        return (torch.exp(kl) - kl - 1.0).clamp(min=-10.0, max=10.0)
    raise ValueError(f"unknown kl_type {kl_type!r}; expected one of {KL_TYPES}")


def ppo_clip_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None = 3.0,
) -> tuple[Tensor, Tensor]:
    """Per-token PPO clipped surrogate loss [B, T] and the clipped indicator [B, T] (bool).

    loss = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high)), r = exp(clamp(logp - old_logp, -20, 20));
    for A < 0 the dual clip (Ye et al. 2020) bounds it by -A * c (``clip_ratio_c``; None disables it),
    as verl's ``vanilla`` policy loss does.
    """
    log_ratio = (log_prob - old_log_prob).clamp(min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped = loss2 > loss1
    loss = torch.maximum(loss1, loss2)
    if clip_ratio_c is not None:
        if clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must exceed 1 (dual-clip PPO), got {clip_ratio_c}")
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * clip_ratio_c), loss)
    return loss, clipped
