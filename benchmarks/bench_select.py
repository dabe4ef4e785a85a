"""One parent selection over synthetic archives of evaluated nodes, in memory (``{name: Node}`` with
typed results and an ``algorithm.py`` source each).

Target: ``select_parents`` <= 2 s at 100k evaluated nodes. Prints per size: the selection's time
(best and median of --repeat, and its least CPU time: on a shared machine wall time is inflated by
other load), its breakdown (the Pareto layering, the descendant-gain pass, the
mechanism features, the crowding distances; with one BLAS thread, as the selection runs them), the
number of Pareto layers, the ratio to the first size measured in the same run, and the previous
bitset layering (quadratic in time and memory) timed on the same objective matrix where it is
affordable (--reference-max nodes), with its ratio to the layering in use. ``--json PATH`` writes
the same figures, one entry per size. ``bench_archive.py`` times the selection from a real git
archive; this one times the selector alone.
Run: python benchmarks/bench_select.py [--sizes 1000 10000 100000] [--repeat 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.archive.results import EvaluationResult, Protocol  # noqa: E402
from engine.archive.store import Node, _assign_depths  # noqa: E402
from engine.config import Config  # noqa: E402
from engine.select import select_parents  # noqa: E402
from engine.select.core import CROWD_REFERENCE, _crowding  # noqa: E402
from engine.select.features import descendant_gain, mechanism_matrix  # noqa: E402
from engine.select.pareto import default_objectives, layers, objective_matrix  # noqa: E402

TARGET_NODES, TARGET_S = 100_000, 2.0
BENCHES = (
    "aime24/pass@32",
    "aime25/pass@32",
    "amc/pass@32",
    "math500/acc@1",
    "minerva/acc@1",
    "olympiad/acc@1",
)
TEMPLATE = """def compute_advantages(batch, cfg):
    scores = batch.rewards.to(torch.float32)
    stats = group_stats(scores, batch.group)
    {line}
    return (scores - stats.mean) / (stats.std + cfg.eps) * {scale}
"""
LINES = [
    "scores = scores.clamp(min=-1.0)",
    "scores = torch.where(valid, scores, -1.0)",
    "stats = stats",
    "scores = scores - 0.1 * length",
    "scores = scores * mask.float()",
    "scores = torch.tanh(scores)",
]
PROTOCOL = Protocol("bench/select", "0" * 64, backend="bench", preset="select")
UNITS = {b: "fraction" for b in BENCHES} | {"overall": "fraction", "mean_length": "tokens"}


def synthetic(n: int, seed: int = 0) -> tuple[dict[str, Node], dict[str, str]]:
    """``n`` nodes, each a child of one of the 200 before it; skill drifts along the lineage; 5% failed."""
    rng = np.random.default_rng(seed)
    nodes: dict[str, Node] = {}
    sources: dict[str, str] = {}
    skill = np.zeros(n)
    for i in range(n):
        name = f"n{i}"
        parent = () if i == 0 else (f"n{int(rng.integers(max(0, i - 200), i))}",)
        skill[i] = 0.0 if i == 0 else skill[int(parent[0][1:])] + rng.normal(0, 0.02)
        scores = np.clip(0.4 + skill[i] + rng.normal(0, 0.03, len(BENCHES)), 0, 1)
        metrics = {b: float(s) for b, s in zip(BENCHES, scores)}
        metrics["overall"] = float(0.2 * scores[0] + 0.2 * scores[1] + 0.15 * scores[2:].sum())
        metrics["mean_length"] = float(rng.uniform(200, 900))
        if rng.random() < 0.05:
            result = EvaluationResult(PROTOCOL, "failed", seeds=(0,), reason="diverged")
        else:
            result = EvaluationResult(PROTOCOL, "evaluated", metrics, UNITS, seeds=(0,))
        nodes[name] = Node(
            name=name,
            commit="0" * 40,
            parents=parent,
            status=result.status,
            created=float(i),
            results={PROTOCOL.id: result},
            result=result,
        )
        sources[name] = TEMPLATE.format(line=LINES[i % len(LINES)], scale=int(rng.integers(1, 50)))
    _assign_depths(nodes)
    return nodes, sources


def bitset_layers(y: np.ndarray) -> np.ndarray:
    """The layering selection used before (kept here as the reference): dominator sets as bitsets
    packed in 64-bit words (N^2/8 bytes), fronts peeled by testing ``dominators & remaining``."""
    y = np.array(y, dtype=float)
    m = y.shape[1]
    for j in range(m):
        col = y[:, j]
        fin = np.isfinite(col)
        col[~fin] = col[fin].min() - 1.0 if fin.any() else 0.0
    y, inv = np.unique(y, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    n = len(y)
    nw = (n + 63) // 64
    idx = np.arange(n)
    bits = np.left_shift(np.uint64(1), (idx & 63).astype(np.uint64))
    dom = None
    rows = np.empty((n, nw), dtype=np.uint64)
    for j in range(m):
        order = np.argsort(-y[:, j], kind="stable")
        rows.fill(0)
        rows[idx, order >> 6] = bits[order]
        np.bitwise_or.accumulate(rows, axis=0, out=rows)
        vals = -y[order, j]
        last = np.searchsorted(vals, vals, side="right") - 1
        rank = np.empty(n, dtype=np.intp)
        rank[order] = idx
        pre = rows[last[rank]]
        dom = pre if dom is None else np.bitwise_and(dom, pre, out=dom)
    dom[idx, idx >> 6] &= ~bits
    remaining = np.zeros(nw, dtype=np.uint64)
    np.bitwise_or.at(remaining, idx >> 6, bits)
    out = np.full(n, -1, dtype=int)
    rem_idx, layer = idx, 0
    while rem_idx.size:
        sub = dom[rem_idx]
        sub &= remaining
        blocked = sub.any(axis=1)
        front = rem_idx[~blocked]
        out[front] = layer
        np.bitwise_and.at(remaining, front >> 6, ~bits[front])
        rem_idx, layer = rem_idx[blocked], layer + 1
    return out[inv]


def timed(fn, *a, **kw):
    t = time.perf_counter()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t


def measure(n: int, cfg: Config, repeat: int, reference_max: int) -> dict:
    nodes, sources = synthetic(n)
    runs, cpu = [], []
    for _ in range(repeat):
        c = time.process_time()
        sel, t = timed(select_parents, nodes, cfg, sources=sources)
        runs.append(t)
        cpu.append(time.process_time() - c)
    runs.sort()
    pop = [k for k, v in nodes.items() if v.evaluated]
    ms = [nodes[k].metrics for k in pop]
    y = objective_matrix(ms, default_objectives(ms, cfg.experiment.objective, 0.0))
    util = {k: v.overall if v.evaluated else None for k, v in nodes.items()}
    sc = cfg.select
    ref = np.sort(np.random.default_rng(0).choice(len(pop), min(len(pop), CROWD_REFERENCE), False))
    with threadpool_limits(limits=1, user_api="blas"):  # as select_parents runs them
        lay, t_lay = timed(layers, y)
        _, t_gain = timed(descendant_gain, nodes, util, sc.top_k, sc.gamma, sc.beta)
        (mech, _), t_feat = timed(mechanism_matrix, pop, sources, None, y)
        _, t_crowd = timed(_crowding, mech, ref)
    row = {
        "nodes": n,
        "evaluated": len(pop),
        "objectives": int(y.shape[1]),
        "select_s": runs[0],
        "select_median_s": float(np.median(runs)),
        "select_cpu_s": min(cpu),
        "layering_s": t_lay,
        "descendant_gain_s": t_gain,
        "features_s": t_feat,
        "crowding_s": t_crowd,
        "layers": int(lay.max()) + 1,
        "chosen": sel.chosen,
        "reference_layering_s": None,
    }
    if n <= reference_max:
        old, t_old = timed(bitset_layers, y)
        if not np.array_equal(old, lay):
            raise SystemExit(f"the layering differs from the bitset reference at {n} nodes")
        row["reference_layering_s"] = t_old
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--reference-max",
        type=int,
        default=20000,
        help="time the previous bitset layering up to this many nodes (N^2/8 bytes of memory)",
    )
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    if min(args.sizes) < 2 or args.repeat < 1:
        ap.error("--sizes must be >= 2 and --repeat >= 1")
    cfg = Config()
    select_parents(synthetic(50)[0], cfg)  # warm-up: sklearn's import
    print(
        f"{'nodes':>7} {'select_s':>9} {'median_s':>9} {'cpu_s':>7} {'layering_s':>10} {'gain_s':>7} "
        f"{'features_s':>10} {'crowding_s':>10} {'layers':>6} {'x_first':>7} "
        f"{'bitset_s':>9} {'bitset_x':>8}"
    )
    rows: list[dict] = []
    for n in args.sizes:
        row = measure(n, cfg, args.repeat, args.reference_max)
        row["ratio_vs_first"] = row["select_s"] / rows[0]["select_s"] if rows else 1.0
        ref = row["reference_layering_s"]
        row["reference_ratio"] = ref / row["layering_s"] if ref else None
        rows.append(row)
        print(
            f"{n:>7} {row['select_s']:>9.3f} {row['select_median_s']:>9.3f} {row['select_cpu_s']:>7.3f} "
            f"{row['layering_s']:>10.3f} {row['descendant_gain_s']:>7.3f} "
            f"{row['features_s']:>10.3f} {row['crowding_s']:>10.3f} {row['layers']:>6} "
            f"{row['ratio_vs_first']:>7.2f} "
            + (f"{ref:>9.3f} {row['reference_ratio']:>8.1f}" if ref else f"{'-':>9} {'-':>8}")
        )
    at = next((r for r in rows if r["nodes"] == TARGET_NODES), None)
    verdict = (
        f"{'met' if at['select_s'] <= TARGET_S else 'MISSED'} ({at['select_s']:.2f} s)"
        if at
        else f"not measured (add {TARGET_NODES} to --sizes)"
    )
    load = os.getloadavg()
    print(
        f"target: select <= {TARGET_S:g} s at {TARGET_NODES} nodes: {verdict}. x_first: select "
        f"time over the first size's; bitset_x: the previous bitset layering's time over the "
        f"layering's, same matrix; cpu_s: the selection's least CPU time (this process, all its "
        f"threads). Load average {' '.join(f'{v:.2f}' for v in load)} "
        "(a shared machine inflates every figure)"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "benchmark": "select",
                    "target": {"nodes": TARGET_NODES, "select_s": TARGET_S},
                    "repeat": args.repeat,
                    "load_average": list(load),
                    "sizes": rows,
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
