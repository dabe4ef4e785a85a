"""Score a model trained with a node's algorithm on a benchmark suite (math6) and record the result.

The evaluators compute (``evaluators.suite.run_benchmark_suite``: generation, grading, pass@k / acc@1, bootstrap
intervals); this module turns that into the node's typed result under ``<suite>/<preset>`` and one
MLflow run with the samples.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import platform
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from engine import secrets
from engine.archive.results import EvaluationResult, Protocol, now
from engine.archive.scoring import (
    SUITE_GRADE_TIMEOUT_S,
    SUITE_SEED,
    SuiteIdentity,
    suite_identity,
)
from engine.archive.tracking import node_run
from engine.errors import EvaluationError
from engine.operators.evaluation_lock import node_evaluation
from engine.operators.reevaluation import replaced_line
from engine.scratch import SUITE_PREFIX, scratch_dir
from evaluators.errors import SuiteError
from evaluators.generation import BACKENDS, OPENAI_TIMEOUT_S, make_backend
from evaluators.grading import GRADER_VERSION
from evaluators.metrics import suite_metric_unit
from evaluators.suite import build_metrics, run_benchmark_suite, suite_metric_names


def suite_protocol(*settings, **named) -> Protocol:
    """The protocol (``<suite>/<preset>`` and the hash of its settings) a suite evaluation with these
    settings (:func:`~engine.archive.scoring.suite_identity`'s) records under, known before anything
    runs: what :func:`evaluate_node_on_suite` records as, and what a verl evaluation's scoring will
    replace. An unknown suite or preset, or a shipped dataset missing or damaged, raises
    EvaluationError."""
    return suite_identity_protocol(suite_identity(*settings, **named))


def suite_identity_protocol(ident: SuiteIdentity) -> Protocol:
    """The typed protocol of a suite evaluation's identity (computed in the archive layer)."""
    return Protocol(ident.id, ident.hash, "suite", ident.preset, ident.settings)


def require_suite_objective(cfg, ident: SuiteIdentity) -> None:
    """EvaluationError when the experiment (``cfg``, the archive's config) ranks by a metric that the
    suite of ``ident`` does not record: its result could not be recorded (``record_result`` refuses
    an evaluated result without the objective), so the evaluation is refused before it runs."""
    measured = suite_metric_names(ident.benchmarks)
    if cfg.experiment.objective not in measured:
        raise EvaluationError(
            f"this experiment ranks by {cfg.experiment.objective!r}, which the "
            f"{ident.id.partition('/')[0]} suite does not measure (it records "
            f"{', '.join(sorted(measured))}); evaluate it in an archive whose "
            "[experiment].objective is one of these"
        )


def evaluate_node_on_suite(
    archive,
    name: str,
    suite: str = "math6",
    generator: str = "transformers",
    model: str | None = None,
    base_url: str | None = None,
    limit: int | None = None,
    *,
    preset: str | None = None,
    seed: int = SUITE_SEED,
    grade_workers: int | None = None,
    grade_timeout_s: float = SUITE_GRADE_TIMEOUT_S,
    n_boot: int = 1000,
    generator_kwargs: dict | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
    on_event: Callable[[str], None] | None = None,
    lock: bool = True,
    training: Mapping[str, Any] | None = None,
) -> EvaluationResult:
    """Score ``model`` (trained with node ``name``'s algorithm) on ``suite``, sampling with the
    ``generator`` (vllm | openai | transformers); record the result on the node (status evaluated |
    failed) and in an MLflow run. ``on_event``: progress lines (the result this one replaces).
    Once the settings are checked, it holds the node's evaluation lock
    (:func:`~engine.operators.evaluation_lock.node_evaluation`): another process evaluating the node
    is an EvaluationError at once, naming it. ``lock=False``: the caller holds it already (the verl
    evaluation, which scores its checkpoint here). ``training``: what training the scored model took
    (the verl evaluation's ``gpus``, ``wall_time_s``, ``mlflow_run_id``), recorded in the result's
    details; its time counts in the result's wall time (the gpu-hours budget charges it)."""
    if generator not in BACKENDS:
        raise EvaluationError(
            f"with --suite, --generator must be one of {', '.join(BACKENDS)} (got {generator!r})"
        )
    if not model:
        raise EvaluationError("a suite evaluation needs --model (a path, or the served model name)")
    if limit is not None and limit < 1:
        raise EvaluationError("--limit must be >= 1")
    if n_boot < 1:  # checked now: the intervals are computed after the whole generation
        raise EvaluationError(f"n_boot (bootstrap replicates) must be >= 1, got {n_boot!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise EvaluationError(f"a suite evaluation's seed must be an integer >= 0, got {seed!r}")
    ident = suite_identity(
        suite, preset, generator, limit=limit, grade_timeout_s=grade_timeout_s, seed=seed
    )
    archive.node(name)  # unknown node: one clear error before anything runs
    require_suite_objective(archive.config(), ident)
    with node_evaluation(archive, name) if lock else nullcontext():
        return _score(
            archive, name, suite_identity_protocol(ident), ident.benchmarks, ident.max_tokens,
            generator, model, base_url, limit, seed,
            grade_workers, grade_timeout_s, n_boot, generator_kwargs, on_progress, on_event,
            dict(training or {}),
        )  # fmt: skip


def _score(
    archive,
    name,
    proto,
    benches,
    max_tokens,
    generator,
    model,
    base_url,
    limit,
    seed,
    grade_workers,
    grade_timeout_s,
    n_boot,
    generator_kwargs,
    on_progress,
    on_event,
    training,
):
    """The suite run of :func:`evaluate_node_on_suite` once its settings are checked (and the node's
    evaluation lock is held): generation, grading, the result recorded on the node and in MLflow."""
    node = archive.node(name)
    cfg = archive.config()
    # the result's wall time: the scoring's, and the training's before it where there was one
    t0 = time.time() - float(training.get("wall_time_s", 0.0))
    kwargs = dict(generator_kwargs or {})
    if generator == "openai" and "http_client" not in kwargs:
        # the SDK's timeout bounds each read: a server trickling its reply would be waited on for ever
        import openai  # lazy: openai is heavy (only this path needs it)

        from engine.operators.llm_deadline import whole_reply_client  # lazy: needs openai

        kwargs["http_client"] = whole_reply_client(
            openai,
            float(kwargs.get("timeout_s", OPENAI_TIMEOUT_S)),
            "the generation backend's timeout_s",
        )
    try:
        gen = make_backend(generator, model, base_url=base_url, **kwargs)
    except SuiteError as exc:
        raise EvaluationError(str(exc)) from None
    details: dict[str, Any] = {
        "generator": generator,
        "model": model,
        "generation": gen.describe(),
        "versions": _versions(),
        **({"training": training} if training else {}),
    }
    base = dict(
        protocol=proto, seeds=(seed,), node_commit=node.commit, utility=cfg.experiment.objective
    )
    replaced = replaced_line(node.results.get(proto.id), proto.hash, (seed,))
    if replaced and on_event is not None:
        on_event(replaced)
    archive.set_status(name, "evaluating")
    try:
        run = run_benchmark_suite(
            gen,
            benches,
            max_tokens,
            limit=limit,
            seed=seed,
            grade_workers=grade_workers,
            grade_timeout_s=grade_timeout_s,
            n_boot=n_boot,
            on_progress=on_progress,
        )
    except (Exception, KeyboardInterrupt) as exc:  # the node must not stay "evaluating"
        details["generation"] = gen.describe()  # as it ran (the API it fell back to)
        reason = str(exc) if isinstance(exc, SuiteError) else f"{type(exc).__name__}: {exc}"
        failed = EvaluationResult(
            **base,
            status="failed",
            reason=reason.rstrip(": ")[:2000],
            wall_time_s=round(time.time() - t0, 3),
            details=details,
            recorded_at=now(),
        )
        archive.record_result(name, failed)
        if isinstance(exc, SuiteError):
            return failed
        raise
    finally:
        gen.close()
    details["generation"] = gen.describe()  # as it ran (the API it fell back to)
    result = _result(base, run, details, t0)
    try:  # the scores are recorded on the node even when the tracking store is unreachable
        run_ids = (_log_mlflow(archive, name, result, run["samples"]),)
    except Exception as exc:  # noqa: BLE001
        run_ids = ()
        details["mlflow_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    result = EvaluationResult(**{**_fields(result), "mlflow_run_ids": run_ids, "details": details})
    archive.record_result(name, result)
    return result


def _result(base: dict, run: dict, details: dict, t0: float) -> EvaluationResult:
    metrics = build_metrics(run)
    details["counts"] = {
        k: {
            "problems": r["problems"],
            "samples": r["samples"],
            **{f"grader_{s}": c for s, c in r["grader_failures"].items()},
        }
        for k, r in run["benchmarks"].items()
    }
    details["grader"] = {
        "version": GRADER_VERSION,
        "restarts": run["grader_restarts"],
        "python": platform.python_version(),
    }
    return EvaluationResult(
        **base,
        status="evaluated",
        metrics=metrics,
        units={k: suite_metric_unit(k) for k in metrics},
        intervals={k: (float(lo), float(hi)) for k, (lo, hi) in run["intervals"].items()},
        interval_kind="95% bootstrap over problems",
        wall_time_s=round(time.time() - t0, 3),
        details=details,
        recorded_at=now(),
    )


def _fields(r: EvaluationResult) -> dict[str, Any]:
    return {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}


def _versions() -> dict[str, str]:
    out = {"grader": GRADER_VERSION}
    for pkg in ("poise-git", "math-verify", "transformers", "vllm", "openai", "torch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def _log_mlflow(archive, name: str, result: EvaluationResult, samples: list[dict]) -> str:
    import mlflow  # lazy: mlflow is heavy (only this path needs it)

    proto = result.protocol
    suite = proto.settings["suite"]
    tags = {
        "poise.eval": "suite",
        "poise.suite": suite,
        "poise.backend": result.details["generator"],
        "poise.protocol": proto.id,
        "poise.protocol_hash": proto.hash,
        "poise.grader": GRADER_VERSION,
    }
    with node_run(archive, name, run_name=f"{name}:{suite}", tags=tags) as run:
        mlflow.log_params(
            {
                "suite": suite,
                "backend": result.details["generator"],
                "model": result.details["model"],
                "preset": proto.preset,
                "limit": proto.settings["limit"],
                "max_tokens": proto.settings["max_tokens"],
                "grader_version": GRADER_VERSION,
            }
        )
        mlflow.log_metrics({f"eval/{k}": float(v) for k, v in result.metrics.items()})
        for k, (lo, hi) in result.intervals.items():
            mlflow.log_metrics({f"eval/{k}/ci_low": lo, f"eval/{k}/ci_high": hi})
        with scratch_dir(SUITE_PREFIX) as d:  # named: gc finds it if the process is killed
            p = Path(d) / "samples.jsonl.gz"
            with gzip.open(p, "wt", encoding="utf-8") as f:
                for s in samples:
                    f.write(secrets.scrub(json.dumps(s, ensure_ascii=False)) + "\n")
            mlflow.log_artifact(str(p), artifact_path="suite")
            results = json.dumps(result.to_dict(), indent=1, sort_keys=True)
            mlflow.log_text(secrets.scrub(results), "suite/results.json")
        return run.info.run_id
