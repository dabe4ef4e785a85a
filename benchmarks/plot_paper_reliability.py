"""The paper-reliability benchmark's figure, from its JSON: a perfect proxy's Spearman with the paper
against the paper's training noise (mean and 95% range, with and without AV-GRPO level with GRPO),
a faithful proxy's with this proxy's noise beside it, 0.6 and this proxy's own rank correlation
marked; and this proxy's paired differences to GRPO beside what faithful proxies would measure.

    .venv/bin/python benchmarks/plot_paper_reliability.py \\
        [--json benchmarks/results/paper-reliability.json] --figure docs/figures/paper-reliability.png

``benchmarks/paper_reliability.py --figure PATH`` draws the same after its run. Trains nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def draw_reliability(res: dict, path: Path) -> None:
    """Two panels: a perfect proxy's Spearman with the paper against the training noise (mean and 95%
    range; 0.6 and the proxy's own rank correlation marked), and the proxy's paired differences to
    GRPO beside what proxies faithful to the paper's proportions would measure."""
    import matplotlib  # lazy: only drawing needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: as above

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for key, colour, label in (
        ("ceiling", "tab:blue", "perfect proxy"),
        ("ceiling_av_is_grpo", "tab:green", "perfect proxy, AV-GRPO = GRPO"),
    ):
        xs = [c["training_sd"] for c in res[key]]
        left.plot(xs, [c["spearman_mean"] for c in res[key]], "o-", color=colour, label=label)
        left.fill_between(
            xs,
            [c["spearman_percentiles"]["2.5"] for c in res[key]],
            [c["spearman_percentiles"]["97.5"] for c in res[key]],
            color=colour,
            alpha=0.12,
        )
    left.axhline(0.6, color="black", linewidth=0.8, linestyle=":", label="target 0.6")
    fp = res.get("faithful_proxy")
    noisy = [c for c in res["ceiling"] if "faithful_proxy" in c]
    if fp and noisy:
        left.plot(
            [c["training_sd"] for c in noisy],
            [c["faithful_proxy"]["spearman_mean"] for c in noisy],
            "s--",
            color="tab:orange",
            label=f"faithful proxy with this one's noise, {fp['seeds']} seeds",
        )
    if fp:
        left.axhline(
            fp["spearman"],
            color="tab:red",
            linestyle="--",
            label=f"this proxy, {fp['seeds']} paired seeds ({fp['spearman']:+.2f})",
        )
        rows = fp["yardsticks"][0]["rows"]
        names = sorted(rows, key=lambda m: rows[m]["measured"])
        for y, m in enumerate(names):
            r = rows[m]
            lo, hi = r["measured_interval"] or (r["measured"], r["measured"])
            right.errorbar(
                r["measured"],
                y,
                xerr=[[r["measured"] - lo], [hi - r["measured"]]],
                fmt="o",
                color="tab:red",
                capsize=3,
                label="this proxy (95% interval)" if y == 0 else None,
            )
            for stick, marker, colour in zip(
                fp["yardsticks"], ("^", "s", "D"), ("tab:orange", "tab:blue", "tab:purple")
            ):
                right.plot(
                    stick["rows"][m]["faithful"],
                    y,
                    marker,
                    mfc="none",
                    color=colour,
                    label=f"faithful: {stick['basis']}, on {stick['yardstick']}"
                    if y == 0
                    else None,
                )
        right.set_yticks(range(len(names)), names, fontsize=8)
        right.axvline(0.0, color="black", linewidth=0.8)
        right.set_xlabel("paired difference to GRPO, proxy Overall (fraction)")
        right.legend(fontsize=8, loc="upper left")
    left.set_xlabel("training-seed noise SD of the paper's Overall (pp)")
    left.set_ylabel("Spearman with the paper (11 mechanisms)")
    left.set_ylim(-0.1, 1.0)
    left.legend(fontsize=8, loc="lower left")
    fig.suptitle(
        f"The paper's own noise: Overall reliability {res['split_half']['reliability']:.2f} "
        f"over {res['variants']['kept']} variants; benchmark noise SD "
        f"{res['benchmark_noise_sd']:.2f} pp",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=HERE / "results" / "paper-reliability.json")
    ap.add_argument("--figure", type=Path, required=True, help="the PNG to write")
    args = ap.parse_args()
    try:
        res = json.loads(args.json.read_text())
    except (OSError, ValueError) as e:
        ap.error(f"--json {args.json}: {e}")
    draw_reliability(res, args.figure)
    print(f"figure: {args.figure}")


if __name__ == "__main__":
    main()
