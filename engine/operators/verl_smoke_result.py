"""The typed result of a verl smoke (protocol ``verl-smoke``) and the math6 scoring of its checkpoint.

A smoke checks that the pipeline runs; its numbers measure nothing about the mechanism. Its protocol
id ``verl-smoke`` (with a hash of every setting: the smoke's scale, the tiny model's spec, the reward,
the verl version and, for ``evaluate --smoke``, the suite settings) keeps it away from proxy and paper
results: nothing ranks results of different protocols together. ``overall`` is what the experiment's
writer requires of a successful result: the last verl step's mean smoke reward (a fraction) after
``train --smoke``, the math6 smoke Overall (percentage points) after ``evaluate --smoke`` -- two hashes,
two units, never compared. Recording leaves the node's status as it was (a smoke is no evaluation
under the experiment's protocol).
"""

from __future__ import annotations

import hashlib
import json
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from engine.archive.results import EvaluationResult, Protocol, now
from engine.archive.tracking import set_uri, tracking_uri
from engine.errors import EvaluationError
from evaluators.benchmarks import suite as suite_spec
from evaluators.generation import make_backend
from evaluators.metrics import suite_metric_unit
from evaluators.suite import build_metrics, protocol, run_benchmark_suite
from trainer_template.verl_backend import tiny_model
from trainer_template.verl_backend.smoke import PROTOCOL_ID

SUITE, SUITE_PRESET = "math6", "smoke"
OBJECTIVE = "overall"
# units of the trainer's train/* signals (see trainer_template.proxy.rl.SIGNALS)
TRAIN_UNITS = {
    "train/reward_mean": "fraction",
    "train/valid_rate": "fraction",
    "train/correct_rate": "fraction",
    "train/clipfrac": "fraction",
    "train/entropy": "nats",
    "train/response_length": "tokens",
    "train/step_s": "seconds",
}


def check_objective(archive) -> None:
    """The smoke records ``overall``; refuse up front an experiment that ranks by another metric."""
    objective = archive.config().experiment.objective
    if objective != OBJECTIVE:
        raise EvaluationError(
            f"the verl smoke records {OBJECTIVE!r}, but this experiment's objective is "
            f"{objective!r}: run the smoke in an archive with the default objective"
        )


def smoke_protocol(run, evaluation: dict[str, Any] | None = None) -> Protocol:
    """``verl-smoke`` with the hash of its settings (sha256 over sorted JSON)."""
    try:
        verl_version = version("verl")
    except PackageNotFoundError:  # pragma: no cover - the run needed it
        verl_version = "unknown"
    settings = {
        **{k: v for k, v in run.protocol.items() if k != "id"},
        "model": {"spec": tiny_model.SPEC, "vocab": tiny_model.TINY_VOCAB, "init": "seeded random"},
        "reward": "trainer_template.verl_backend.reward.compute_smoke_score",
        "verl": verl_version,
        "evaluation": None if evaluation is None else evaluation["settings"],
    }
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    preset = "train" if evaluation is None else f"train+{SUITE}-{SUITE_PRESET}"
    return Protocol(PROTOCOL_ID, f"sha256:{digest}", "verl", preset, settings)


def evaluate_checkpoint(checkpoint: str, *, limit: int = 2, seed: int = 0) -> dict[str, Any]:
    """math6 under the suite's smoke preset, ``limit`` problems per benchmark, transformers backend:
    ``{"settings", "metrics", "units", "intervals", "counts", "wall_time_s"}``."""
    benches, max_tokens = suite_spec(SUITE, SUITE_PRESET)
    settings = protocol(SUITE, SUITE_PRESET, benches, max_tokens, limit, 10.0, seed, "transformers")
    gen = make_backend("transformers", checkpoint)
    t0 = time.time()
    try:
        out = run_benchmark_suite(gen, benches, max_tokens, limit=limit, seed=seed, n_boot=200)
    finally:
        gen.close()
    metrics = build_metrics(out)
    return {
        "settings": settings,
        "metrics": metrics,
        "units": {k: suite_metric_unit(k) for k in metrics},
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


def smoke_result(
    run, node_commit: str = "", evaluation: dict[str, Any] | None = None
) -> EvaluationResult:
    """The typed result of one smoke (and of the scoring of its checkpoint when given)."""
    proto = smoke_protocol(run, evaluation)
    details: dict[str, Any] = {
        "checkpoint": run.checkpoint,
        "step_times_s": run.step_times,
        "log": run.log,
    }
    common = dict(
        protocol=proto,
        seeds=(int(run.protocol["seed"]),),
        utility=OBJECTIVE,
        trajectory=_trajectory(run.steps),
        mlflow_run_ids=(run.run_id,),
        wall_time_s=round(run.wall_time_s + (evaluation or {}).get("wall_time_s", 0.0), 3),
        node_commit=node_commit,
        recorded_at=now(),
    )
    if not run.ok:
        return EvaluationResult(status="failed", reason=run.reason, details=details, **common)
    metrics = dict(run.final_metrics())
    units = {k: TRAIN_UNITS.get(k, "value") for k in metrics}
    intervals: dict[str, tuple[float, float]] = {}
    if evaluation is None:
        metrics[OBJECTIVE], units[OBJECTIVE] = metrics["train/reward_mean"], "fraction"
        kind = ""
    else:
        for k, v in evaluation["metrics"].items():
            metrics[f"{SUITE}/{k}"], units[f"{SUITE}/{k}"] = float(v), evaluation["units"][k]
        for k, (lo, hi) in evaluation["intervals"].items():
            intervals[f"{SUITE}/{k}"] = (float(lo), float(hi))
        metrics[OBJECTIVE], units[OBJECTIVE] = metrics[f"{SUITE}/overall"], "percent"
        if f"{SUITE}/overall" in intervals:
            intervals[OBJECTIVE] = intervals[f"{SUITE}/overall"]
        kind = "95% bootstrap over problems (math6)"
        details["evaluation"] = {k: evaluation[k] for k in ("counts", "wall_time_s")}
    return EvaluationResult(
        status="evaluated",
        metrics=metrics,
        units=units,
        intervals=intervals,
        interval_kind=kind,
        details=details,
        **common,
    )


def record_smoke(archive, run, evaluation: dict[str, Any] | None = None) -> EvaluationResult:
    """Record the smoke's result through the archive's one writer (``results/verl-smoke.json``, the
    node's status unchanged) and the scores in the smoke's MLflow run; returns the result."""
    node = archive.node(run.node)
    result = smoke_result(run, node.commit, evaluation)
    archive.record_result(run.node, result, status=node.status)
    if evaluation is not None:
        _log_evaluation(archive, run.run_id, evaluation)
    return result


def _log_evaluation(archive, run_id: str, evaluation: dict[str, Any]) -> None:
    import mlflow  # lazy: mlflow is heavy (only this path needs it)
    from mlflow.entities import Metric  # lazy: mlflow is heavy (only this path needs it)

    set_uri(tracking_uri(archive.path))
    stamp = int(time.time() * 1000)
    metrics = [Metric(f"eval/{k}", float(v), stamp, 0) for k, v in evaluation["metrics"].items()]
    mlflow.MlflowClient().log_batch(run_id, metrics=metrics)
