"""What screening's fingerprints cost: ``fingerprints()`` of several published mechanisms.

Fingerprinting runs candidate code behind the sandbox (a recording child per source, ``--parallel``
at a time, and a trusted replay child that loads no candidate code); a sandboxed child's start
(Python and torch) dominates. This times the whole call, the way screening makes it, for the first
``--sources`` published mechanisms (the registry's order: the root GRPO first), ``--repeats`` times,
and prints each wall time and their median.

    python benchmarks/bench_fingerprint.py [--sources 4] [--repeats 3] [--parallel 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.archive.edit import prior_source  # noqa: E402
from engine.operators.fingerprint import RECORDERS, fingerprints  # noqa: E402
from engine.sandbox import boundary  # noqa: E402
from trainer_template.priors import list_priors  # noqa: E402


def sources(n: int) -> list[str]:
    """The complete algorithm.py of the first ``n`` published mechanisms (the root GRPO, then the
    literature baselines: the registry's order)."""
    return [prior_source(name) for name in list_priors()[:n]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sources", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=RECORDERS, help="recording children at a time")
    args = ap.parse_args()
    b = boundary.resolve()
    srcs = sources(args.sources)
    times = []
    for i in range(args.repeats):
        t = time.perf_counter()
        fps = fingerprints(srcs, parallel=args.parallel)
        times.append(time.perf_counter() - t)
        failed = [f for f in fps if not isinstance(f, list)]
        if failed:
            sys.exit(f"a published mechanism was not fingerprinted: {failed[0]}")
        print(f"  repeat {i + 1}: {times[-1]:7.2f} s", flush=True)
    print(
        f"\nfingerprints() of {len(srcs)} sources behind the {b.kind} boundary, "
        f"{args.parallel} recording children at a time: "
        f"median {statistics.median(times):.2f} s of {args.repeats} (wall seconds)"
    )


if __name__ == "__main__":
    main()
