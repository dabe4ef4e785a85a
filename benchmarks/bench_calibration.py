"""Calibration of the CPU proxy against the paper: every published mechanism at S paired seeds.

    nice -n 5 .venv/bin/python benchmarks/bench_calibration.py [--seeds 6] [--json OUT]

Prints, and writes as JSON, one row per mechanism: mean Overall with its 95% t-interval, the paired
difference to GRPO (same seeds) with its interval, whether it lies above / below GRPO beyond that
interval, the paper's Overall, mean response length and valid rate; then Spearman's rank correlation
between the proxy's and the paper's Overall over the 11 mechanisms, and the calibration targets
(Spearman >= 0.6; SA-GRPO and DCBE-GRPO below GRPO beyond their intervals; at least 3 of AV, VM-AV,
MSA, DACE, FA above GRPO beyond theirs).

Each mechanism runs with its own default hyperparameters from ``trainer_template/priors`` (the edit
materialized over the root). A run that
collapses is evaluated anyway (its metrics count, as a collapsed training run's would); a seed with no
metrics at all is left out of that mechanism's mean. ``POISE_EVAL_CACHE=DIR`` reuses per-seed results
of identical code under the identical protocol (default: ``.cache/poise-eval`` in the repository).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from proxy_runs import (
    PAPER_OVERALL,
    ROOT,
    calibration_targets,
    fmt_iv,
    load_average,
    mean_interval,
    measured_on,
    mechanism_source,
    paired,
    run_seed,
    stamp,
    verdict,
    warm_start,
)


def summarize(by: dict[str, dict[int, dict]], seeds: list[int]) -> tuple[list[dict], dict]:
    ov = {
        n: {s: r["metrics"]["overall"] for s, r in runs.items() if r.get("metrics")}
        for n, runs in by.items()
    }
    rows = []
    for name in PAPER_OVERALL:
        runs = by.get(name, {})
        vals = ov.get(name, {})
        row = {"mechanism": name, "paper_overall": PAPER_OVERALL[name], "seeds": sorted(vals)}
        row["failed_seeds"] = sorted(s for s, r in runs.items() if r.get("status") != "ok")
        if vals:
            m, iv = mean_interval(list(vals.values()))
            d, div = paired(vals, ov.get("grpo", {})) if name != "grpo" else (0.0, None)
            ms = [r["metrics"] for r in runs.values() if r.get("metrics")]
            row.update(
                overall=m,
                interval=iv,
                diff_vs_grpo=d,
                diff_interval=div,
                verdict=verdict(div) if name != "grpo" else "reference",
                mean_length=sum(x["mean_length"] for x in ms) / len(ms),
                valid_rate=sum(x["valid_rate"] for x in ms) / len(ms),
                hard_pass8=sum(x["hard/pass@8"] for x in ms) / len(ms),
                hard_pass1=sum(x["hard/pass@1"] for x in ms) / len(ms),
            )
        rows.append(row)
    return rows, calibration_targets(rows)


def table(rows: list[dict]) -> str:
    out = [
        "| mechanism | Overall | 95% interval | vs GRPO (paired) | 95% interval | verdict | paper "
        "| mean length | valid rate | hard pass@8 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: -r.get("overall", -1)):
        if "overall" not in r:
            out.append(f"| {r['mechanism']} | - | - | - | - | no results | {r['paper_overall']} |")
            continue
        fails = f" ({len(r['failed_seeds'])} collapsed)" if r["failed_seeds"] else ""
        out.append(
            f"| {r['mechanism']} | {r['overall']:.3f} | {fmt_iv(r['interval'])} | "
            f"{r['diff_vs_grpo']:+.3f} | {fmt_iv(r['diff_interval'], True)} | {r['verdict']}{fails} | "
            f"{r['paper_overall']} | {r['mean_length']:.1f} | {r['valid_rate']:.3f} | "
            f"{r['hard_pass8']:.3f} |"
        )
    return "\n".join(out)


def main() -> None:
    from trainer_template.proxy.protocol import PRESETS, get_protocol

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6, help="paired seeds 0..S-1 (default 6)")
    ap.add_argument(
        "--preset",
        default="default",
        choices=list(PRESETS),
        help="proxy protocol (default: default; tiny and smoke are for tests, their figures mean "
        "nothing)",
    )
    ap.add_argument(
        "--parallel",
        type=int,
        default=os.cpu_count() or 1,
        help="seed runs at a time (default: the CPU count)",
    )
    ap.add_argument(
        "--only",
        default="",
        help=f"comma-separated subset of {', '.join(PAPER_OVERALL)} (GRPO always runs)",
    )
    results = ROOT / "benchmarks" / "results" / "calibration.json"
    ap.add_argument(
        "--json",
        default=str(results),
        help=f"where the JSON goes (default {results.relative_to(ROOT)}, the recorded result)",
    )
    ap.add_argument("--no-cache", action="store_true", help="ignore and do not fill the cache")
    args = ap.parse_args()
    # Ctrl-C stops the run (see below) even where this process was started with SIGINT ignored
    # (a background job of a script, a test runner's worker): Python then leaves it ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    unknown = sorted(set(filter(None, args.only.split(","))) - set(PAPER_OVERALL))
    if unknown:
        ap.error(
            f"--only: unknown mechanism {', '.join(unknown)} (known: {', '.join(PAPER_OVERALL)})"
        )
    if args.seeds < 1 or args.parallel < 1:
        ap.error("--seeds and --parallel must be at least 1")
    os.environ.setdefault("POISE_EVAL_CACHE", str(ROOT / ".cache" / "poise-eval"))

    proto = get_protocol(args.preset)
    t0 = time.monotonic()
    loads = [load_average()]
    _path, sha, device = warm_start(args.preset)
    phash = proto.hash()
    only = set(filter(None, args.only.split(","))) | {"grpo"}
    names = [n for n in PAPER_OVERALL if not args.only or n in only]
    seeds = list(range(args.seeds))
    print(
        f"{stamp()} calibration: preset {args.preset} ({phash[:19]}), warm start {sha[:19]}, "
        f"device {device}; {len(names)} mechanisms x {len(seeds)} paired seeds, "
        f"{args.parallel} in parallel; load average {loads[0]}",
        flush=True,
    )
    sources = {n: mechanism_source(n) for n in names}
    jobs = [(n, s) for s in seeds for n in names]  # seed-major: early results cover every mechanism
    pool = ThreadPoolExecutor(args.parallel)
    futures = [
        pool.submit(run_seed, n, sources[n], s, args.preset, phash, use_cache=not args.no_cache)
        for n, s in jobs
    ]
    try:
        runs = [f.result() for f in futures]
    except KeyboardInterrupt:
        # the queued seed runs are dropped; a seed run that finished stays in the cache, so the
        # same command resumes from it (an interrupted one is not cached: it runs again)
        pool.shutdown(wait=False, cancel_futures=True)
        done = sum(1 for f in futures if f.done() and not f.cancelled() and not f.exception())
        where = (
            "not cached (--no-cache)"
            if args.no_cache
            else f"cached in {os.environ['POISE_EVAL_CACHE']}"
        )
        print(
            f"interrupted: {done} of {len(jobs)} seed runs finished, {where}; nothing written to "
            f"{args.json}; the same command resumes from the cached ones",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(130) from None  # the engine's exit status for an interrupt
    pool.shutdown()
    loads.append(load_average())
    by: dict[str, dict[int, dict]] = {}
    for r in runs:
        by.setdefault(r["label"], {})[r["seed"]] = r
    rows, targets = summarize(by, seeds)
    wall = time.monotonic() - t0
    fresh = [r for r in runs if not r.get("cached")]
    per_seed = [r.get("wall_s", 0.0) for r in fresh]
    print()
    print(table(rows))
    print()
    rho = targets["spearman"]
    print(
        f"Spearman rank correlation, proxy vs paper, over {targets['mechanisms_with_results']} "
        f"mechanisms: {rho:+.3f} (target >= 0.6: {'met' if targets['spearman_met'] else 'NOT met'})"
    )
    print(
        f"regressions below GRPO beyond their interval: {', '.join(targets['regressions_below']) or 'none'}"
        f" (target SA-GRPO and DCBE-GRPO: {'met' if targets['regressions_met'] else 'NOT met'})"
    )
    print(
        f"improvers above GRPO beyond their interval: {', '.join(targets['improvers_above']) or 'none'}"
        f" (target >= 3 of AV, VM-AV, MSA, DACE, FA: {'met' if targets['improvers_met'] else 'NOT met'})"
    )
    mean_seed = sum(per_seed) / len(per_seed) if per_seed else float("nan")
    print(
        f"wall time {wall / 60:.1f} min for {len(runs)} seed runs ({len(fresh)} run, "
        f"{len(runs) - len(fresh)} cached); mean {mean_seed:.0f} s per seed run; load average at "
        f"start {loads[0]}, at end {loads[1]}"
    )
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    # some mechanisms' seed runs differ from machine to machine (docs/calibration.md), and cached
    # runs may come from another one: each seed run names its machine, the table the one they share
    machine, machines = measured_on([r for d in by.values() for r in d.values()])
    payload = {
        "preset": args.preset,
        "protocol_id": f"proxy/{args.preset}",
        "protocol": proto.to_dict(),
        "protocol_hash": phash,
        "warmstart_sha256": sha,
        "device": device,
        "seeds": seeds,
        "unit": "Overall (fraction; the paper's in percentage points)",
        "machine": machine,  # None where they differ or a cached run names none
        "rows_measured_on": machines,
        "intervals": "95% Student-t over the paired seeds (none for a single seed)",
        "rows": rows,
        "targets": {
            k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in targets.items()
        },
        "per_seed": {
            n: {
                s: {
                    "status": r["status"],
                    "metrics": r.get("metrics", {}),
                    "machine": r.get("machine"),
                }
                for s, r in d.items()
            }
            for n, d in by.items()
        },
        "wall_s": round(wall, 1),
        "mean_seed_wall_s": round(mean_seed, 1) if per_seed else None,
        "load_average": loads,
    }
    out.write_text(json.dumps(payload, indent=1, default=str))
    print(f"written {out}")


if __name__ == "__main__":
    main()
