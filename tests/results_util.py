"""Test helper: record a typed proxy result on a node from a plain dict (as the old untyped writer took).

``record(archive, node, {"overall": 0.5})`` or ``record(archive, node, {"metrics": {...},
"intervals": {...}, "trajectory": {...}, "mlflow_run_ids": [...], "per_seed": [{"seed": 0, "metrics":
{...}}, ...], "status": "failed", "reason": ...})``
records under ``proxy/<preset>`` at the current proxy protocol hash, so selection, reflection and the
report compare it like a real evaluation."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from engine.archive.results import EvaluationResult, now
from engine.operators.evaluate import proxy_protocol
from trainer_template.proxy.protocol import get_protocol, metric_unit


def proxy_result(payload: Mapping[str, Any], preset: str = "default") -> EvaluationResult:
    nested = isinstance(payload.get("metrics"), Mapping)
    metrics = {k: float(v) for k, v in (payload["metrics"] if nested else payload).items()}
    get = payload.get if nested else (lambda _k, d=None: d)
    status = get("status") or "evaluated"
    return EvaluationResult(
        protocol=proxy_protocol(preset, get_protocol(preset)),
        status=status,
        metrics=metrics,
        units={k: metric_unit(k) for k in metrics},
        intervals={k: (float(a), float(b)) for k, (a, b) in (get("intervals") or {}).items()},
        interval_kind="95% Student-t over seeds" if get("intervals") else "",
        seeds=tuple(get("seeds") or [r["seed"] for r in get("per_seed") or ()] or (0,)),
        reason=get("reason") or ("" if status == "evaluated" else "failed"),
        trajectory=dict(get("trajectory") or {}),
        mlflow_run_ids=tuple(get("mlflow_run_ids") or ()),
        per_seed=tuple(get("per_seed") or ()),
        recorded_at=now(),
    )


def record(archive, node: str, payload: Mapping[str, Any], preset: str = "default", **kw) -> str:
    return archive.record_result(node, proxy_result(payload, preset), **kw)


def per_seed_rows(overall: list[float], tails: list[Mapping[str, float]]) -> list[dict[str, Any]]:
    """Evaluated per-seed rows as an evaluation records them: seed i with Overall ``overall[i]`` and
    each training series' mean over the last third ``tails[i]`` (``trajectory_tail``)."""
    return [
        {"seed": s, "status": "evaluated", "metrics": {"overall": o}, "trajectory_tail": dict(t)}
        for s, (o, t) in enumerate(zip(overall, tails, strict=True))
    ]


COLLAPSE = {
    "step": list(range(9)),
    "train/entropy": [0.75, 0.44, 0.18, 0.17, 0.21, 0.19, 0.08, 0.15, 0.1],
}
"""a recorded trajectory the reflection reads as an entropy collapse"""
ROOT_ENTROPY = [0.10, 0.12, 0.15, 0.11, 0.13, 0.14]
"""the root's per-seed entropy tails in :func:`collapsing_root`"""


def collapsing_root(archive) -> None:
    """Record on the root a 6-seed result whose trajectory collapses, with :data:`ROOT_ENTROPY`."""
    rows = per_seed_rows([0.5] * 6, [{"train/entropy": e} for e in ROOT_ENTROPY])
    record(archive, "grpo", {"metrics": {"overall": 0.5}, "trajectory": COLLAPSE, "per_seed": rows})


def remedied_child(archive, name: str, factor: float, motivation: str = "", **hp) -> None:
    """A child of the root whose code sets ``hp``, evaluated at 6 seeds with a collapsing trajectory
    and the root's per-seed entropy tails times ``factor`` (a list: one per seed)."""
    src = archive.algorithm("grpo")
    for k, v in hp.items():
        src = re.sub(rf"(    {k}: float = )[0-9.e-]+", rf"\g<1>{v}", src, count=1)
    proposal = {"motivation": motivation, "components": None}
    archive.spawn(
        "grpo", name, algorithm=src, files={"records/proposal.json": json.dumps(proposal)}
    )
    factors = factor if isinstance(factor, list) else [factor] * len(ROOT_ENTROPY)
    tails = [{"train/entropy": e * f} for e, f in zip(ROOT_ENTROPY, factors, strict=True)]
    rows = per_seed_rows([0.5] * 6, tails)
    record(archive, name, {"metrics": {"overall": 0.5}, "trajectory": COLLAPSE, "per_seed": rows})


def record_verl_outcome(
    archive, protocol, status: str, node: str = "grpo", **extra
) -> EvaluationResult:
    """A verl evaluation's outcome under ``protocol`` on ``node``, recorded as the evaluation records
    it: a scored checkpoint (``evaluated``, Overall 41.5 percent, seed 0 under a suite protocol) or a
    failed training (its reason)."""
    ok = status == "evaluated"
    result = EvaluationResult(
        protocol=protocol,
        status=status,
        metrics={"overall": 41.5} if ok else {},
        units={"overall": "percent"} if ok else {},
        seeds=(0,) if protocol.backend == "suite" else (),
        reason="" if ok else "verl training failed: exit status 1",
        recorded_at=now(),
        **extra,
    )
    archive.record_result(node, result)
    return result
