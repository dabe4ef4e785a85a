"""Held-out confirmation of the discovery benchmark's best nodes.

    nice -n 5 .venv/bin/python benchmarks/confirm_discovery.py [--seeds 6] [--first-seed 6]

A search's best node is the maximum of its candidates, picked on the very seeds its interval is
computed on, so "beats the root beyond its interval" is biased upwards (the winner's curse): among
16 candidates whose true effect is zero, one clears a 95% interval by chance far more often than
1 time in 40. This script re-measures each finished search of ``bench_discovery.py`` (its archive
and ``<method>-s<seed>.json`` under ``--workdir``) on fresh seeds the search never saw: the root and
the best node at seeds ``first_seed .. first_seed+seeds-1``, paired, with the product's own
confirmation (``engine.operators.confirm.confirm_node``, what ``poise-git confirm`` runs): it refuses
seeds the search used, leaves the search's results as they were, and records the confirmation on the
best node's branch (``poise-git show NODE -C ARCHIVE`` prints it). Per-seed results are cached like
the benchmark's (``$POISE_EVAL_CACHE``, default ``.cache/poise-eval``), so the root's held-out seeds
are trained once. Prints the table and writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from bench_discovery import finished_searches
from proxy_runs import ROOT, fmt_iv, load_average, mean_interval, stamp, write_results

from engine.errors import PoiseError


def confirm(
    archive_dir: Path, best: str, seeds: list[int], preset: str, root: str = "grpo"
) -> dict:
    """``best`` confirmed against the root ``root`` at ``seeds`` in ``archive_dir``; their paired
    difference."""
    from engine.archive.confirmation import CONFIRMED, FAILED
    from engine.archive.store import Archive
    from engine.operators.confirm import confirm_node

    archive = Archive(archive_dir)
    exp = archive.config().experiment
    conf = confirm_node(
        archive, best, root, exp, seeds=len(seeds), first_seed=seeds[0], preset=preset
    )
    if conf.verdict == FAILED:
        raise PoiseError(f"{best}: {conf.reason}")
    return {
        "best": best,
        "seeds": list(conf.seeds),
        "root_overall": sum(conf.reference.values()) / len(conf.reference),
        "best_overall": sum(conf.values.values()) / len(conf.values),
        "diff": conf.difference,
        "diff_interval": list(conf.interval) if conf.interval else None,
        "beats_root": conf.verdict == CONFIRMED,
    }


def summarize(rows: list[dict]) -> dict:
    """Per method, over its search seeds: the mean held-out difference of the best node to the root
    (a t-interval over search seeds), its mean held-out Overall, and in how many search seeds it
    beats the root on held-out seeds; with both methods, the loop's mean held-out difference minus
    random search's. Unlike the search's own "beats root", these are unbiased: the seeds they are
    measured on played no part in picking the best node."""
    out: dict = {}
    for method in sorted({r["method"] for r in rows}):
        mine = [r for r in rows if r["method"] == method]
        diffs = [r["diff"] for r in mine]
        m, iv = mean_interval(diffs)
        out[method] = {
            "mean_held_out_diff": m,
            "interval": iv,
            "mean_held_out_overall": sum(r["best_overall"] for r in mine) / len(mine),
            "beats_root_in": sum(1 for r in mine if r["beats_root"]),
            "search_seeds": len(mine),
        }
    if "loop" in out and "random" in out:
        out["loop_minus_random"] = (
            out["loop"]["mean_held_out_diff"] - out["random"]["mean_held_out_diff"]
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, default=6, help="held-out paired seeds")
    ap.add_argument(
        "--first-seed", type=int, default=6, help="first held-out seed (the search used 0..5)"
    )
    ap.add_argument("--preset", default="default")
    ap.add_argument("--methods", default="loop,random")
    ap.add_argument("--workdir", default=str(ROOT / ".cache" / "discovery"))
    ap.add_argument(
        "--json", default=str(ROOT / "benchmarks" / "results" / "discovery-confirm.json")
    )
    args = ap.parse_args()
    os.environ.setdefault("POISE_EVAL_CACHE", str(ROOT / ".cache" / "poise-eval"))

    work = Path(args.workdir)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    t0, loads = time.monotonic(), [load_average()]
    print(f"{stamp()} held-out seeds {seeds[0]}..{seeds[-1]}; load average {loads[0]}", flush=True)
    rows: list[dict] = []
    for method, s, archive_dir, res in finished_searches(work, args.methods.split(",")):
        root = res.get("root", "grpo")  # searches recorded before --root-source: the GRPO root
        if not res.get("best") or res["best"] == root:
            continue
        if not (archive_dir / ".git").exists():
            print(f"{stamp()} {archive_dir.name}: no archive at {archive_dir}; skipped", flush=True)
            continue
        t = time.monotonic()
        try:
            measured = confirm(archive_dir, res["best"], seeds, args.preset, root)
        except PoiseError as exc:  # a node failed at a held-out seed, or seeds the search used
            print(f"{stamp()} {archive_dir.name}: not confirmed: {exc}", flush=True)
            continue
        row = {
            "method": method,
            "search_seed": s,
            "search_diff": res.get("best_diff"),
            "search_diff_interval": res.get("best_diff_interval"),
            **measured,
            "wall_s": round(time.monotonic() - t, 1),
        }
        rows.append(row)
        print(
            f"{stamp()} {archive_dir.name}: {row['best']} {row['diff']:+.3f} {row['diff_interval']}"
        )
    loads.append(load_average())
    print()
    print(
        "| method | search seed | best node | on the search's seeds | on held-out seeds | "
        "95% interval | beats root |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        siv, iv = r["search_diff_interval"], r["diff_interval"]
        print(
            f"| {r['method']} | {r['search_seed']} | {r['best']} | {r['search_diff']:+.3f} "
            f"[{siv[0]:+.3f}, {siv[1]:+.3f}] | {r['diff']:+.3f} | "
            f"{f'[{iv[0]:+.3f}, {iv[1]:+.3f}]' if iv else '-'} | "
            f"{'yes' if r['beats_root'] else 'no'} |"
        )
    summary = summarize(rows) if rows else {}
    for method, v in summary.items():
        if method == "loop_minus_random":
            print(f"loop minus random search, mean held-out difference: {v:+.3f}")
            continue
        print(
            f"{method}: mean held-out difference to the root {v['mean_held_out_diff']:+.3f} "
            f"{fmt_iv(v['interval'], signed=True)} over {v['search_seeds']} search seeds "
            f"(mean held-out Overall {v['mean_held_out_overall']:.3f}); beats the root on "
            f"held-out seeds in {v['beats_root_in']} of {v['search_seeds']}"
        )
    out = write_results(
        args.json,
        args,
        "Overall (fraction); paired differences over the held-out seeds, 95% Student-t; summary "
        "intervals: Student-t over search seeds",
        rows=rows,
        summary=summary,
        wall_s=round(time.monotonic() - t0, 1),
        load_average=loads,
    )
    print(f"written {out}")


if __name__ == "__main__":
    main()
