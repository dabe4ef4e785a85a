"""Run budgets: candidates, wall time, LLM tokens and cost, accelerator-hours. The loop checks them
before every new candidate and stops cleanly at the first one exhausted, saying which.

Spec syntax (``--budget``, repeatable or comma-separated): ``candidates=20``, ``wall=90m`` (s/m/h/d),
``tokens=2e6``, ``cost=5`` (USD), ``gpu-hours=8``. Accelerator-hours are the evaluations' wall time times
the devices each held: on verl, the training's GPUs over the training's time (``details.training`` of
the result, measured by the engine around the training) and one device per seed over the scoring;
on the CPU proxy every seed process counts as one device.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.errors import ConfigError

_ALIASES = {
    "candidates": "candidates",
    "nodes": "candidates",
    "n": "candidates",
    "wall": "wall_s",
    "time": "wall_s",
    "wall-time": "wall_s",
    "wall_time": "wall_s",
    "tokens": "tokens",
    "llm-tokens": "tokens",
    "cost": "cost_usd",
    "usd": "cost_usd",
    "cost-usd": "cost_usd",
    "gpu-hours": "device_hours",
    "accel-hours": "device_hours",
    "accelerator-hours": "device_hours",
    "device-hours": "device_hours",
    "gpu_hours": "device_hours",
}
_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "": 1}
_LABEL = {
    "candidates": "candidate",
    "wall_s": "wall-time",
    "tokens": "LLM-token",
    "cost_usd": "LLM-cost",
    "device_hours": "accelerator-hour",
}


def parse_duration(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if not m or m.group(2) not in _UNITS:
        raise ConfigError(f"--budget: bad duration {text!r} (e.g. 900, 90s, 30m, 2h)")
    return float(m.group(1)) * _UNITS[m.group(2)]


@dataclass(frozen=True)
class Budget:
    """Limits of one run; None = unlimited."""

    candidates: int | None = None
    wall_s: float | None = None
    tokens: int | None = None
    cost_usd: float | None = None
    device_hours: float | None = None

    @classmethod
    def parse(cls, specs: Iterable[str] | None) -> Budget:
        values: dict[str, float | int] = {}
        for spec in specs or ():
            for part in (p.strip() for p in spec.split(",")):
                if not part:
                    continue
                if "=" not in part:
                    raise ConfigError(
                        f"--budget {part!r}: use KIND=VALUE, KIND one of candidates, wall, tokens, cost, gpu-hours"
                    )
                key, value = (s.strip() for s in part.split("=", 1))
                name = _ALIASES.get(key.lower())
                if name is None:
                    raise ConfigError(
                        f"--budget: unknown kind {key!r} (candidates, wall, tokens, cost, gpu-hours)"
                    )
                try:
                    v: float | int = parse_duration(value) if name == "wall_s" else float(value)
                except ValueError:
                    raise ConfigError(f"--budget {part!r}: {value!r} is not a number") from None
                if v < 0:
                    raise ConfigError(f"--budget {part!r}: must be >= 0")
                values[name] = int(v) if name in ("candidates", "tokens") else v
        return cls(**values)

    @classmethod
    def from_dict(cls, d: dict | None) -> Budget:
        return cls(**{k: v for k, v in (d or {}).items() if k in cls.__dataclass_fields__})

    def merged(self, other: Budget) -> Budget:
        """These limits, with every limit ``other`` sets taking precedence."""
        mine, theirs = asdict(self), asdict(other)
        return Budget(**{k: theirs[k] if theirs[k] is not None else mine[k] for k in mine})

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def describe(self) -> str:
        d = self.to_dict()
        if not d:
            return "no budget limits"
        parts = []
        for k, v in d.items():
            parts.append(f"{_LABEL[k]} {fmt(k, v)}")
        return ", ".join(parts)


def result_device_hours(result: Any, verl_gpus: float) -> float:
    """Accelerator-hours one recorded result (an ``EvaluationResult``) took. A verl evaluation's
    (``details.training``: ``gpus``, ``wall_time_s``): the training's GPUs over its time, and over
    the rest of its wall time (the scoring) the GPUs its vLLM engine spanned per seed (the
    ``tensor_parallel_size`` in ``details.generation``; one where none is recorded). A result under
    a protocol of backend ``verl`` (a failed training an earlier version recorded under verl/paper):
    ``verl_gpus`` over its wall time. Any other: one device per seed."""
    wall = float(result.wall_time_s)
    seeds = len(result.seeds or (1,))
    training = result.details.get("training")
    if isinstance(training, Mapping):
        t = min(wall, _number(training.get("wall_time_s")))
        generation = result.details.get("generation")
        spans = generation.get("tensor_parallel_size") if isinstance(generation, Mapping) else None
        scoring = seeds * max(1.0, _number(spans))
        return (_number(training.get("gpus")) * t + scoring * (wall - t)) / 3600.0
    devices = verl_gpus if result.protocol.backend == "verl" else seeds
    return wall * devices / 3600.0


def _number(v: Any) -> float:
    """``v`` as a number of seconds or devices; 0 where a record holds none."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    return float(v) if ok else 0.0


@dataclass
class RunUsage:
    """What a run has spent so far (across --resume: the archive and the run record hold it)."""

    candidates: int = 0
    wall_s: float = 0.0
    tokens: int = 0
    cost_usd: float = 0.0
    device_hours: float = 0.0
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "candidates": self.candidates,
            "wall_s": round(self.wall_s, 3),
            "tokens": self.tokens,
            "cost_usd": round(self.cost_usd, 6),
            "device_hours": round(self.device_hours, 6),
        }


def fmt(kind: str, v: float) -> str:
    if kind == "wall_s":
        return f"{v / 60:.1f} min" if v >= 120 else f"{v:.0f} s"
    if kind == "cost_usd":
        return f"${v:.2f}"
    if kind == "device_hours":
        return f"{v:.3g} h"
    return f"{int(v)}"


def exhausted(budget: Budget, usage: RunUsage) -> str | None:
    """The reason the first exhausted limit gives, or None while every limit has room left."""
    for kind in ("candidates", "wall_s", "tokens", "cost_usd", "device_hours"):
        limit = getattr(budget, kind)
        if limit is None:
            continue
        used = getattr(usage, kind)
        if used >= limit:
            return f"{_LABEL[kind]} budget exhausted: used {fmt(kind, used)} of {fmt(kind, limit)}"
    return None
