"""One parent selection over synthetic archives of 1k and 10k evaluated nodes (in-memory Node dicts).

Target: <= 2 s at 10k. Prints per size: total time (best and median of --repeat), the Pareto
layering, the descendant gain pass and the mechanism features, and the ratio to the 1k run measured
in the same process.
Run: .venv/bin/python benchmarks/bench_select.py [--sizes 1000 10000] [--git 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.archive.store import Node, _assign_depths  # noqa: E402
from engine.config import Config
from engine.select import select_parents
from engine.select.features import code_vector, descendant_gain
from engine.select.pareto import default_objectives, layers, objective_matrix

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


def synthetic(n: int, seed: int = 0) -> tuple[dict[str, Node], dict[str, str]]:
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
        status = "failed" if rng.random() < 0.05 else "evaluated"
        nodes[name] = Node(
            name=name,
            commit="0" * 40,
            parents=parent,
            status=status,
            created=float(i),
            results={"metrics": metrics} if status == "evaluated" else None,
        )
        sources[name] = TEMPLATE.format(line=LINES[i % len(LINES)], scale=int(rng.integers(1, 50)))
    _assign_depths(nodes)
    return nodes, sources


def timed(fn, *a, **kw):
    t = time.perf_counter()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cfg = Config()
    select_parents(synthetic(50)[0], cfg)  # warm-up: sklearn import
    ref = None
    print(
        f"{'nodes':>7} {'select_s':>9} {'median_s':>9} {'pareto_s':>9} {'gain_s':>8} {'code_s':>8} "
        f"{'layers':>7} {'ratio_vs_first':>15}"
    )
    for n in args.sizes:
        nodes, sources = synthetic(n)
        runs = sorted(
            timed(select_parents, nodes, cfg, sources=sources)[1] for _ in range(args.repeat)
        )
        best, median = runs[0], float(np.median(runs))
        ms = [v.metrics for v in nodes.values() if v.results]
        y = objective_matrix(ms, default_objectives(ms, "overall", 0.0))
        lay, t_par = timed(layers, y)
        util = {k: v.overall for k, v in nodes.items()}
        _, t_gain = timed(descendant_gain, nodes, util, 3, 0.8, 0.05)
        _, t_code = timed(lambda src=sources: [code_vector(s) for s in src.values()])
        ref = ref or best
        print(
            f"{n:>7} {best:>9.3f} {median:>9.3f} {t_par:>9.3f} {t_gain:>8.3f} {t_code:>8.3f} "
            f"{int(lay.max()) + 1:>7} {best / ref:>15.2f}"
        )
    print(
        "target: select <= 2 s at 10k nodes (machine shared; timings are inflated by other load); "
        f"load average: {' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )


if __name__ == "__main__":
    main()
