"""Where the proxy's paired noise comes from: the evaluation's sampling, its prompt set, or training.

    nice -n 5 .venv/bin/python benchmarks/bench_eval_noise.py [--mechanisms grpo,dace_grpo,sa_grpo] \\
        [--seeds 4] [--eval-seeds 3] [--big-prompts 256] [--big-samples 64]

Each published mechanism (``trainer_template.priors``, trusted code: trained in a worker process of
this script, not in the sandbox) is RL-trained once per paired seed on the ``--preset`` protocol;
the trained policy is then scored (a) by the protocol's own evaluation at the run's seed, exactly
as every result records it, (b) by the same evaluation at ``--eval-seeds - 1`` further sampling
seeds (same prompts, other samples) and (c) by a large evaluation (``--big-prompts`` held-out
prompts per split, ``--big-samples`` samples each). Prints, against GRPO at the same seeds:

1. the evaluation's own sampling noise: the SD of Overall over eval seeds of one trained policy;
2. each mechanism's paired difference to GRPO, its seed-to-seed SD and 95% interval, under the
   protocol's evaluation, under the mean of the eval seeds (sampling noise averaged out) and under
   the large evaluation (sampling noise and the small prompt set's idiosyncrasies averaged out).

What is left of the paired SD under (c) is training noise, which only more seeds (or a task with
more headroom) can beat. Writes every figure as JSON (``--json``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from proxy_runs import ROOT, fmt_iv, load_average, stamp, write_results

from engine.stats import paired_interval

EVALS = ("protocol", "eval_mean", "large")


def train_and_score(mech: str, seed: int, preset: str, eval_seeds: int, big: tuple[int, int]):
    """One seed of one mechanism: Overall under every evaluation (a row of the JSON)."""
    from engine.archive.edit import prior_source
    from trainer_template.proxy import evalset
    from trainer_template.proxy.protocol import get_protocol
    from trainer_template.proxy.worker import train_policy

    protocol = get_protocol(preset)
    t0 = time.monotonic()
    model, stopped = train_policy(protocol, prior_source(mech), mech, seed)
    # eval seed 0 is the protocol's own (10_000 + seed): the Overall every result records
    by_eval_seed = [
        evalset.evaluate(model, protocol.eval, seed + 1000 * e, protocol.task)["overall"]
        for e in range(eval_seeds)
    ]
    large = replace(protocol.eval, prompts_per_split=big[0], samples=big[1])
    return {
        "mechanism": mech,
        "seed": seed,
        "by_eval_seed": by_eval_seed,
        "protocol": by_eval_seed[0],
        "eval_mean": sum(by_eval_seed) / len(by_eval_seed),
        "large": evalset.evaluate(model, large, seed, protocol.task)["overall"],
        "stopped": stopped,
        "wall_s": round(time.monotonic() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mechanisms", default="grpo,dace_grpo,sa_grpo", help="GRPO always runs")
    ap.add_argument("--seeds", type=int, default=4, help="paired RL seeds 0..S-1")
    ap.add_argument("--eval-seeds", type=int, default=3, help="sampling seeds of the evaluation")
    ap.add_argument("--big-prompts", type=int, default=256, help="large evaluation: prompts/split")
    ap.add_argument("--big-samples", type=int, default=64, help="large evaluation: samples/prompt")
    ap.add_argument("--preset", default="default")
    ap.add_argument("--parallel", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--json", default=str(ROOT / "benchmarks" / "results" / "eval-noise.json"), help="output"
    )
    args = ap.parse_args()
    if args.eval_seeds < 2:
        sys.exit("--eval-seeds must be at least 2 (the sampling noise needs two evaluations)")
    mechs = ["grpo"] + [m for m in args.mechanisms.split(",") if m and m != "grpo"]
    jobs = [(m, s) for m in mechs for s in range(args.seeds)]
    t0, loads = time.monotonic(), [load_average()]
    print(
        f"{stamp()} {len(mechs)} mechanisms x {args.seeds} seeds, {args.eval_seeds} eval seeds, "
        f"large evaluation {args.big_prompts} prompts x {args.big_samples} samples; "
        f"load average {loads[0]}",
        flush=True,
    )
    rows: list[dict] = []
    with ProcessPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        futures = [
            pool.submit(
                train_and_score,
                m,
                s,
                args.preset,
                args.eval_seeds,
                (args.big_prompts, args.big_samples),
            )
            for m, s in jobs
        ]
        for fut in futures:
            r = fut.result()
            rows.append(r)
            print(
                f"  {r['mechanism']:>12} seed {r['seed']}: protocol {r['protocol']:.3f}, eval seeds "
                f"{' '.join(f'{x:.3f}' for x in r['by_eval_seed'])}, large {r['large']:.3f} "
                f"({r['wall_s']:.0f} s)",
                flush=True,
            )
    loads.append(load_average())
    sampling_sd = statistics.mean(statistics.stdev(r["by_eval_seed"]) for r in rows)
    print(f"\n1. evaluation sampling noise: SD of Overall over eval seeds {sampling_sd:.4f}")
    print("\n2. paired difference to GRPO (mean, 95% interval; SD over seeds)\n")
    print("| mechanism | " + " | ".join(EVALS) + " |")
    print("|---" * (len(EVALS) + 1) + "|")
    grpo = {r["seed"]: r for r in rows if r["mechanism"] == "grpo"}
    diffs: dict[str, dict] = {}
    for m in mechs[1:]:
        mine = {r["seed"]: r for r in rows if r["mechanism"] == m}
        cells = []
        for ev in EVALS:
            a = {s: r[ev] for s, r in mine.items()}
            b = {s: grpo[s][ev] for s in mine if s in grpo}
            d = [a[s] - b[s] for s in b]
            res = paired_interval(a, b)
            mean, iv = (res[0], res[1]) if res else (float("nan"), None)
            sd = statistics.stdev(d) if len(d) > 1 else float("nan")
            diffs.setdefault(m, {})[ev] = {"diff": mean, "interval": iv, "sd": sd}
            cells.append(f"{mean:+.3f} {fmt_iv(iv, signed=True)}; SD {sd:.3f}")
        print(f"| {m} | " + " | ".join(cells) + " |")
    wall = time.monotonic() - t0
    print(f"\nwall time {wall / 60:.1f} min; load average at start {loads[0]}, at end {loads[1]}")
    out = write_results(
        args.json,
        args,
        "Overall (fraction); paired differences to GRPO over RL seeds, 95% Student-t",
        rows=rows,
        sampling_sd=sampling_sd,
        paired=diffs,
        wall_s=round(wall, 1),
        load_average=loads,
    )
    print(f"written {out}")


if __name__ == "__main__":
    main()
