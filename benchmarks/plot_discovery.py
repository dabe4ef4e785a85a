"""Several discovery benchmarks' best-so-far curves in one figure, with their summary table.

    .venv/bin/python benchmarks/plot_discovery.py --figure docs/figures/discovery-ablation.png \\
        "closed loop=benchmarks/results/discovery-diagnosis.json:loop" \\
        "closed loop, no KL remedy=benchmarks/results/discovery-no-kl-remedy.json:loop" \\
        "random search=benchmarks/results/discovery-diagnosis.json:random"

Each series is ``LABEL=JSON[:METHOD]``: a JSON written by ``bench_discovery.py`` and the method in it
(``loop`` unless named). Every JSON must come from one protocol (the same preset and protocol hash):
curves measured under different protocols are refused, not drawn together. Trains nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench_discovery import best_so_far, draw, summarize


def load(spec: str) -> tuple[str, dict, dict]:
    """``LABEL=JSON[:METHOD]`` -> (label, the JSON, its method's searches by search seed)."""
    label, sep, rest = spec.partition("=")
    if not sep or not label or not rest:
        raise SystemExit(f"plot_discovery: {spec!r} is not LABEL=JSON[:METHOD]")
    path, _, method = rest.partition(":")
    method = method or "loop"
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"plot_discovery: cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or not data.get("protocol") or not data.get("protocol_hash"):
        raise SystemExit(f"plot_discovery: {path} names no protocol: not a bench_discovery.py JSON")
    runs = (data.get("results") or {}).get(method)
    if not runs:
        known = ", ".join(data.get("results") or {}) or "none"
        raise SystemExit(f"plot_discovery: {path} has no {method!r} searches (it has: {known})")
    return label, data, runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("series", nargs="+", help="LABEL=JSON[:METHOD]")
    ap.add_argument("--figure", required=True)
    args = ap.parse_args()

    loaded = [load(s) for s in args.series]
    protocols = {(d["protocol"], d["protocol_hash"]) for _, d, _ in loaded}
    if len(protocols) > 1:
        raise SystemExit(
            "plot_discovery: the searches were measured under different protocols "
            f"({', '.join(sorted(f'{p} {h[:19]}' for p, h in protocols))}); not drawn together"
        )
    series, roots, candidates = [], [], 1
    print("| search | search seeds | mean best Overall | 95% interval | beats the root |")
    print("|---|---|---|---|---|")
    for label, _data, runs in loaded:
        curves = [best_so_far(r["candidates"], r["root_overall"]) for r in runs.values()]
        series.append((label, curves))
        roots += [r["root_overall"] for r in runs.values()]
        candidates = max([candidates] + [len(c) for c in curves])
        v = summarize(runs)
        iv, n = v["interval"], v["search_seeds"]
        ivs = f"[{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "-"
        print(
            f"| {label} | {n} | {v['mean_best_overall']:.3f} | {ivs} | {v['beats_root_in']} of {n} |"
        )
    draw(series, roots[0] if roots else None, Path(args.figure), candidates)
    print(f"figure: {args.figure} ({next(iter(protocols))[0]})")


if __name__ == "__main__":
    main()
