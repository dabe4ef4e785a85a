"""``evaluate_node_on_suite``: generate on a suite's benchmarks, grade in a process pool, score, record.

Per benchmark: pass@k (unbiased, averaged over problems) or acc@1, in percentage points, with a 95%
bootstrap interval over problems; Overall (weighted, see :mod:`evaluators.metrics`) with its interval
from the same replicates; mean length in words. Recorded as the node's results.json and an MLflow run.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from evaluators.benchmarks import Benchmark, file_sha256, load_problems
from evaluators.benchmarks import suite as suite_spec
from evaluators.errors import EvaluationError
from evaluators.generation import BACKENDS, SYSTEM_PROMPT, Sampling, make_backend
from evaluators.grading import GRADER_VERSION
from evaluators.metrics import (
    OVERALL_WEIGHTS,
    bootstrap_intervals,
    mean_length,
    overall,
    pass_at_k,
    word_count,
)


def score_benchmark(
    bench: Benchmark, completions: list[list[str]], grades: list[list]
) -> dict[str, Any]:
    """Per-problem scores (percentage points) and the benchmark's aggregates."""
    per_problem, lengths, valid, failures = [], [], [], {}
    for texts, gs in zip(completions, grades):
        n, c = len(gs), sum(g.correct for g in gs)
        k = min(bench.k, n) if n else 1
        per_problem.append(100.0 * pass_at_k(n, c, k) if n else 0.0)
        lengths += [word_count(t) for t in texts]
        valid += [g.valid for g in gs]
        for g in gs:
            if g.status in ("timeout", "error", "crash"):
                failures[g.status] = failures.get(g.status, 0) + 1
    n_samples = sum(len(gs) for gs in grades)
    return {
        "per_problem": per_problem,
        "score": sum(per_problem) / max(1, len(per_problem)),
        "mean_length": sum(lengths) / max(1, len(lengths)),
        "valid_rate": sum(valid) / max(1, len(valid)),
        "mean_accuracy": 100.0 * sum(g.correct for gs in grades for g in gs) / max(1, n_samples),
        "problems": len(per_problem),
        "samples": n_samples,
        "grader_failures": failures,
    }


def protocol(
    suite: str,
    preset: str,
    benches: tuple[Benchmark, ...],
    max_tokens: int,
    limit: int | None,
    grade_timeout_s: float,
    seed: int,
) -> dict[str, Any]:
    return {
        "suite": suite,
        "preset": preset,
        "limit": limit,
        "max_tokens": max_tokens,
        "seed": seed,
        "prompt": {
            "template": "qwen25-math-cot",
            "system": SYSTEM_PROMPT,
            "chat_template": "the model's, when it has one",
        },
        "benchmarks": {
            b.key: {
                "dataset": b.dataset,
                "metric": b.metric,
                "n": b.n,
                "k": b.k,
                "temperature": b.temperature,
                "sha256": file_sha256(b.dataset),
            }
            for b in benches
        },
        "grader": {"version": GRADER_VERSION, "timeout_s": grade_timeout_s},
        "overall_weights": OVERALL_WEIGHTS,
    }


def run_suite(
    backend,
    benches: tuple[Benchmark, ...],
    max_tokens: int,
    limit: int | None = None,
    seed: int = 0,
    grade_workers: int | None = None,
    grade_timeout_s: float = 10.0,
    n_boot: int = 1000,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Generate, grade and score every benchmark; returns metrics, intervals, counts and samples."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from evaluators.pool import GraderPool

    problems = {b.key: load_problems(b, limit) for b in benches}
    results: dict[str, dict] = {}
    samples: list[dict] = []
    cols = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with (
        Progress(*cols, disable=not show_progress, transient=True) as bar,
        GraderPool(workers=grade_workers, timeout_s=grade_timeout_s) as pool,
    ):
        for b in benches:
            probs = problems[b.key]
            sampling = Sampling(n=b.n, temperature=b.temperature, max_tokens=max_tokens, seed=seed)
            t = bar.add_task(f"generate {b.key}", total=len(probs))
            completions = backend.generate(
                [p.problem for p in probs], sampling, progress=lambda k, t=t: bar.advance(t, k)
            )
            if len(completions) != len(probs):
                raise EvaluationError(
                    f"{backend.name} returned {len(completions)} outputs for {len(probs)} prompts"
                )
            pairs = [(p.gold, text) for p, texts in zip(probs, completions) for text in texts]
            g = bar.add_task(f"grade {b.key}", total=len(pairs))
            flat = pool.grade(pairs, progress=lambda k, g=g: bar.advance(g, k))
            grades, i = [], 0
            for texts in completions:
                grades.append(flat[i : i + len(texts)])
                i += len(texts)
            results[b.key] = score_benchmark(b, completions, grades)
            for p, texts, gs in zip(probs, completions, grades):
                for text, gr in zip(texts, gs):
                    samples.append(
                        {
                            "benchmark": b.key,
                            "index": p.index,
                            "gold": p.gold,
                            "completion": text,
                            "correct": gr.correct,
                            "valid": gr.valid,
                            "status": gr.status,
                        }
                    )
        restarts = pool.restarts
    return {
        "benchmarks": results,
        "samples": samples,
        "grader_restarts": restarts,
        "intervals": bootstrap_intervals(
            {k: r["per_problem"] for k, r in results.items()}, n_boot=n_boot, seed=seed
        ),
    }


def build_metrics(run: dict[str, Any]) -> dict[str, float]:
    res = run["benchmarks"]
    metrics: dict[str, float] = {}
    for key, r in res.items():
        metrics[key] = r["score"]
        metrics[f"{key}/mean_length"] = r["mean_length"]
        metrics[f"{key}/valid_rate"] = r["valid_rate"]
        metrics[f"{key}/mean_accuracy"] = r["mean_accuracy"]
    if all(k in res for k in OVERALL_WEIGHTS):
        metrics["overall"] = overall({k: res[k]["score"] for k in OVERALL_WEIGHTS})
    metrics["mean_length"] = mean_length({k: r["mean_length"] for k, r in res.items()})
    n = sum(r["samples"] for r in res.values())
    metrics["valid_rate"] = sum(r["valid_rate"] * r["samples"] for r in res.values()) / max(1, n)
    metrics["grader_failures"] = float(
        sum(sum(r["grader_failures"].values()) for r in res.values())
    )
    return metrics


def evaluate_node_on_suite(
    archive,
    name: str,
    suite: str = "math6",
    backend: str = "transformers",
    model: str | None = None,
    base_url: str | None = None,
    limit: int | None = None,
    *,
    preset: str | None = None,
    seed: int = 0,
    grade_workers: int | None = None,
    grade_timeout_s: float = 10.0,
    n_boot: int = 1000,
    backend_kwargs: dict | None = None,
    show_progress: bool = True,
) -> dict:
    """Score ``model`` (trained with node ``name``'s algorithm) on ``suite`` and record the results on the
    node (results.json, status evaluated | failed) and in an MLflow run. Returns the payload."""
    import platform

    preset = {None: "paper", "default": "paper"}.get(preset, preset)
    if backend not in BACKENDS:
        raise EvaluationError(
            f"with --suite, --backend must be one of {', '.join(BACKENDS)} (got {backend!r})"
        )
    if not model:
        raise EvaluationError("a suite evaluation needs --model (a path, or the served model name)")
    if limit is not None and limit < 1:
        raise EvaluationError("--limit must be >= 1")
    benches, max_tokens = suite_spec(suite, preset)
    archive.node(name)  # unknown node: one clear error before anything runs
    proto = protocol(suite, preset, benches, max_tokens, limit, grade_timeout_s, seed)
    phash = hashlib.sha256(json.dumps(proto, sort_keys=True).encode()).hexdigest()
    t0 = time.time()
    gen = make_backend(backend, model, base_url=base_url, **(backend_kwargs or {}))
    archive.set_status(name, "evaluating")
    payload: dict[str, Any] = {
        "backend": backend,
        "suite": suite,
        "model": model,
        "generation": gen.describe(),
        "protocol": proto,
        "protocol_hash": phash,
        "versions": _versions(),
    }
    try:
        run = run_suite(
            gen,
            benches,
            max_tokens,
            limit=limit,
            seed=seed,
            grade_workers=grade_workers,
            grade_timeout_s=grade_timeout_s,
            n_boot=n_boot,
            show_progress=show_progress,
        )
    except (
        Exception,
        KeyboardInterrupt,
    ) as exc:  # the node must not stay "evaluating": record, then report
        reason = (
            str(exc)
            if isinstance(exc, EvaluationError)
            else f"{type(exc).__name__}: {exc}".rstrip(": ")
        )
        payload.update(
            status="failed",
            reason=reason[:2000],
            metrics={},
            wall_time_s=round(time.time() - t0, 3),
        )
        archive.record_results(name, payload, status="failed")
        if isinstance(exc, EvaluationError):
            return payload
        raise
    finally:
        gen.close()
    metrics = build_metrics(run)
    counts = {
        k: {
            "problems": r["problems"],
            "samples": r["samples"],
            **{f"grader_{s}": c for s, c in r["grader_failures"].items()},
        }
        for k, r in run["benchmarks"].items()
    }
    payload.update(
        status="evaluated",
        metrics=metrics,
        intervals=run["intervals"],
        counts=counts,
        grader={
            "version": GRADER_VERSION,
            "restarts": run["grader_restarts"],
            "python": platform.python_version(),
        },
        wall_time_s=round(time.time() - t0, 3),
    )
    try:  # the scores are recorded on the node even when the tracking store is unreachable
        payload["mlflow_run_ids"] = [_log_mlflow(archive, name, payload, run["samples"])]
    except Exception as exc:  # noqa: BLE001
        payload["mlflow_run_ids"] = []
        payload["mlflow_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    archive.record_results(name, payload, status="evaluated")
    return payload


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"grader": GRADER_VERSION}
    for pkg in ("poise-git", "math-verify", "transformers", "vllm", "openai", "torch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def _log_mlflow(archive, name: str, payload: dict, samples: list[dict]) -> str:
    import gzip
    import tempfile
    from pathlib import Path

    import mlflow

    from engine.archive.tracking import node_run

    tags = {
        "poise.eval": "suite",
        "poise.suite": payload["suite"],
        "poise.backend": payload["backend"],
        "poise.protocol_hash": payload["protocol_hash"],
        "poise.grader": GRADER_VERSION,
    }
    with node_run(archive, name, run_name=f"{name}:{payload['suite']}", tags=tags) as run:
        mlflow.log_params(
            {
                "suite": payload["suite"],
                "backend": payload["backend"],
                "model": payload["model"],
                "preset": payload["protocol"]["preset"],
                "limit": payload["protocol"]["limit"],
                "max_tokens": payload["protocol"]["max_tokens"],
                "grader_version": GRADER_VERSION,
            }
        )
        mlflow.log_metrics({f"eval/{k}": float(v) for k, v in payload["metrics"].items()})
        for k, (lo, hi) in payload["intervals"].items():
            mlflow.log_metrics({f"eval/{k}/ci_low": lo, f"eval/{k}/ci_high": hi})
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "samples.jsonl.gz"
            with gzip.open(p, "wt", encoding="utf-8") as f:
                for s in samples:
                    f.write(json.dumps(s, ensure_ascii=False) + "\n")
            mlflow.log_artifact(str(p), artifact_path="suite")
            mlflow.log_dict(
                {k: v for k, v in payload.items() if k != "mlflow_run_ids"}, "suite/results.json"
            )
        return run.info.run_id
