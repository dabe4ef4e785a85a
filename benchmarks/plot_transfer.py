"""Mechanisms' paired differences to GRPO from protocol-sweep rows, as one forest plot: the published
mechanisms beside what the loop found, on the seeds they share.

    .venv/bin/python benchmarks/plot_transfer.py --variant large-gpu --seeds 24 \\
        --figure docs/figures/large-gpu-transfer.png \\
        "published=benchmarks/results/calibration-large-gpu.rows.jsonl" \\
        "found by the loop=benchmarks/results/large-gpu-transfer.rows.jsonl" \\
        --name "v2_s0=annealed entropy control, KL 0.04, RLOO, invalid floor"

Each group is ``LABEL=ROWS``: a rows file written by ``bench_protocol_sweep.py``. Every mechanism in
it is paired with the GRPO runs *of the same file*, at seeds ``0 .. --seeds - 1``; a mechanism
missing any of those seeds is left out, and said so. All rows drawn must record one protocol hash:
rows of different protocols are refused, not drawn together. ``--only`` keeps the named mechanisms
of a group (``LABEL:NAME,NAME``); ``--name NAME=TEXT`` writes TEXT beside NAME. Prints the table it
draws; trains nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench_protocol_sweep import read_rows
from proxy_runs import fmt_iv, verdict

from engine.stats import paired_interval

COLOURS = ("tab:gray", "tab:blue", "tab:green", "tab:orange", "tab:purple")


def read_group(spec: str, variant: str) -> tuple[str, list[dict]]:
    """``LABEL=ROWS`` -> (label, the rows of ``variant`` in ROWS)."""
    label, sep, path = spec.partition("=")
    if not sep or not label or not path:
        raise SystemExit(f"plot_transfer: {spec!r} is not LABEL=ROWS")
    if not Path(path).is_file():
        raise SystemExit(f"plot_transfer: cannot read {path}: no such file")
    # the sweep's own reader: a line cut off by a kill is skipped
    rows = [r for r in read_rows(Path(path)) if r.get("variant") == variant]
    if not rows:
        raise SystemExit(f"plot_transfer: {path} has no rows of variant {variant!r}")
    return label, rows


def group_effects(rows: list[dict], seeds: int, only: set[str] | None) -> tuple[list[dict], list]:
    """Each mechanism's paired difference to this file's GRPO at seeds 0..seeds-1, best first; and
    the mechanisms left out for missing seeds."""
    by: dict[str, dict[int, float]] = {}
    for r in rows:
        if r["seed"] < seeds:
            by.setdefault(r["mechanism"], {})[r["seed"]] = float(r["overall"])
    grpo = by.get("grpo", {})
    if len(grpo) < seeds:
        raise SystemExit(f"plot_transfer: GRPO has {len(grpo)} of the {seeds} seeds in a group")
    effects, missing = [], []
    for mech, values in by.items():
        if mech == "grpo" or (only is not None and mech not in only):
            continue
        if len(values) < seeds:
            missing.append((mech, len(values)))
            continue
        diff, iv, n = paired_interval(values, grpo)
        effects.append({"mechanism": mech, "diff": diff, "interval": iv, "seeds": n})
    return sorted(effects, key=lambda e: e["diff"], reverse=True), missing


def draw(groups: list[tuple[str, list[dict]]], names: dict, title: str, path: Path) -> None:
    import matplotlib  # lazy: only drawing needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: as above

    items = [(g, i, e) for i, (g, effects) in enumerate(groups) for e in effects]
    fig, ax = plt.subplots(figsize=(8.5, 0.32 * len(items) + 1.4))
    for y, (_group, i, e) in enumerate(reversed(items)):
        lo, hi = e["interval"] or (e["diff"], e["diff"])
        colour = COLOURS[i % len(COLOURS)]
        ax.errorbar(
            e["diff"],
            y,
            xerr=[[e["diff"] - lo], [hi - e["diff"]]],
            fmt="o",
            color=colour,
            capsize=3,
        )
    labels = [
        e["mechanism"] + (f" ({names[e['mechanism']]})" if e["mechanism"] in names else "")
        for _, _, e in reversed(items)
    ]
    ax.set_yticks(range(len(items)), labels, fontsize=8)
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("paired difference to GRPO, Overall (fraction), 95% interval")
    handles = [
        plt.Line2D([], [], marker="o", linestyle="", color=COLOURS[i % len(COLOURS)], label=g)
        for i, (g, _) in enumerate(groups)
    ]
    ax.legend(handles=handles, loc="upper left", fontsize=8)
    fig.suptitle(title, fontsize=9)  # over the figure: long mechanism labels narrow the axes
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("groups", nargs="+", help="LABEL=ROWS")
    ap.add_argument("--variant", required=True, help="the sweep variant whose rows are drawn")
    ap.add_argument("--seeds", type=int, required=True, help="paired seeds 0..S-1")
    ap.add_argument("--only", action="append", default=[], help="LABEL:NAME,NAME")
    ap.add_argument("--name", action="append", default=[], help="NAME=TEXT")
    ap.add_argument("--figure", required=True)
    args = ap.parse_args()
    if args.seeds < 2:
        raise SystemExit("plot_transfer: --seeds must be at least 2 (an interval needs two)")
    only = {}
    for spec in args.only:
        label, sep, names = spec.partition(":")
        if not sep:
            raise SystemExit(f"plot_transfer: --only {spec!r} is not LABEL:NAME,NAME")
        only[label] = {n for n in names.split(",") if n}
    names = dict(n.partition("=")[::2] for n in args.name)

    loaded = [read_group(spec, args.variant) for spec in args.groups]
    hashes = {r.get("protocol_hash") for _, rows in loaded for r in rows}
    if len(hashes) != 1:
        raise SystemExit(
            "plot_transfer: the rows were measured under different protocols "
            f"({', '.join(sorted(str(h)[:19] for h in hashes))}); not drawn together"
        )
    groups = []
    print("| group | mechanism | vs GRPO (paired) | 95% interval | verdict | seeds |")
    print("|---|---|---|---|---|---|")
    for label, rows in loaded:
        effects, missing = group_effects(rows, args.seeds, only.get(label))
        for e in effects:
            iv = e["interval"]
            print(
                f"| {label} | {e['mechanism']} | {e['diff']:+.3f} | {fmt_iv(iv, signed=True)} | "
                f"{verdict(iv)} | {e['seeds']} |"
            )
        for mech, n in missing:
            print(f"(left out of {label}: {mech}, {n} of {args.seeds} seeds)")
        groups.append((label, effects))
    devices = sorted({str(r.get("device")) for _, rows in loaded for r in rows})
    title = (
        f"variant {args.variant}, seeds 0-{args.seeds - 1}, device {', '.join(devices)}, "
        f"protocol {next(iter(hashes))[:19]}"
    )
    draw(groups, names, title, Path(args.figure))
    print(f"figure: {args.figure} ({title})")


if __name__ == "__main__":
    main()
