"""How firmly a sweep's ranking of the published mechanisms agrees with the paper's: Spearman's rank
correlation on all paired seeds, on each half of them, and a seed-bootstrap interval.

    .venv/bin/python benchmarks/rank_stability.py benchmarks/results/calibration-large-gpu.rows.jsonl \\
        --variant large-gpu --seeds 15 [--resamples 2000] [--score paper32]

Reads the rows a protocol sweep wrote (``bench_protocol_sweep.py --rows``) and keeps the seeds below
``--seeds`` at which every published mechanism has a run. The bootstrap draws seeds with replacement
(a fixed generator), ranks the mechanisms by their mean Overall over the drawn seeds, and reports the
2.5 and 97.5 percentiles of Spearman and the share of draws that reach the calibration's 0.6. A
correlation over 11 means moves a lot with a few seeds; this says how much. ``--score paper32``
ranks by the paper's weighting, as the sweep's option does.
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

from bench_protocol_sweep import SCORES, read_rows, rescore
from proxy_runs import PAPER_OVERALL, spearman


def complete_seeds(rows: list[dict], mechs: list[str], below: int) -> list[int]:
    have = {(r["mechanism"], r["seed"]) for r in rows}
    seeds = sorted({r["seed"] for r in rows if r["seed"] < below})
    return [s for s in seeds if all((m, s) in have for m in mechs)]


def rank_stability(
    rows: list[dict], seeds: list[int], resamples: int = 2000, seed: int = 0
) -> dict:
    """Spearman with the paper over ``seeds`` (all, each half) and its seed-bootstrap interval."""
    mechs = list(PAPER_OVERALL)
    ov = {(r["mechanism"], r["seed"]): r["overall"] for r in rows}
    paper = [PAPER_OVERALL[m] for m in mechs]

    def rho(drawn: list[int]) -> float:
        return spearman([statistics.mean(ov[m, s] for s in drawn) for m in mechs], paper)

    half = len(seeds) // 2
    rng = random.Random(seed)
    draws = sorted(rho([rng.choice(seeds) for _ in seeds]) for _ in range(resamples))
    return {
        "seeds": seeds,
        "spearman": rho(seeds),
        "first_half": {"seeds": seeds[:half], "spearman": rho(seeds[:half])},
        "second_half": {"seeds": seeds[half:], "spearman": rho(seeds[half:])},
        "bootstrap_interval": [
            draws[int(0.025 * resamples)],
            draws[min(resamples - 1, int(0.975 * resamples))],
        ],
        "share_at_least_0_6": sum(d >= 0.6 for d in draws) / resamples,
        "resamples": resamples,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("rows", help="a protocol sweep's JSON lines")
    ap.add_argument("--variant", required=True)
    ap.add_argument("--seeds", type=int, required=True, help="use the seeds below this")
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument(
        "--score", default="overall", choices=list(SCORES), help="as the sweep's --score"
    )
    args = ap.parse_args()
    # the sweep's reader: a line cut off by a kill is skipped
    rows = [r for r in read_rows(Path(args.rows)) if r["variant"] == args.variant]
    try:
        rows = rescore(rows, args.score)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    seeds = complete_seeds(rows, list(PAPER_OVERALL), args.seeds)
    if len(seeds) < 4:
        raise SystemExit(
            f"variant {args.variant!r}: {len(seeds)} seeds with a run of every published mechanism "
            "below --seeds; at least 4 are needed"
        )
    r = rank_stability(rows, seeds, args.resamples)
    lo, hi = r["bootstrap_interval"]
    first, second = r["first_half"], r["second_half"]
    print(
        f"{args.variant}: Spearman with the paper {r['spearman']:+.3f} over {len(seeds)} seeds; "
        f"seeds {first['seeds'][0]}-{first['seeds'][-1]} {first['spearman']:+.3f}, "
        f"seeds {second['seeds'][0]}-{second['seeds'][-1]} {second['spearman']:+.3f}; "
        f"seed bootstrap 95% [{lo:+.3f}, {hi:+.3f}], {r['share_at_least_0_6']:.0%} of "
        f"{r['resamples']} draws at 0.6 or above"
    )


if __name__ == "__main__":
    main()
