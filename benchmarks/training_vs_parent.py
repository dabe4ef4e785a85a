"""Which of a search's changes changed training? Every evaluated child in the discovery benchmark's
archives, read the way its reflection reads it: its training trajectory against its parent's, seed by
seed (:func:`engine.operators.reflect.compare_trajectories`), beside its paired utility difference.

    .venv/bin/python benchmarks/training_vs_parent.py --workdir .cache/discovery-dx [--methods loop] \
        [--json benchmarks/results/training-vs-parent.json]

Each child is one of: a *finding* (a series changed by a finding's size, beyond its paired 95%
interval), *slight* (changes beyond their interval, below that size), *like its parent* (every series'
interval within a finding's size either way: an equivalence) or *unclear*. Children are grouped by
the kind of change they made from their parent (:func:`engine.operators.proposers.moves.features`).
Per-seed tails come from the results (``per_seed[*].trajectory_tail``); results recorded before those
existed are read from the seed's MLflow history in the archive's store, the same numbers. Nothing is
trained: it reads finished searches. Prints the tables and writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import operator
import statistics
from pathlib import Path

from bench_discovery import searched_archives
from proxy_runs import ROOT, write_results

from engine.operators.reflect import READINGS

KINDS = (
    ("kl_coef", "KL weight"),
    ("entropy_coef", "entropy bonus"),
    ("clip_ratio_high", "clip ratios"),
    ("clip_ratio_low", "clip ratios"),
)


def kind(feats: dict, parents: int) -> str:
    """The kind of change a child made from its parent, from its change's features."""
    if parents > 1:
        return "crossover"
    if not feats:
        return "retune (no component or knob changed)"
    knobs = {name for (group, name), v in feats.items() if group == "knob"}
    options = sorted(f"{group}: {name}" for (group, name) in feats if group != "knob")
    if options:
        return (
            "entropy controller" if options[0].startswith("entropy_control") else options[0]
        ) + (" and knobs" if knobs or len(options) > 1 else "")
    names = {dict(KINDS).get(k, k) for k in knobs}
    if names == {"KL weight"}:
        up = feats[("knob", "kl_coef")] > 0
        return "KL weight " + ("up" if up else "down")
    return " and ".join(sorted(names))


def mlflow_tails(archive, result) -> dict[int, dict[str, float]]:
    """seed -> each training series' mean over the last third, from the MLflow run of each of the
    result's seeds (its per-seed rows name them; a confirmation's runs on other seeds are not)."""
    from engine.archive.tracking import mlflow_client
    from engine.operators.reflect import TRAJECTORY_VS_PARENT
    from engine.stats import tail_means

    client = mlflow_client(archive.path)
    step = operator.attrgetter("step")
    out: dict[int, dict[str, float]] = {}
    for row in result.per_seed:
        run_id = row.get("mlflow_run_id")
        if not run_id or row.get("status", "evaluated") != "evaluated":
            continue
        series = {
            key: [m.value for m in sorted(client.get_metric_history(run_id, key), key=step)]
            for key, *_ in TRAJECTORY_VS_PARENT
        }
        out[int(row["seed"])] = tail_means(series)  # as the evaluation computes them
    return out


def with_tails(archive, node):
    """``node`` with per-seed trajectory tails in its result's rows: read from MLflow
    (:func:`mlflow_tails`) where the result was recorded before they existed."""
    from engine.operators.reflect import seed_tails

    res = node.result
    if res is None or not res.ok or seed_tails(res):
        return node
    tails = mlflow_tails(archive, res)
    rows = tuple(
        {**r, "trajectory_tail": tails[int(r["seed"])]} if int(r["seed"]) in tails else r
        for r in res.per_seed
    )
    return dataclasses.replace(node, result=dataclasses.replace(res, per_seed=rows))


def read_archive(path: Path, preset: str) -> list[dict]:
    """One row per child evaluated under ``proxy/<preset>`` whose parent is evaluated there."""
    from engine.archive.store import Archive
    from engine.operators.proposers.moves import change_features
    from engine.operators.proposers.offline import archive_evidence
    from engine.operators.reflect import compare_with_parent
    from engine.select.objective import seed_utilities
    from engine.stats import paired_interval

    archive = Archive(path)
    cfg = archive.config()
    nodes = {n: with_tails(archive, x) for n, x in archive.nodes(f"proxy/{preset}").items()}
    # the hyperparameters each node's code sets: what the learned direction's evidence reads
    evidence = archive_evidence(archive, cfg, nodes, read_code=True)
    rows = []
    for name, node in nodes.items():
        parent = node.parent
        if not parent or parent not in nodes or not node.evaluated or not nodes[parent].evaluated:
            continue
        res, pres = node.result, nodes[parent].result
        c = compare_with_parent(res, pres)
        if c is None:
            continue
        gain = paired_interval(
            seed_utilities(res, cfg.experiment), seed_utilities(pres, cfg.experiment)
        )
        feats = change_features(evidence[name], evidence[parent])
        rows.append(
            {
                "archive": path.name,
                "node": name,
                "parent": parent,
                "kind": kind(feats, len(node.parents)),
                "reading": c.reading,
                "training": c.summary(),
                "findings": c.findings(),
                "gain": gain[0] if gain else None,
                "gain_interval": gain[1] if gain else None,
                "seeds": gain[2] if gain else 0,
            }
        )
    return rows


def table(rows: list[dict], key: str) -> list[dict]:
    out = []
    # most children first, then by name: a set's order follows the process's hash seed
    for k in sorted({r[key] for r in rows}, key=lambda k: (-sum(r[key] == k for r in rows), k)):
        rs = [r for r in rows if r[key] == k]
        gains = [r["gain"] for r in rs if r["gain"] is not None]
        out.append(
            {
                key: k,
                "children": len(rs),
                **{rd: sum(r["reading"] == rd for r in rs) for rd in READINGS},
                "mean_gain": statistics.fmean(gains) if gains else None,
                "above_parent": sum(
                    1 for r in rs if r["gain_interval"] and r["gain_interval"][0] > 0
                ),
                "below_parent": sum(
                    1 for r in rs if r["gain_interval"] and r["gain_interval"][1] < 0
                ),
            }
        )
    return out


def show(rows: list[dict], key: str, title: str) -> None:
    print(f"\n{title}")
    print(
        f"{key:40s} {'n':>3s} {'finding':>7s} {'slight':>6s} {'alike':>5s} {'unclear':>7s} "
        f"{'mean gain':>9s} {'above':>5s} {'below':>5s}"
    )
    for t in table(rows, key):
        g = "—" if t["mean_gain"] is None else f"{t['mean_gain']:+.4f}"
        print(
            f"{t[key][:40]:40s} {t['children']:3d} {t['finding']:7d} {t['slight']:6d} "
            f"{t['like its parent']:5d} {t['unclear']:7d} {g:>9s} {t['above_parent']:5d} "
            f"{t['below_parent']:5d}"
        )


def figure(rows: list[dict], path: Path) -> None:
    """Each child's paired gain over its parent with its 95% interval, by the kind of change it made
    (one row per kind), its marker and colour saying what its training did."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [t["kind"] for t in table(rows, "kind")]
    style = {
        "finding": ("tab:red", "D"),
        "slight": ("tab:orange", "s"),
        "like its parent": ("tab:gray", "o"),
        "unclear": ("tab:blue", "^"),
    }
    # the children of one kind spread over their row, in the order of their gains
    ys = {}
    for k in kinds:
        mine = sorted((r for r in rows if r["kind"] == k), key=lambda r: r["gain"] or 0.0)
        step = min(0.8 / len(mine), 0.12)
        for j, r in enumerate(mine):
            ys[(r["search_seed"], r["node"])] = kinds.index(k) + (j - (len(mine) - 1) / 2) * step
    fig, ax = plt.subplots(figsize=(7.2, 1.2 + 0.6 * len(kinds)))
    for reading, (color, marker) in style.items():
        pts = [r for r in rows if r["reading"] == reading and r["gain"] is not None]
        for i, r in enumerate(pts):
            y = ys[(r["search_seed"], r["node"])]
            iv = r["gain_interval"]
            if iv:
                ax.plot(iv, [y, y], color=color, alpha=0.35, lw=1)
            ax.plot(
                [r["gain"]],
                [y],
                marker=marker,
                color=color,
                ls="",
                label=reading if i == 0 else None,
            )
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(kinds)), kinds, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("paired utility difference to the parent (Overall), 95% interval")
    ax.set_title("What each change did to training, and to the score", fontsize=10)
    ax.legend(fontsize=8, loc="lower right", title="training vs parent", title_fontsize=8)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default=str(ROOT / ".cache" / "discovery"))
    ap.add_argument("--methods", default="loop")
    ap.add_argument("--preset", default="default", help="the searches' proxy preset")
    ap.add_argument("--json", default=None)
    ap.add_argument("--figure", default=None, help="a PNG of every child's gain by kind of change")
    args = ap.parse_args()
    rows = []
    for method, seed, path in searched_archives(Path(args.workdir), args.methods):
        rows += [
            {**r, "method": method, "search_seed": seed} for r in read_archive(path, args.preset)
        ]
    for r in rows:
        g = "—" if r["gain"] is None else f"{r['gain']:+.4f}"
        iv = r["gain_interval"]
        mark = "*" if iv and (iv[0] > 0 or iv[1] < 0) else " "
        print(
            f"s{r['search_seed']} {r['node'][:44]:44s} {g}{mark} {r['kind'][:26]:26s} {r['training']}"
        )
    show(
        rows,
        "kind",
        "by the kind of change (gain: paired utility difference to the parent; "
        "above/below: beyond its 95% interval)",
    )
    show(rows, "reading", "by what the training did")
    if args.figure:
        figure(rows, Path(args.figure))
        print(f"drawn {args.figure}")
    if args.json:
        out = write_results(
            args.json,
            args,
            "utility (Overall) difference to the parent, paired over the search's seeds",
            children=rows,
            by_kind=table(rows, "kind"),
            by_reading=table(rows, "reading"),
        )
        print(f"written {out}")


if __name__ == "__main__":
    main()
