"""Score a verl-smoke checkpoint on the math6 suite and record the smoke's result on the node.

The result carries the protocol id ``verl-smoke`` (with the hash of its settings), so nothing ranks it
against proxy or paper-protocol results: its numbers check that the pipeline runs, they measure
nothing about the mechanism.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from trainer_template.verl_backend.smoke import PROTOCOL_ID

SUITE, SUITE_PRESET = "math6", "smoke"


def protocol_of(run) -> dict[str, Any]:
    """The smoke's protocol description (settings, model spec, reward, verl version) and its hash."""
    from importlib.metadata import PackageNotFoundError, version

    from trainer_template.verl_backend import tiny_model

    try:
        verl_version = version("verl")
    except PackageNotFoundError:  # pragma: no cover - the run needed it
        verl_version = "unknown"
    proto = {
        **run.protocol,
        "model": {"spec": tiny_model.SPEC, "vocab": tiny_model.VOCAB, "init": "random (seeded)"},
        "reward": "trainer_template.verl_backend.reward.compute_smoke_score",
        "verl": verl_version,
    }
    digest = hashlib.sha256(json.dumps(proto, sort_keys=True).encode()).hexdigest()
    return {**proto, "id": PROTOCOL_ID, "hash": digest}


def evaluate_checkpoint(checkpoint: str, *, limit: int = 2, seed: int = 0) -> dict[str, Any]:
    """math6 under the suite's smoke preset on ``limit`` problems per benchmark with the transformers
    backend: metrics (percentage points), intervals, counts."""
    from evaluators.benchmarks import suite as suite_spec
    from evaluators.generation import make_backend
    from evaluators.suite import build_metrics, run_suite

    benches, max_tokens = suite_spec(SUITE, SUITE_PRESET)
    gen = make_backend("transformers", checkpoint)
    t0 = time.time()
    try:
        out = run_suite(
            gen, benches, max_tokens, limit=limit, seed=seed, n_boot=200, show_progress=False
        )
    finally:
        gen.close()
    return {
        "suite": SUITE,
        "preset": SUITE_PRESET,
        "limit": limit,
        "max_tokens": max_tokens,
        "metrics": build_metrics(out),
        "intervals": out["intervals"],
        "counts": {
            k: {"problems": r["problems"], "samples": r["samples"]}
            for k, r in out["benchmarks"].items()
        },
        "wall_time_s": round(time.time() - t0, 3),
    }


def _trajectory(steps: list[dict]) -> dict[str, list]:
    keys = sorted({k for r in steps for k in r.get("metrics", {}) if k.startswith("train/")})
    out: dict[str, list] = {"step": [r["step"] for r in steps]}
    for k in keys:
        out[k] = [r["metrics"].get(k) for r in steps]
    return out


def smoke_payload(run, evaluation: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON-able result of one smoke (training summary, with the suite's scores when given)."""
    metrics = {k: float(v) for k, v in run.final_metrics().items()}
    units = {"train/*": "the last verl step's value (per-token or per-response means)"}
    if evaluation is not None:
        metrics.update({f"math6/{k}": float(v) for k, v in evaluation["metrics"].items()})
        units["math6/*"] = "percentage points (lengths in words)"
    return {
        "protocol": protocol_of(run),
        "preset": "smoke",
        "status": "trained" if run.ok else "failed",
        "reason": run.reason,
        "seeds": [run.protocol["seed"]],
        "units": units,
        "metrics": metrics if run.ok else {},
        "trajectory": _trajectory(run.steps),
        "step_times_s": run.step_times,
        "checkpoint": run.checkpoint,
        "evaluation": evaluation,
        "mlflow_run_ids": [run.run_id],
        "wall_time_s": round(run.wall_time_s, 3),
    }


def record_smoke(archive, run, evaluation: dict[str, Any] | None = None) -> dict[str, Any]:
    """Record the smoke's result on the node (its own file: proxy and paper results stay as they
    are) and its scores in the smoke's MLflow run; returns the payload."""
    payload = smoke_payload(run, evaluation)
    text = json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n"
    archive.commit_files(
        run.node,
        {f"results/{PROTOCOL_ID}.json": text},
        subject=f"poise: {PROTOCOL_ID} result for {run.node}",
        trailers={"Poise-Event": "results", "Poise-Protocol": PROTOCOL_ID},
    )
    if evaluation is not None:
        _log_evaluation(archive, run.run_id, evaluation)
    return payload


def _log_evaluation(archive, run_id: str, evaluation: dict[str, Any]) -> None:
    import mlflow

    from engine.archive.tracking import set_uri, tracking_uri

    set_uri(tracking_uri(archive.path))
    from mlflow.entities import Metric

    stamp = int(time.time() * 1000)
    metrics = [Metric(f"eval/{k}", float(v), stamp, 0) for k, v in evaluation["metrics"].items()]
    mlflow.MlflowClient().log_batch(run_id, metrics=metrics)
