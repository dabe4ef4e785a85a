"""``run_benchmark_suite``: generate on a suite's benchmarks, grade in a process pool, score.

Per benchmark: pass@k (unbiased, averaged over problems) or acc@1, in percentage points, with a 95%
bootstrap interval over problems; Overall (weighted, see :mod:`evaluators.metrics`) with its interval
from the same replicates; mean length in words. The engine records it on a node
(``engine.operators.evaluate_suite``); this module knows nothing of archives.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from typing import Any

from evaluators.benchmarks import Benchmark, file_sha256, load_problems
from evaluators.errors import SuiteError
from evaluators.generation import SYSTEM_PROMPT, Sampling
from evaluators.grading import GRADER_VERSION
from evaluators.metrics import (
    MATH6_WEIGHTS,
    bootstrap_intervals,
    math6_overall,
    mean_length,
    pass_at_k,
    word_count,
)
from evaluators.pool import GraderPool

log = logging.getLogger(__name__)


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
    generator: str,
) -> dict[str, Any]:
    """The suite's protocol settings, hashed into its identity. ``generator`` (vllm | openai |
    transformers) is part of it: two engines sample differently from one model and seed, so their
    results are never ranked or paired together."""
    return {
        "suite": suite,
        "preset": preset,
        "generator": generator,
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
        "overall_weights": MATH6_WEIGHTS,
    }


def run_benchmark_suite(
    backend,
    benches: tuple[Benchmark, ...],
    max_tokens: int,
    limit: int | None = None,
    seed: int = 0,
    grade_workers: int | None = None,
    grade_timeout_s: float = 10.0,
    n_boot: int = 1000,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Generate, grade and score every benchmark; returns metrics, intervals, counts and samples.

    ``on_progress(stage, advance, total)`` is called as work completes (stage: ``generate KEY`` or
    ``grade KEY``); the caller renders it."""
    report = on_progress or (lambda _stage, _k, _total: None)
    problems = {b.key: load_problems(b, limit) for b in benches}
    results: dict[str, dict] = {}
    samples: list[dict] = []
    with GraderPool(workers=grade_workers, timeout_s=grade_timeout_s) as pool:
        for b in benches:
            probs = problems[b.key]
            sampling = Sampling(n=b.n, temperature=b.temperature, max_tokens=max_tokens, seed=seed)
            stage = f"generate {b.key}"
            report(stage, 0, len(probs))
            completions = backend.generate(
                [p.problem for p in probs],
                sampling,
                progress=lambda k, st=stage, n=len(probs): report(st, k, n),
            )
            if len(completions) != len(probs):
                raise SuiteError(
                    f"{backend.name} returned {len(completions)} outputs for {len(probs)} prompts"
                )
            want = 1 if sampling.greedy else sampling.n
            got = next((len(texts) for texts in completions if len(texts) != want), None)
            if got is not None:  # fewer samples would score pass@k on them under pass@k's name
                raise SuiteError(
                    f"{backend.name} returned {got} sample(s) for a problem of {b.key}, where the "
                    f"protocol asks {want} (does the server honour `n`?)"
                )
            pairs = [(p.gold, text) for p, texts in zip(probs, completions) for text in texts]
            stage = f"grade {b.key}"
            report(stage, 0, len(pairs))
            flat = pool.grade(pairs, progress=lambda k, st=stage, n=len(pairs): report(st, k, n))
            grades, i = [], 0
            for texts in completions:
                grades.append(flat[i : i + len(texts)])
                i += len(texts)
            results[b.key] = score_benchmark(b, completions, grades)
            log.info(
                "%s: %.2f over %d problem(s) x %d sample(s)",
                b.key,
                results[b.key]["score"],
                len(probs),
                b.n,
            )
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


def suite_metric_names(benches: tuple[Benchmark, ...]) -> set[str]:
    """The names of the metrics :func:`build_metrics` records for a run on ``benches``."""
    names = {"mean_length", "valid_rate", "grader_failures"}
    for b in benches:
        names |= {b.key, f"{b.key}/mean_length", f"{b.key}/valid_rate", f"{b.key}/mean_accuracy"}
    if all(k in names for k in MATH6_WEIGHTS):
        names.add("overall")
    return names


def build_metrics(run: dict[str, Any]) -> dict[str, float]:
    res = run["benchmarks"]
    metrics: dict[str, float] = {}
    for key, r in res.items():
        metrics[key] = r["score"]
        metrics[f"{key}/mean_length"] = r["mean_length"]
        metrics[f"{key}/valid_rate"] = r["valid_rate"]
        metrics[f"{key}/mean_accuracy"] = r["mean_accuracy"]
    if all(k in res for k in MATH6_WEIGHTS):
        metrics["overall"] = math6_overall({k: res[k]["score"] for k in MATH6_WEIGHTS})
    metrics["mean_length"] = mean_length({k: r["mean_length"] for k, r in res.items()})
    n = sum(r["samples"] for r in res.values())
    metrics["valid_rate"] = sum(r["valid_rate"] * r["samples"] for r in res.values()) / max(1, n)
    metrics["grader_failures"] = float(
        sum(sum(r["grader_failures"].values()) for r in res.values())
    )
    return metrics


def protocol_hash(proto: dict[str, Any]) -> str:
    """sha256 of every setting of a suite protocol (datasets by content hash, grader, prompt...)."""
    return "sha256:" + hashlib.sha256(json.dumps(proto, sort_keys=True).encode()).hexdigest()
