"""Pareto objectives, non-dominated layers and the strength U_pareto in [0, 1].

All objectives are turned into "higher is better" columns (a ``-`` prefix minimizes); a missing value
is the worst possible (-inf). Layer 0 is the non-dominated front; U_pareto = 1 - layer / (L - 1)
over the L layers of the population (1 for everyone when L == 1).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

import numpy as np

from engine.config import has_length_directive, is_length_like, metric_direction, objective_entry

MAX_DEFAULT_OBJECTIVES = 8
"""at most this many per-benchmark metrics enter the default objective vector"""


def parse_objectives(spec: Sequence[str], exp=None) -> list[tuple[str, float]]:
    """``["overall", "-mean_length"]`` -> ``[("overall", 1.0), ("mean_length", -1.0)]``.

    ``-`` minimizes and ``+`` maximizes; a bare name takes its direction from ``exp``
    (``engine.config.metric_direction``: poise.toml, else min for lengths under a length directive)."""
    out = []
    for item in spec:
        item = objective_entry(item)
        name = item.lstrip("-+").strip()
        if item.startswith("-"):
            sign = -1.0
        elif item.startswith("+") or exp is None:
            sign = 1.0
        else:
            sign = -1.0 if metric_direction(name, exp)[0] == "min" else 1.0
        out.append((name, sign))
    return out


def default_objectives(
    metric_dicts: Sequence[Mapping[str, float]],
    objective: str,
    length_penalty: float,
    exp=None,
) -> list[tuple[str, float]]:
    """The objective, plus the per-benchmark scores (metrics named ``bench/score``, not ``train/…``)
    shared by every node, plus ``-mean_length`` under a length directive (length_penalty > 0).

    Length-like per-benchmark metrics (``hard/mean_length``) enter only under a length directive,
    minimized; every other metric takes its direction from ``exp`` (default: maximized)."""

    def sign(name: str) -> float:
        if exp is None:
            return 1.0
        return -1.0 if metric_direction(name, exp)[0] == "min" else 1.0

    objs = [(objective, sign(objective))]
    if not metric_dicts:
        return objs
    shared = set(metric_dicts[0])
    for m in metric_dicts[1:]:
        shared &= set(m)
    lengths = exp is not None and has_length_directive(exp)
    bench = sorted(
        k
        for k in shared
        if "/" in k
        and not k.startswith(("train/", "-"))
        and k != objective
        and (lengths or not is_length_like(k))
    )
    objs += [(k, sign(k)) for k in bench[:MAX_DEFAULT_OBJECTIVES]]
    if length_penalty > 0 and "mean_length" in shared and objective != "mean_length":
        objs.append(("mean_length", -1.0))
    return objs


def objective_matrix(
    metric_dicts: Sequence[Mapping[str, float]], objectives: Sequence[tuple[str, float]]
) -> np.ndarray:
    """[N, m] matrix, every column "higher is better"; missing values are -inf."""
    n = len(metric_dicts)
    y = np.full((n, len(objectives)), -np.inf)
    nan = float("nan")
    for j, (key, sign) in enumerate(objectives):
        col = np.fromiter(
            (nan if (v := m.get(key)) is None else v for m in metric_dicts), dtype=float, count=n
        )
        fin = np.isfinite(col)
        y[fin, j] = sign * col[fin]
    return y


def layers(y: np.ndarray) -> np.ndarray:
    """Non-dominated sorting of ``y`` [N, m] (maximize every column): the layer index of each row."""
    y = np.asarray(y, dtype=float)
    n = len(y)
    if n == 0:
        return np.zeros(0, dtype=int)
    if y.ndim == 1 or y.shape[1] == 1:
        col = y.reshape(n)
        uniq = np.unique(col)[::-1]
        return np.searchsorted(-uniq, -col).astype(int)
    if y.shape[1] == 2:
        return _layers_2d(y)
    return _layers_nd(y)


def _layers_2d(y: np.ndarray) -> np.ndarray:
    """O(N log N): sort by (y0, y1) descending; each layer's last member has that layer's largest y1,
    and the layers' (y1, y0) keys strictly decrease, so a point joins the first layer it is not
    dominated by (binary search)."""
    order = np.lexsort((-y[:, 1], -y[:, 0]))
    neg_keys: list[tuple[float, float]] = []  # (-y1, -y0) of each layer's last member, increasing
    out = np.empty(len(y), dtype=int)
    for i in order:
        key = (-y[i, 1], -y[i, 0])
        layer = bisect.bisect_left(neg_keys, key)
        if layer == len(neg_keys):
            neg_keys.append(key)
        else:
            neg_keys[layer] = key
        out[i] = layer
    return out


def _bit(i: np.ndarray) -> np.ndarray:
    return np.left_shift(np.uint64(1), (i & 63).astype(np.uint64))


def _layers_nd(y: np.ndarray) -> np.ndarray:
    """Non-dominated sorting with bitsets packed in 64-bit words (N^2/8 bytes): for each objective the
    set {k : y_j[k] >= y_j[i]} is a prefix of that objective's sort order, built by a cumulative OR;
    the dominators of i are the AND over objectives (distinct points only: duplicates share a layer).
    Fronts are peeled by testing ``dominators & remaining`` for emptiness."""
    y = np.array(y, dtype=float)
    m = y.shape[1]
    for j in range(m):  # missing (-inf) -> below the column's finite minimum
        col = y[:, j]
        fin = np.isfinite(col)
        col[~fin] = col[fin].min() - 1.0 if fin.any() else 0.0
    y, inv = np.unique(y, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    n = len(y)
    nw = (n + 63) // 64
    idx = np.arange(n)
    bits = _bit(idx)
    dom: np.ndarray | None = None
    rows = np.empty((n, nw), dtype=np.uint64)
    for j in range(m):
        order = np.argsort(-y[:, j], kind="stable")
        rows.fill(0)
        rows[idx, order >> 6] = bits[order]
        np.bitwise_or.accumulate(rows, axis=0, out=rows)
        vals = -y[order, j]
        last = np.searchsorted(vals, vals, side="right") - 1  # the end of each tie group
        rank = np.empty(n, dtype=np.intp)
        rank[order] = idx
        pre = rows[last[rank]]  # row i: the prefix up to the end of i's tie group
        dom = pre if dom is None else np.bitwise_and(dom, pre, out=dom)
    assert dom is not None
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


def strength(layer: np.ndarray) -> np.ndarray:
    """U_pareto = 1 - layer / (L - 1), in [0, 1]."""
    if layer.size == 0:
        return np.zeros(0)
    top = int(layer.max())
    return np.ones(len(layer)) if top == 0 else 1.0 - layer / top
