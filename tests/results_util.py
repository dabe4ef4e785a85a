"""Test helper: record a typed proxy result on a node from a plain dict (as the old untyped writer took).

``record(archive, node, {"overall": 0.5})`` or ``record(archive, node, {"metrics": {...},
"intervals": {...}, "trajectory": {...}, "mlflow_run_ids": [...], "per_seed": [{"seed": 0, "metrics":
{...}}, ...], "status": "failed", "reason": ...})``
records under ``proxy/<preset>`` at the current proxy protocol hash, so selection, reflection and the
report compare it like a real evaluation."""

from __future__ import annotations

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
        interval_kind="95% Student-t over paired seeds" if get("intervals") else "",
        seeds=tuple(get("seeds") or (0,)),
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
