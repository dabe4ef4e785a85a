"""How the proxy's scores move with the RL budget: protocol-sweep rows of variants that differ from
the default protocol only in ``steps``, drawn against the number of RL steps.

    .venv/bin/python benchmarks/plot_rl_budget.py \\
        --rows benchmarks/results/rl-budget.rows.jsonl --rows benchmarks/results/calibration-17seeds.rows.jsonl \\
        --rows benchmarks/results/protocol-sweep.rows.jsonl --variants s20,s40,s60,d,long \\
        --seeds 6 --out docs/figures/rl-budget.png

Left: GRPO's Overall, hard pass@8, hard pass@1 and medium acc@1 (mean over the seeds, 95%
t-interval). Right: each mechanism's paired difference to GRPO (same seeds), with its interval.
Rows are matched by (RL steps, mechanism, seed); the first ``--rows`` file that has one wins. Only
seeds every point has for GRPO are used, so each curve is over the same paired seeds. Prints the
table it draws. The variants named must differ from the default protocol in ``steps`` only: the
rows do not say so themselves (their JSON's ``changes`` does).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.stats import mean_interval, paired_interval  # noqa: E402

METRICS = ("overall", "hard/pass@8", "hard/pass@1", "medium/acc@1")


def load(paths: list[str], variants: set[str]) -> dict[tuple[int, str, int], dict]:
    """(steps, mechanism, seed) -> row, first file first."""
    from bench_protocol_sweep import read_rows  # the sweep's reader: a cut-off last line is skipped

    out: dict[tuple[int, str, int], dict] = {}
    for p in map(Path, paths):
        if not p.is_file():
            raise SystemExit(f"no rows file {p}")
        for r in read_rows(p):
            if r["variant"] in variants and not r.get("stopped"):
                out.setdefault((r["steps_run"], r["mechanism"], r["seed"]), r)
    return out


def table(rows: dict, seeds: int, mechanisms: list[str] | None) -> dict:
    steps = sorted({k[0] for k in rows})
    common = [s for s in range(seeds) if all((st, "grpo", s) in rows for st in steps)]
    if len(common) < 2:
        raise SystemExit(f"fewer than 2 seeds < {seeds} have GRPO at every budget {steps}")
    mechs = mechanisms or sorted({k[1] for k in rows} - {"grpo"})
    grpo = {
        m: [mean_interval([rows[st, "grpo", s]["metrics"][m] for s in common]) for st in steps]
        for m in METRICS
    }
    diffs = {}
    for mech in mechs:
        pts = []
        for st in steps:
            have = [s for s in common if (st, mech, s) in rows]
            if len(have) < 2:
                pts.append(None)
                continue
            a = {s: rows[st, mech, s]["overall"] for s in have}
            b = {s: rows[st, "grpo", s]["overall"] for s in have}
            pts.append(paired_interval(a, b))
        diffs[mech] = pts
    return {"steps": steps, "seeds": common, "grpo": grpo, "diffs": diffs}


def draw(t: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for m in METRICS:
        means = [p[0] for p in t["grpo"][m]]
        lo = [p[0] - p[1][0] for p in t["grpo"][m]]
        hi = [p[1][1] - p[0] for p in t["grpo"][m]]
        left.errorbar(t["steps"], means, yerr=[lo, hi], marker="o", capsize=3, label=m)
    left.set_xlabel("RL steps")
    left.set_ylabel("GRPO, mean over seeds")
    left.set_title(f"GRPO vs RL budget ({len(t['seeds'])} seeds, 95% interval)")
    left.legend(fontsize=8)
    n = max(1, len(t["diffs"]))
    for i, (mech, pts) in enumerate(sorted(t["diffs"].items())):
        xs = [st + (i - n / 2) * 1.2 for st, p in zip(t["steps"], pts) if p]
        ys = [p[0] for p in pts if p]
        err = [[p[0] - p[1][0] for p in pts if p], [p[1][1] - p[0] for p in pts if p]]
        right.errorbar(xs, ys, yerr=err, marker=".", capsize=2, lw=1, label=mech)
    right.axhline(0.0, color="black", lw=0.8)
    right.set_xlabel("RL steps")
    right.set_ylabel("Overall - GRPO's (paired)")
    right.set_title("paired difference to GRPO, 95% interval")
    right.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", action="append", required=True, help="a sweep's .rows.jsonl")
    ap.add_argument("--variants", required=True, help="variant names differing in steps only")
    ap.add_argument("--seeds", type=int, default=6, help="use seeds 0..S-1")
    ap.add_argument("--mechanisms", default=None, help="default: every one in the rows")
    ap.add_argument("--out", default=str(ROOT / "docs" / "figures" / "rl-budget.png"))
    args = ap.parse_args()
    rows = load(args.rows, set(args.variants.split(",")))
    if not rows:
        raise SystemExit(f"no finished rows of variants {args.variants} in {', '.join(args.rows)}")
    mechs = [m for m in (args.mechanisms or "").split(",") if m and m != "grpo"] or None
    t = table(rows, args.seeds, mechs)
    print(f"seeds {t['seeds']}; RL steps {t['steps']}")
    print("| RL steps | " + " | ".join(f"GRPO {m}" for m in METRICS) + " |")
    print("|---|" + "---|" * len(METRICS))
    for i, st in enumerate(t["steps"]):
        cells = [f"{t['grpo'][m][i][0]:.3f}" for m in METRICS]
        print(f"| {st} | " + " | ".join(cells) + " |")
    print("\n| mechanism | " + " | ".join(f"{st} steps" for st in t["steps"]) + " |")
    print("|---|" + "---|" * len(t["steps"]))
    for mech, pts in sorted(t["diffs"].items()):
        cells = [f"{p[0]:+.3f} [{p[1][0]:+.3f}, {p[1][1]:+.3f}]" if p else "-" for p in pts]
        print(f"| {mech} | " + " | ".join(cells) + " |")
    draw(t, Path(args.out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
