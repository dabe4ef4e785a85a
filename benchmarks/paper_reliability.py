"""How much of the paper's ranking is signal, and what rank correlation a perfect proxy could reach.

    .venv/bin/python benchmarks/paper_reliability.py [--draws 20000] [--json PATH]

The calibration targets (Spearman >= 0.6 with the paper over the 11 published mechanisms; at least 3
of its 5 improvers above GRPO) compare the proxy with one training run per mechanism, scored once on
six benchmarks. This reads the paper's own tables (``benchmarks/data/paper-results.csv``, transcribed
with provenance in ``benchmarks/data/PROVENANCE.md``) and asks how much of that ranking any other task
could reproduce:

1. **Split-half reliability.** Over the main run's variants that did not collapse (Overall at or above
   ``--collapse-below``), each variant's Overall is split into two halves of three benchmarks (the
   paper's weights within each half), for each of the 10 ways to split six benchmarks in two; the mean
   correlation of the halves across variants, stepped up to six benchmarks (Spearman-Brown), is the
   share of the variance of Overall that generalizes across benchmarks. What does not is benchmark
   noise: which problems each benchmark holds, the sampling of pass@32, and a variant's luck on one
   benchmark. A proxy is another task, so that part is out of its reach. The halves share their
   trained model, so training-seed noise counts as signal here: the reliability is an upper bound.
2. **The ceiling.** A normal model of the 11 mechanisms' Overall: observed = true + noise, noise of
   SD sqrt(benchmark noise + training noise); true values of the non-collapsed variants drawn from
   their spread (what is left of the observed variance), those of the collapsed ones (SA- and
   DCBE-GRPO) with a flat prior. For draws of the true values given the paper's numbers, it reports
   the Spearman correlation of the true ranking (what a perfect, noiseless proxy would measure) with
   the paper's, and for each improver the probability that it is truly above GRPO, at training-noise
   SDs from 0 up to what the observed variance leaves room for (the paper ran each mechanism once, so
   that SD is not in its tables).

Pure arithmetic on the paper's numbers: seconds, no training. Without ``--json`` it writes
``benchmarks/results/paper-reliability.json``.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import random
import statistics
from pathlib import Path

from plot_paper_reliability import draw_reliability
from proxy_runs import IMPROVERS, PAPER_OVERALL, spearman

from engine.stats import pearson, seeds_to_resolve

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "paper-results.csv"
BENCHMARKS = ("aime24", "aime25", "amc", "math", "minerva", "olympiad")
WEIGHTS = {
    "aime24": 0.2,
    "aime25": 0.2,
    "amc": 0.15,
    "math": 0.15,
    "minerva": 0.15,
    "olympiad": 0.15,
}
"""the paper's Overall weights (percentage points; they sum to 1)"""
TABLE_NAME = {
    "grpo": "GRPO",
    "vm_av_grpo": "VM-AV-GRPO",
    "dace_grpo": "DACE-GRPO",
    "av_grpo": "AV-GRPO",
    "msa_grpo": "MSA-GRPO",
    "fa_grpo": "FA-GRPO",
    "cag_grpo": "CAG-GRPO",
    "dfr_grpo": "DFR-GRPO",
    "bn_grpo": "BN-GRPO",
    "sa_grpo": "SA-GRPO",
    "dcbe_grpo": "DCBE-GRPO",
}
"""each calibrated mechanism's row name in the paper's tables"""
TRAINING_SDS = (0.0, 0.5, 0.75, 1.0, 1.25, 1.5)
"""training-seed noise SDs (percentage points of Overall) the ceiling is computed at"""


def read_paper_table(path: Path = DATA) -> list[dict]:
    """The paper's result rows: ``table`` (main | compression), ``algorithm``, each benchmark's score
    and ``overall`` as floats (None where the table has no column)."""
    rows = []
    with path.open(newline="") as f:
        for rec in csv.DictReader(f):
            row = {"table": rec["table"], "algorithm": rec["algorithm"]}
            for key in (*BENCHMARKS, "overall"):
                row[key] = float(rec[key]) if rec[key] else None
            rows.append(row)
    return rows


def split_half_reliability(rows: list[dict]) -> dict:
    """Split-half reliability of Overall over ``rows`` (each with all six benchmarks), for each of the
    10 splits of the six benchmarks into two threes: A and B, each half's share of Overall (the paper's
    weights, so A + B = Overall), and Flanagan-Rulon's 4 cov(A, B) / var(A + B), which holds for
    halves of unequal weight and noise (the AIMEs' pass@32 is far noisier than MATH's acc@1); their
    mean is the reliability. Spearman-Brown's 2r / (1 + r) over the halves' mean correlation r, which
    assumes parallel halves and reads too high here, is kept for comparison."""
    splits, rs = {}, []
    for half in itertools.combinations(BENCHMARKS, 3):
        if BENCHMARKS[0] not in half:
            continue  # each split once: the half holding the first benchmark names it
        other = tuple(b for b in BENCHMARKS if b not in half)
        a = [sum(WEIGHTS[b] * x[b] for b in half) for x in rows]
        b = [sum(WEIGHTS[b] * x[b] for b in other) for x in rows]
        total = statistics.variance([p + q for p, q in zip(a, b)])
        splits["+".join(half) + " | " + "+".join(other)] = 4 * statistics.covariance(a, b) / total
        rs.append(pearson(a, b))
    mean_r = statistics.fmean(rs)
    return {
        "splits": splits,
        "reliability": statistics.fmean(splits.values()),
        "mean_r": mean_r,
        "spearman_brown": 2 * mean_r / (1 + mean_r),
    }


def reliability_interval(rows: list[dict], resamples: int = 2000, seed: int = 0) -> list[float]:
    """2.5 and 97.5 percentiles of :func:`split_half_reliability` over ``rows`` drawn with
    replacement (a fixed generator). The variants of one search share ancestry, so they are not
    independent and the real range is wider."""
    rng = random.Random(seed)
    draws = sorted(
        split_half_reliability([rng.choice(rows) for _ in rows])["reliability"]
        for _ in range(resamples)
    )
    return [draws[int(0.025 * resamples)], draws[min(resamples - 1, int(0.975 * resamples))]]


def posterior(
    observed: dict[str, float],
    collapsed: set[str],
    prior_mean: float,
    true_var: float,
    noise_sd: float,
) -> dict[str, tuple[float, float]]:
    """(mean, SD) of each mechanism's true Overall given ``observed`` = true + N(0, noise_sd^2): with
    the prior N(prior_mean, true_var) the mean shrinks by k = true_var / (true_var + noise_sd^2)
    towards ``prior_mean`` and the SD is sqrt(k) noise_sd; a ``collapsed`` one (flat prior) keeps
    N(observed, noise_sd^2)."""
    out = {}
    for n, v in observed.items():
        if n in collapsed or true_var + noise_sd**2 <= 0:
            out[n] = (v, noise_sd)
        else:
            k = true_var / (true_var + noise_sd**2)
            out[n] = (prior_mean + k * (v - prior_mean), math.sqrt(k) * noise_sd)
    return out


def rank_ceiling(
    observed: dict[str, float],
    post: dict[str, tuple[float, float]],
    draws: int,
    seed: int = 0,
    tie: tuple[str, str] | None = None,
    proxy: dict | None = None,
) -> dict:
    """Draws of the mechanisms' true Overall from ``post`` (:func:`posterior`). ``tie = (a, b)`` sets
    a's true value to b's (a mechanism that is b up to what cannot change its training). Returns the
    Spearman correlation of the true values with the ``observed`` ones (what a perfect, noiseless proxy
    would measure: mean, 2.5 / 50 / 97.5 percentiles, share >= 0.6) and, per mechanism, the
    probability that it is truly above ``grpo`` and its mean true difference to it; the expected
    number of :data:`IMPROVERS` truly above it, and the probability that 3 or more are.

    ``proxy``: also a proxy faithful to those true values but with a real proxy's noise:
    ``{"yardstick": m, "measured": {m: paired difference}, "se": {m: its standard error}, "rho": r}``.
    In each draw every mechanism's paired difference to GRPO is its true gain times the proxy's
    measured yardstick difference over the yardstick's true gain, plus N(0, se^2); returned are its
    Spearman with the paper (mean, share >= 0.6) and the share of draws at or below ``rho``."""
    names = list(observed)
    obs = [observed[n] for n in names]
    improvers = [n for n in IMPROVERS if n in observed]
    rng = random.Random(seed)
    rhos, faithful, above, gain = [], [], dict.fromkeys(names, 0), dict.fromkeys(names, 0.0)
    three = 0
    for _ in range(draws):
        true = {n: rng.gauss(*post[n]) for n in names}
        if tie:
            true[tie[0]] = true[tie[1]]
        rhos.append(spearman([true[n] for n in names], obs))
        for n in names:
            above[n] += true[n] > true["grpo"]
            gain[n] += true[n] - true["grpo"]
        three += sum(true[n] > true["grpo"] for n in improvers) >= 3
        if proxy:
            stick = proxy["yardstick"]
            scale = proxy["measured"][stick] / (true[stick] - true["grpo"])
            seen = [
                0.0
                if n == "grpo"
                else scale * (true[n] - true["grpo"]) + rng.gauss(0, proxy["se"][n])
                for n in names
            ]
            faithful.append(spearman(seen, obs))
    rhos.sort()

    def pct(q: float) -> float:
        return rhos[min(draws - 1, int(q * draws))]

    out = {
        "spearman_mean": statistics.fmean(rhos),
        "spearman_percentiles": {"2.5": pct(0.025), "50": pct(0.5), "97.5": pct(0.975)},
        "share_spearman_at_least_0_6": sum(r >= 0.6 for r in rhos) / draws,
        "p_above_grpo": {n: above[n] / draws for n in names if n != "grpo"},
        "mean_true_gain": {n: gain[n] / draws for n in names if n != "grpo"},
        "expected_improvers_above": sum(above[n] for n in improvers) / draws,
        "p_three_improvers_above": three / draws,
    }
    if proxy:
        out["faithful_proxy"] = {
            "yardstick": proxy["yardstick"],
            "spearman_mean": statistics.fmean(faithful),
            "share_at_least_0_6": sum(r >= 0.6 for r in faithful) / draws,
            "share_at_or_below_measured": sum(r <= proxy["rho"] for r in faithful) / draws,
        }
    return out


def analyse_paper(
    rows: list[dict], collapse_below: float, draws: int, proxy: dict | None = None
) -> dict:
    """The whole reading (see the module's docstring); ``proxy``: a calibration table's rows and
    seeds (``{"table": [...], "seeds": n}``) to set a faithful proxy with its noise beside."""
    main = [r for r in rows if r["table"] == "main"]
    by_name = {}
    for r in rows:  # the main run's row wins where a name is in both tables (GRPO)
        by_name.setdefault(r["algorithm"], r)
    grpo = by_name[TABLE_NAME["grpo"]]
    if grpo["overall"] < collapse_below:
        raise ValueError(
            f"--collapse-below {collapse_below:g} would count GRPO ({grpo['overall']:g}) as collapsed"
        )
    kept = [r for r in main if r["overall"] >= collapse_below]
    others = [r for r in kept if r is not grpo]
    half = split_half_reliability(kept)
    overall = [r["overall"] for r in kept]
    var_obs = statistics.variance(overall)
    bench_var = (1 - half["reliability"]) * var_obs
    observed = {m: by_name[TABLE_NAME[m]]["overall"] for m in PAPER_OVERALL}
    collapsed = {m for m, v in observed.items() if v < collapse_below}
    beside_grpo = {
        b: {
            "grpo": grpo[b],
            "median": statistics.median(r[b] for r in others),
            "share_at_or_above_grpo": sum(r[b] >= grpo[b] for r in others) / len(others),
        }
        for b in BENCHMARKS
    }
    rest = 1 - WEIGHTS["aime25"]
    without_aime25 = {}
    for m in PAPER_OVERALL:
        if m == "grpo":
            continue
        d_all = observed[m] - grpo["overall"]
        d_aime25 = by_name[TABLE_NAME[m]]["aime25"] - grpo["aime25"]
        without_aime25[m] = {
            "gain": d_all,
            "aime25_gain": d_aime25,
            "gain_without_aime25": (d_all - WEIGHTS["aime25"] * d_aime25) / rest,
        }
    room = math.sqrt(max(var_obs - bench_var, 0.0))
    r_lo, r_hi = reliability_interval(kept)
    thresholds = {}
    for t in sorted({30.0, 35.0, 40.0, 44.0, collapse_below}):
        if t <= grpo["overall"]:
            thresholds[f"{t:g}"] = {
                "kept": sum(r["overall"] >= t for r in main),
                "reliability": split_half_reliability([r for r in main if r["overall"] >= t])[
                    "reliability"
                ],
            }
    noise_of = None
    if proxy:
        table = {r["mechanism"]: r for r in proxy["table"] if "diff" in r}
        noise_of = {
            "yardstick": "sa_grpo",
            "measured": {m: r["diff"] for m, r in table.items()},
            "se": {m: r["diff_sd"] / math.sqrt(proxy["seeds"]) for m, r in table.items()},
            "rho": proxy["rho"],
        }
    sweep, tied = [], []
    for sd_train in TRAINING_SDS:
        if sd_train >= room:
            continue
        noise = math.sqrt(bench_var + sd_train**2)
        true_var = var_obs - noise**2
        post = posterior(observed, collapsed, statistics.fmean(overall), true_var, noise)
        head = {"training_sd": sd_train, "noise_sd": noise, "true_sd": math.sqrt(true_var)}
        sweep.append({**head, **rank_ceiling(observed, post, draws, proxy=noise_of)})
        tied.append({**head, **rank_ceiling(observed, post, draws, tie=("av_grpo", "grpo"))})
    return {
        "data": str(DATA.relative_to(HERE.parent)),
        "unit": "percentage points of the paper's Overall",
        "collapse_below": collapse_below,
        "variants": {"main": len(main), "kept": len(kept)},
        "overall_sd_kept": math.sqrt(var_obs),
        "split_half": half,
        "reliability_interval": [r_lo, r_hi],
        "reliability_by_threshold": thresholds,
        "benchmark_noise_sd": math.sqrt(bench_var),
        "benchmark_noise_sd_range": [
            math.sqrt((1 - r_hi) * var_obs),
            math.sqrt((1 - r_lo) * var_obs),
        ],
        "training_sd_room": room,
        "training_sd_room_range": [math.sqrt(r_lo * var_obs), math.sqrt(r_hi * var_obs)],
        "grpo_beside_the_variants": beside_grpo,
        "observed": observed,
        "gain_without_aime25": without_aime25,
        "collapsed": sorted(collapsed),
        "ceiling": sweep,
        "ceiling_av_is_grpo": tied,
        "draws": draws,
    }


def faithful_proxy(
    proxy_table: list[dict], gains: dict[str, float], yardstick: str, basis: str
) -> dict:
    """What a proxy faithful to the paper's proportions would measure: each mechanism's gain over
    GRPO (``gains``, pp; ``basis`` says which: the printed ones or the model's true ones) times the
    proxy's measured paired difference of ``yardstick`` over that mechanism's own gain, beside the
    proxy's measured difference, with the paired seeds the scaled difference would need at the
    mechanism's measured paired SD (:func:`engine.stats.seeds_to_resolve`). ``proxy_table``: a
    calibration table's rows (``mechanism``, ``diff``, ``diff_interval``, ``diff_sd``)."""
    rows = {r["mechanism"]: r for r in proxy_table if "diff" in r}
    scale = rows[yardstick]["diff"] / gains[yardstick]
    out = {}
    for m, g in gains.items():
        if m not in rows:
            continue
        expected = g * scale
        out[m] = {
            "measured": rows[m]["diff"],
            "measured_interval": rows[m].get("diff_interval"),
            "measured_sd": rows[m]["diff_sd"],
            "faithful": expected,
            "seeds_to_resolve_faithful": seeds_to_resolve(expected, rows[m]["diff_sd"]),
        }
    return {"yardstick": yardstick, "basis": basis, "scale_per_pp": scale, "rows": out}


def paper_report(res: dict) -> str:
    half, out = res["split_half"], []
    lo, hi = res["reliability_interval"]
    out.append(
        f"{res['variants']['kept']} of the main run's {res['variants']['main']} variants kept "
        f"(Overall >= {res['collapse_below']:g}); Overall SD across them "
        f"{res['overall_sd_kept']:.2f} pp"
    )
    out.append(
        f"split-half reliability (Flanagan-Rulon) {half['reliability']:.3f} (splits "
        f"{min(half['splits'].values()):.3f} to {max(half['splits'].values()):.3f}; variant "
        f"bootstrap [{lo:.2f}, {hi:.2f}]; Spearman-Brown would read {half['spearman_brown']:.3f}); "
        f"benchmark noise SD {res['benchmark_noise_sd']:.2f} pp "
        f"[{res['benchmark_noise_sd_range'][0]:.2f}, {res['benchmark_noise_sd_range'][1]:.2f}]; "
        f"room left for training noise: SD < {res['training_sd_room']:.2f} pp "
        f"[{res['training_sd_room_range'][0]:.2f}, {res['training_sd_room_range'][1]:.2f}]"
    )
    out.append(
        "reliability by collapse threshold: "
        + ", ".join(
            f">= {t}: {v['reliability']:.3f} ({v['kept']} variants)"
            for t, v in res["reliability_by_threshold"].items()
        )
    )
    out.append(
        "\n| benchmark | GRPO | median of the other kept variants | share at or above GRPO |"
    )
    out.append("|---|---|---|---|")
    for b, v in res["grpo_beside_the_variants"].items():
        out.append(
            f"| {b} | {v['grpo']:.1f} | {v['median']:.1f} | {v['share_at_or_above_grpo']:.2f} |"
        )
    out.append(
        "\n| mechanism | paper's gain over GRPO | its AIME25 gain | gain over the other five |"
    )
    out.append("|---|---|---|---|")
    for m, g in res["gain_without_aime25"].items():
        out.append(
            f"| {m} | {g['gain']:+.1f} | {g['aime25_gain']:+.1f} | {g['gain_without_aime25']:+.1f} |"
        )
    for title, key in (
        ("ceiling: a perfect proxy's Spearman with the paper", "ceiling"),
        ("the same, with AV-GRPO's true value GRPO's", "ceiling_av_is_grpo"),
    ):
        out.append(f"\n{title}")
        out.append(
            "| training noise SD | total noise SD | Spearman mean | 95% range | share >= 0.6 | "
            "expected improvers above GRPO | P(3 or more above) | "
            + " | ".join(f"P({m} > GRPO)" for m in IMPROVERS)
            + " |"
        )
        out.append("|---" * (7 + len(IMPROVERS)) + "|")
        for c in res[key]:
            p = c["spearman_percentiles"]
            out.append(
                f"| {c['training_sd']:.2f} | {c['noise_sd']:.2f} | {c['spearman_mean']:+.3f} | "
                f"[{p['2.5']:+.3f}, {p['97.5']:+.3f}] | {c['share_spearman_at_least_0_6']:.2f} | "
                f"{c['expected_improvers_above']:.2f} | {c['p_three_improvers_above']:.2f} | "
                + " | ".join(f"{c['p_above_grpo'][m]:.2f}" for m in IMPROVERS)
                + " |"
            )
    fp = res.get("faithful_proxy")
    if fp:
        out.append(
            f"\na proxy faithful to the model's true values (scaled on sa_grpo) with this proxy's "
            f"noise at {fp['seeds']} paired seeds, against its measured Spearman {fp['spearman']:+.3f}"
        )
        out.append(
            "| training noise SD | Spearman mean | share >= 0.6 | share at or below measured |"
        )
        out.append("|---|---|---|---|")
        for c in res["ceiling"]:
            f = c.get("faithful_proxy")
            if f:
                out.append(
                    f"| {c['training_sd']:.2f} | {f['spearman_mean']:+.3f} | "
                    f"{f['share_at_least_0_6']:.2f} | {f['share_at_or_below_measured']:.2f} |"
                )
        sticks = fp["yardsticks"]
        out.append(
            f"\nthe proxy ({fp['source']}, {fp['seeds']} paired seeds) against proxies faithful to the "
            f"paper's proportions (the model's gains at training noise SD {fp['training_sd']:g} pp)"
        )
        out.append(
            "| mechanism | measured vs GRPO | 95% interval | "
            + " | ".join(
                f"faithful, {s['basis']} on {s['yardstick']} | seeds it needs" for s in sticks
            )
            + " |"
        )
        out.append("|---" * (3 + 2 * len(sticks)) + "|")
        for m, r in sticks[0]["rows"].items():
            iv = r["measured_interval"]
            cells = []
            for s in sticks:
                f = s["rows"][m]
                need = f["seeds_to_resolve_faithful"]
                cells.append(f"{f['faithful']:+.4f} | {need if need else 'over 10,000'}")
            out.append(
                f"| {m} | {r['measured']:+.4f} | "
                + (f"[{iv[0]:+.4f}, {iv[1]:+.4f}]" if iv else "-")
                + " | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=int, default=20000, help="draws of the true values per row")
    ap.add_argument(
        "--collapse-below",
        type=float,
        default=40.0,
        help="Overall (pp) below which a variant counts as collapsed (default 40)",
    )
    ap.add_argument("--json", type=Path, default=HERE / "results" / "paper-reliability.json")
    ap.add_argument(
        "--proxy",
        type=Path,
        default=HERE / "results" / "calibration-53seeds.json",
        help="a protocol sweep's JSON to set beside a faithful proxy (default: the 53-seed table)",
    )
    ap.add_argument("--proxy-variant", default="d", help="the variant of --proxy to read")
    ap.add_argument(
        "--figure", type=Path, help="also draw the ceiling and the proxy beside it (PNG)"
    )
    args = ap.parse_args()
    if args.draws < 100:
        ap.error("--draws: at least 100")
    try:
        sweep = json.loads(args.proxy.read_text())
        table = sweep["variants"][args.proxy_variant]["table"]
    except (OSError, ValueError, KeyError) as e:
        ap.error(f"--proxy {args.proxy}: no variant {args.proxy_variant!r} table ({e})")
    seeds = min(r["seeds"] for r in table)
    rho = spearman([r["overall"] for r in table], [PAPER_OVERALL[r["mechanism"]] for r in table])
    try:
        res = analyse_paper(
            read_paper_table(),
            args.collapse_below,
            args.draws,
            proxy={"table": table, "seeds": seeds, "rho": rho},
        )
    except ValueError as e:
        ap.error(str(e))
    best = res["ceiling"][0]  # no training noise: the model's gains at their largest
    printed = {m: g["gain"] for m, g in res["gain_without_aime25"].items()}
    res["faithful_proxy"] = {
        "source": str(
            args.proxy.resolve().relative_to(HERE.parent)
            if args.proxy.resolve().is_relative_to(HERE.parent)
            else args.proxy
        ),
        "variant": args.proxy_variant,
        "protocol_hash": sweep.get("protocol_hash"),
        "seeds": seeds,
        "spearman": rho,
        "training_sd": best["training_sd"],
        "yardsticks": [
            faithful_proxy(table, printed, "sa_grpo", "printed gains"),
            faithful_proxy(table, best["mean_true_gain"], "sa_grpo", "model's true gains"),
            faithful_proxy(table, best["mean_true_gain"], "bn_grpo", "model's true gains"),
        ],
    }
    print(paper_report(res))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=1) + "\n")
    print(f"\nJSON: {args.json}")
    if args.figure:
        draw_reliability(res, args.figure)
        print(f"figure: {args.figure}")


if __name__ == "__main__":
    main()
