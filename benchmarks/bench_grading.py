"""Grading throughput: the process-pool grader vs single-process math-verify, same pairs, same run.

Pairs: each MATH-500 gold against a completion holding a reformatted copy of it in ``\\boxed{}``
(``\\dfrac`` -> ``\\frac``, ``\\left``/``\\right`` and spaces dropped), graded with the same function
(last-boxed extraction + math-verify, one per-pair bound). The two are timed in interleaved rounds
(alternating which goes first) so that load from other processes on a shared machine hits both
alike. Prints pairs/s of both, the ratio (target >= 1.8x on 2 cores), per-round ratios, the
agreement of the two, the CPU time per pair of both paths (workers' time read with psutil), and the
load average. On a machine shared by several login sessions, Linux's autogroup scheduling gives a
session's processes one fair share *together*, so a pool cannot run faster than that share however
many workers it has; the CPU figures then show whether the pool itself costs anything.

    python benchmarks/bench_grading.py [--workers 2] [--repeat 1] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def reformat(gold: str) -> str:
    s = (
        gold.replace("\\dfrac", "\\frac")
        .replace("\\tfrac", "\\frac")
        .replace("\\left", "")
        .replace("\\right", "")
    )
    return "".join(s.split()) if "\\text" not in s else s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--workers", type=int, default=None, help="pool size (default: the usable cores)"
    )
    ap.add_argument("--repeat", type=int, default=1, help="copies of the 500 pairs")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--timeout", type=float, default=10.0, help="per-pair bound, seconds")
    args = ap.parse_args()

    from evaluators.benchmarks import SUITES, load_problems
    from evaluators.grading import grade_completion
    from evaluators.pool import GraderPool, default_workers

    bench = next(b for b in SUITES["math6"] if b.key == "math500")
    golds = [p.gold for p in load_problems(bench)]
    pairs = [
        (g, f"Simplifying, the final answer is $\\boxed{{{reformat(g)}}}$.") for g in golds
    ] * args.repeat
    workers = args.workers or default_workers()
    load0 = os.getloadavg()
    print(
        f"{len(pairs)} pairs (MATH-500 gold vs reformatted gold), {workers} workers, {args.rounds} interleaved rounds, "
        f"{os.cpu_count()} cores, load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}"
    )

    import psutil

    def cpu(pids):
        return sum(sum(psutil.Process(p).cpu_times()[:2]) for p in pids)

    # both paths warm up on the same 200 pairs that are not measured (OlympiadBench golds)
    olympiad = next(b for b in SUITES["math6"] if b.key == "olympiadbench")
    warm = [(p.gold, f"$\\boxed{{{p.gold}}}$") for p in load_problems(olympiad, 200)]
    for g, c in warm:
        grade_completion(g, c, args.timeout)
    t_cold = time.perf_counter()
    pool = GraderPool(workers=workers, timeout_s=args.timeout).start()
    pool.grade(pairs[: workers * 2])  # every worker has imported math-verify
    t_start = time.perf_counter() - t_cold
    pool.grade(warm)
    single, pooled, t_single, t_pool, ratios = [], [], 0.0, 0.0, []
    c_single = c_workers = c_parent = 0.0
    size = -(-len(pairs) // args.rounds)
    try:
        for r in range(args.rounds):
            part = pairs[r * size : (r + 1) * size]
            times = {}
            for which in ("single", "pool") if r % 2 == 0 else ("pool", "single"):
                t, c0, w0 = time.perf_counter(), time.process_time(), cpu(pool.pids())
                if which == "single":
                    single += [grade_completion(g, c, args.timeout) for g, c in part]
                    c_single += time.process_time() - c0
                else:
                    pooled += pool.grade(part)
                    c_parent += time.process_time() - c0
                    c_workers += cpu(pool.pids()) - w0
                times[which] = time.perf_counter() - t
            t_single += times["single"]
            t_pool += times["pool"]
            ratios.append(times["single"] / times["pool"])
    finally:
        pool.close()
    load1 = os.getloadavg()

    agree = sum(a.correct == b.correct for a, b in zip(single, pooled)) / len(pairs)
    correct = sum(g.correct for g in single) / len(pairs)
    r_single, r_pool = len(pairs) / t_single, len(pairs) / t_pool
    r_cold = len(pairs) / (t_pool + t_start)
    print(f"single process : {r_single:8.1f} pairs/s  ({t_single:.2f} s)")
    print(
        f"pool (warm)    : {r_pool:8.1f} pairs/s  ({t_pool:.2f} s)   "
        f"speed-up {r_pool / r_single:.2f}x (target >= 1.8x on 2 cores)"
    )
    print(
        f"pool (cold)    : {r_cold:8.1f} pairs/s  (+{t_start:.2f} s to start the workers)  "
        f"speed-up {r_cold / r_single:.2f}x"
    )
    print(
        f"per-round speed-ups: {', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f}x)"
    )
    ms = 1000 / len(pairs)
    print(
        f"CPU per pair   : single {c_single * ms:.2f} ms; "
        f"pool {c_workers * ms:.2f} ms in workers + {c_parent * ms:.2f} ms "
        f"in the parent; workers busy {c_workers / t_pool / workers:.0%} of the pool's wall time"
    )
    print(
        f"projected speed-up with {workers} free cores (same CPU per pair, workers 100% busy): "
        f"{workers * c_single / (c_workers + c_parent):.2f}x"
    )
    print(
        f"graded correct : {correct:.1%}; pool/single agreement {agree:.1%}; failures "
        f"{sum(g.status in ('timeout', 'error', 'crash') for g in pooled)}"
    )
    print(
        f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}  (the machine is shared; times are inflated)"
    )


if __name__ == "__main__":
    main()
