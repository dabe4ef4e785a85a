"""The proxy protocol: every setting that defines an evaluation, its presets, its hash, and Overall.

Overall (higher is better) favours the hard split, as the paper's Overall favours AIME::

    Overall = 0.30 hard/pass@8 + 0.20 hard/pass@1 + 0.10 hard/acc@1
            + 0.15 medium/pass@8 + 0.15 medium/acc@1 + 0.10 easy/acc@1

(pass@k unbiased from n samples at temperature 1; acc@1 greedy). The hard split carries 0.60.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

OVERALL_WEIGHTS = {
    "hard/pass@8": 0.30,
    "hard/pass@1": 0.20,
    "hard/acc@1": 0.10,
    "medium/pass@8": 0.15,
    "medium/acc@1": 0.15,
    "easy/acc@1": 0.10,
}


@dataclass(frozen=True)
class WarmStart:
    """Supervised warm start (built once per settings hash and cached on disk; warmstart.py)."""

    d_model: int = 64
    heads: int = 4
    layers: int = 2
    skill_steps: int = 3000
    """phase 1: the arithmetic (written chains and direct answers over every chain length)"""
    habit_steps: int = 300
    """phase 2: the response-style habits the RL start has"""
    batch: int = 64
    lr: float = 3e-3
    habit_lr: float = 1e-3
    skill_styles: tuple[float, ...] = (0.3, 0.6, 0.1, 0.0)
    """phase 1 P(direct, chain, ramble, give-up), every k"""
    skill_k_power: float = 0.5
    """phase 1 chain lengths: P(k) proportional to k^-skill_k_power (long chains rarer: less skill)"""
    skill_mul_rate: float = 0.25
    """phase 1: probability that an operation multiplies, every k (the habits phase and RL use the
    task's split rates: hard prompts only)"""
    habit_easy: tuple[float, ...] = (0.5, 0.35, 0.1, 0.05)
    """phase 2 P(direct, chain, ramble, give-up) on easy prompts"""
    habit_medium: tuple[float, ...] = (0.5, 0.3, 0.1, 0.1)
    habit_hard: tuple[float, ...] = (0.55, 0.2, 0.05, 0.2)
    filler_max: int = 12
    """a ramble writes 1..filler_max filler tokens before its answer (past the cap: cut off)"""
    seed: int = 1234
    skill_decompose: float = 0.0
    """phase 1: probability that a written multiplication step is decomposed (task.py)"""
    habit_decompose: float = 0.0
    """phase 2: the same, for the habits the RL start has"""


LATER_WARMSTART_FIELDS = ("skill_decompose", "habit_decompose")
"""warm-start settings added after results were recorded: part of a protocol's identity (its
dict, its hash, the warm start's settings hash) only where they differ from their defaults, so every
earlier protocol keeps its hash"""


def warmstart_dict(ws: WarmStart) -> dict:
    """``ws`` as a dict, without the later fields that keep their defaults."""
    return _without_later_defaults(ws, LATER_WARMSTART_FIELDS)


def _without_later_defaults(settings, later: tuple[str, ...]) -> dict:
    """``settings`` (a dataclass) as a dict, without the ``later`` fields that keep their defaults."""
    d = dataclasses.asdict(settings)
    for name in later:
        if d[name] == type(settings).__dataclass_fields__[name].default:
            d.pop(name)
    return d


@dataclass(frozen=True)
class RL:
    steps: int = 100
    prompts: int = 16
    group: int = 8
    minibatches: int = 2
    """updates per step (PPO mini-batches; the second one is off-policy, so clipping matters)"""
    lr: float = 2e-4
    """an aggressive step: GRPO sharpens (entropy and hard pass@8 fall) unless the mechanism keeps it
    exploring; at 5e-5 every published mechanism lands within 0.02 Overall of GRPO (docs/proxy.md)"""
    warmup_steps: int = 10
    """linear learning-rate warm-up (Adam's first steps are otherwise full-size sign steps)"""
    grad_clip: float = 1.0
    temperature: float = 1.0
    k_power: float = 0.0
    """training prompt mix: P(k) proportional to k^-k_power (0: uniform over 1..8)"""
    collapse_window: int = 20
    """steps of the rolling window the collapse check compares with the first window"""
    collapse_ratio: float = 0.2
    """collapsed when the rolling reward (or valid rate) falls below this fraction of the first window's"""
    tail_average: int = 0
    """the policy a run ends with, and is scored on, is the mean of its weights after each of its last
    ``tail_average`` steps (tail averaging); 0: its weights after the last step. A run that stops early
    ends with its weights at that step"""

    def __post_init__(self) -> None:
        if not 0 <= self.tail_average <= self.steps:
            raise ValueError(
                f"rl.tail_average must be in [0, steps = {self.steps}], got {self.tail_average}"
            )


LATER_RL_FIELDS = ("tail_average",)
"""RL settings added after results were recorded: in a protocol's dict and hash only where they
differ from their defaults, so every earlier protocol keeps its hash"""


@dataclass(frozen=True)
class Eval:
    prompts_per_split: int = 64
    samples: int = 16
    """n samples per prompt at temperature 1 for the unbiased pass@k (k = 1, 8)"""
    seed: int = 777
    """held-out prompt sets are fixed by this seed (independent of the run's seed)"""


@dataclass(frozen=True)
class Task:
    """The task the RL run trains on and the evaluation scores (``task.py``). The warm start is built
    on the defaults (``task.MUL_RATE``, ``task.MAX_RESPONSE``), so a variant trains and scores the
    same starting policy on another task; at the defaults it is absent from the protocol's settings
    and hash (results from before the field existed keep their identity)."""

    mul_rate_medium: float = 0.0
    """probability that an operation of a medium prompt (k = 3..5) multiplies"""
    mul_rate_hard: float = 0.3
    """probability that an operation of a hard prompt (k = 6..8) multiplies"""
    max_response: int = 36
    """response cap in tokens (at most the warm start's 36: its position table ends there)"""

    def __post_init__(self) -> None:
        for name in ("mul_rate_medium", "mul_rate_hard"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"task.{name} must be in [0, 1], got {getattr(self, name)}")
        if not 5 <= self.max_response <= 36:
            raise ValueError(
                f"task.max_response must be in [5, 36] (a direct answer takes 5 tokens; the warm "
                f"start's positions end at 36), got {self.max_response}"
            )

    def mul_rate(self, split: str) -> float:
        """The multiplication rate of a split's prompts (easy prompts never multiply)."""
        return {"easy": 0.0, "medium": self.mul_rate_medium, "hard": self.mul_rate_hard}[split]


WARMSTART_SHA256 = "sha256:a13c1a6cb43c0ca95e12121de38360e5f657666af80d90d81c72dae248460792"
"""content hash of the shipped warm start (checkpoints/warmstart-a3556b6cbf685a7d.pt), built from
the default WarmStart settings (torch 2.13, CPU; about 220 CPU-seconds, one thread). tests/test_proxy.py
rebuilds a reduced-size warm start twice bit for bit; the full-size rebuild, compared with this hash,
is an opt-in test (POISE_REBUILD_WARMSTART=1)"""


@dataclass(frozen=True)
class ProxyProtocol:
    preset: str = "default"
    warmstart: WarmStart = field(default_factory=WarmStart)
    rl: RL = field(default_factory=RL)
    eval: Eval = field(default_factory=Eval)
    task: Task = field(default_factory=Task)
    warmstart_sha256: str | None = WARMSTART_SHA256
    """content hash of the warm start's weights (warmstart.content_hash): pinned for a shipped
    checkpoint, so a result can never come from another starting policy unnoticed"""
    accelerator: str = "cpu"
    """cpu | auto (a CUDA GPU when torch sees one, else the CPU); the device used is part of the
    protocol's identity, since the same seed samples differently on another device"""

    def to_dict(self) -> dict:
        """Every setting as JSON types (tuples as lists), as a result stores and reads it back; the
        task only where it differs from the default task (:class:`Task`)."""
        d = dataclasses.asdict(self)
        d["warmstart"] = warmstart_dict(self.warmstart)
        d["rl"] = _without_later_defaults(self.rl, LATER_RL_FIELDS)
        d = json.loads(json.dumps(d))
        if self.task == Task():
            d.pop("task")
        return d

    def device(self) -> str:
        """The torch device this protocol runs on here (imports torch only for ``auto``)."""
        if self.accelerator == "cpu":
            return "cpu"
        import torch  # lazy: torch is heavy (only accelerator = "auto" needs it)

        return "cuda" if torch.cuda.is_available() else "cpu"

    def hash(self, device: str | None = None) -> str:
        """sha256 of what defines the measurement: every setting (the preset's name excluded; the task
        only where it is not the default, see :meth:`to_dict`), the pinned content hash of the warm
        start's weights (checked against the checkpoint actually loaded, warmstart.verify_warmstart)
        and, for ``accelerator = "auto"``, the device used here, or ``device`` (the hash a run on
        that device records, for results measured elsewhere)."""
        if device is not None and self.accelerator == "cpu" and device != "cpu":
            raise ValueError(f"a protocol with accelerator 'cpu' runs on no {device!r}")
        d = self.to_dict()
        d.pop("preset")
        d["accelerator"] = device or self.device()
        return "sha256:" + hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    def warmstart_hash(self) -> str:
        blob = json.dumps(warmstart_dict(self.warmstart), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


PRESETS = {
    "default": ProxyProtocol(),
    "smoke": ProxyProtocol(  # the default warm start (shared checkpoint), a seconds-long RL run and evaluation
        preset="smoke",
        rl=RL(
            steps=30, prompts=16, group=8, minibatches=2, lr=3e-4, k_power=1.0, collapse_window=8
        ),
        eval=Eval(prompts_per_split=12, samples=16),
    ),
    "large": ProxyProtocol(  # the default warm start; a GPU when torch sees one, else many CPU cores
        preset="large",
        rl=RL(prompts=32),
        eval=Eval(prompts_per_split=256, samples=32),
        accelerator="auto",
    ),
    # for tests only: the real code path (warm start, RL steps, held-out scoring) in a second or two;
    # its numbers measure nothing and its protocol id keeps them apart from every other preset's
    "tiny": ProxyProtocol(
        preset="tiny",
        rl=RL(steps=4, prompts=4, group=4, minibatches=1, warmup_steps=1, collapse_window=2),
        eval=Eval(prompts_per_split=4, samples=8),
    ),
}


def get_protocol(preset: str | None = None) -> ProxyProtocol:
    name = preset or "default"
    if name not in PRESETS:
        raise ValueError(f"unknown proxy preset {name!r} (known: {', '.join(PRESETS)})")
    return PRESETS[name]


def overall(metrics: dict[str, float]) -> float:
    return float(sum(w * metrics[k] for k, w in OVERALL_WEIGHTS.items()))


def metric_unit(key: str) -> str:
    """The unit of a proxy metric: lengths in tokens, every rate and pass@k a fraction in [0, 1]."""
    return "tokens" if key.endswith("mean_length") else "fraction"
