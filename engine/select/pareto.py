"""Pareto objectives, non-dominated layers and the strength U_pareto in [0, 1].

All objectives are turned into "higher is better" columns (a ``-`` prefix minimizes); a missing value
is the worst possible (-inf). Layer 0 is the non-dominated front; U_pareto = 1 - layer / (L - 1)
over the L layers of the population (1 for everyone when L == 1).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from operator import itemgetter, methodcaller

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
    if n and objectives:
        try:  # every node measured every objective (the default objectives are shared ones)
            whole = np.array(list(map(itemgetter(*(k for k, _ in objectives)), metric_dicts)))
            whole = whole.reshape(n, len(objectives)).astype(float)
        except (KeyError, TypeError, ValueError, OverflowError):
            whole = None  # one missing, None or not a number: column by column below
        if whole is not None:
            fin = np.isfinite(whole)
            y[fin] = (whole * np.array([s for _, s in objectives]))[fin]
            return y
    for j, (key, sign) in enumerate(objectives):
        try:  # each mapping's get(key, nan), called from C: no Python frame per value
            col = np.fromiter(map(methodcaller("get", key, nan), metric_dicts), float, count=n)
        except TypeError:  # a value recorded as None (missing): read one by one
            col = np.fromiter(
                (nan if (v := m.get(key)) is None else v for m in metric_dicts), float, count=n
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


LAYER_BATCH = 256
"""rows placed per step of :func:`_layers_nd` (its work inside a batch grows with the batch squared)"""


def _packed(ranks: np.ndarray) -> tuple[list[np.ndarray], list[np.uint64]]:
    """Columns of non-negative integers [n, d] packed several to a 64-bit word, each field with a
    guard bit above it: with ``g`` a word's guard bits, ``((q | g) - p) & g == g`` exactly when every
    field of q is >= that field of p (no field borrows from the next). Returns the words (without the
    guard bits) and each word's guard mask."""
    n, d = ranks.shape
    bits = max(1, int(ranks.max(initial=0)).bit_length())
    per = max(1, 64 // (bits + 1))
    words, guards = [], []
    for s in range(0, d, per):
        w, g = np.zeros(n, dtype=np.uint64), 0
        for f, j in enumerate(range(s, min(d, s + per))):
            shift = f * (bits + 1)
            w |= ranks[:, j].astype(np.uint64) << np.uint64(shift)
            g |= 1 << (shift + bits)
        words.append(w)
        guards.append(np.uint64(g))
    return words, guards


def _dominated(act, front, s, start, size, buf, p_words, guards) -> np.ndarray:
    """For each row ``s + act[i]``: does some row of front ``front[i]`` dominate it (every packed
    field >= its own)?"""
    sz = size[front]
    offs = np.zeros(act.size, dtype=np.int64)
    np.cumsum(sz[:-1], out=offs[1:])
    mem = np.arange(int(offs[-1] + sz[-1]), dtype=np.int64)
    mem += np.repeat(start[front] - offs, sz)
    ok = None
    for w, p, g in zip(buf, p_words, guards):
        t = w[mem]
        t -= np.repeat(p[s + act], sz)
        t &= g
        c = t == g
        ok = c if ok is None else np.logical_and(ok, c, out=ok)
    return np.logical_or.reduceat(ok, offs)


def _layers_nd(y: np.ndarray, batch: int = LAYER_BATCH) -> np.ndarray:
    """Non-dominated sorting for m >= 3 objectives without comparing every pair.

    A row's layer is one more than the largest layer among the rows that dominate it (0 if none).
    Distinct rows are visited in descending lexicographic order, so a row's dominators all come before
    it (duplicates share a layer; a missing value ranks below its column's finite minimum). Each front
    F_k holds the rows placed so far with layer k; "some row of F_k dominates p" is true for every
    k below p's layer and false from it on (a dominator in F_k has one in F_(k-1), which dominates p
    too), so p's layer among earlier batches is found by search over the fronts, for a whole batch
    of rows at once: galloping from the previous batch's median layer (rows near in this order tend
    to lie in near layers), then bisecting; dominance inside the batch is then a [batch, batch] comparison and a
    longest-path pass. Columns are compared as dense integer ranks packed into 64-bit words
    (:func:`_packed`), a few comparisons per pair. Work: at most about 2 N log2(L) front tests of
    (mean front size) pairs each, far fewer when the guess is near, plus N * batch inside the
    batches; memory O(N)."""
    y = np.array(y, dtype=float)
    m = y.shape[1]
    for j in range(m):  # missing (-inf) -> below the column's finite minimum
        col = y[:, j]
        fin = np.isfinite(col)
        col[~fin] = col[fin].min() - 1.0 if fin.any() else 0.0
    y += 0.0  # -0.0 -> 0.0: equal values, one row
    order = np.lexsort(y.T[::-1])[::-1]  # descending by column 0, then 1, ...
    ys = y[order]
    new = np.ones(len(ys), dtype=bool)
    new[1:] = (ys[1:] != ys[:-1]).any(axis=1)
    uid = np.cumsum(new) - 1
    inv = np.empty(len(y), dtype=np.intp)
    inv[order] = uid  # row -> its distinct row, in visiting order
    u = ys[new]
    n = len(u)
    # column 0 of an earlier row is never smaller: only columns 1.. are compared
    ranks = np.column_stack(
        [np.unique(u[:, j], return_inverse=True)[1].reshape(-1) for j in range(1, m)]
    )
    p_words, guards = _packed(ranks)
    q_words = [w | g for w, g in zip(p_words, guards)]
    nw = len(p_words)
    out = np.empty(n, dtype=np.int64)
    # the fronts' rows (their q words), each front a region of one flat buffer that moves to the
    # end with twice the room when it fills
    cap = max(4 * n, 64)
    buf = [np.empty(cap, dtype=np.uint64) for _ in range(nw)]
    start = np.zeros(0, dtype=np.int64)
    size = np.zeros(0, dtype=np.int64)
    room = np.zeros(0, dtype=np.int64)
    used = 0
    guess = 0
    upper = np.triu(np.ones((batch, batch), dtype=bool), 1)  # [a, b]: a comes before b
    for s in range(0, n, batch):
        e = min(n, s + batch)
        b = e - s
        fronts = len(start)
        # lo = the first front with no dominator of the row among earlier batches, found by
        # galloping from a guess (the previous batch's median layer: rows near in this order tend
        # to lie in near layers), then bisecting
        lo = np.zeros(b, dtype=np.int64)
        hi = np.full(b, fronts, dtype=np.int64)
        if fronts:
            probe = np.full(b, min(guess, fronts - 1), dtype=np.int64)
            step = np.zeros(b, dtype=np.int64)  # 0: first probe; then +-1, +-2, +-4, ...
            act = np.arange(b)
            while act.size:
                dom = _dominated(act, probe[act], s, start, size, buf, p_words, guards)
                pa, st = probe[act], step[act]
                lo[act] = np.where(dom, pa + 1, lo[act])
                hi[act] = np.where(dom, hi[act], pa)
                up = np.where(st == 0, dom, st > 0)  # the direction, fixed by the first probe
                st = np.where(st == 0, np.where(dom, 1, -1), st * 2)
                go = np.where(up, dom, ~dom)  # still on the side it started from
                step[act], probe[act] = st, pa + st
                nxt = probe[act]
                act = act[go & (nxt >= lo[act]) & (nxt < hi[act])]
        act = np.flatnonzero(lo < hi)
        while act.size:
            mid = (lo[act] + hi[act]) >> 1
            dom = _dominated(act, mid, s, start, size, buf, p_words, guards)
            lo[act] = np.where(dom, mid + 1, lo[act])
            hi[act] = np.where(dom, hi[act], mid)
            act = act[lo[act] < hi[act]]
        # inside the batch: a dominates b when a comes first and no column of a is smaller
        inside = upper[:b, :b].copy()
        for j in range(nw):
            t = q_words[j][s:e, None] - p_words[j][None, s:e]
            t &= guards[j]
            inside &= t == guards[j]
        lay = lo
        if inside.any():
            while True:  # longest path; as many rounds as the longest chain inside the batch
                nxt = np.maximum(lo, np.where(inside, lay[:, None] + 1, 0).max(axis=0))
                if np.array_equal(nxt, lay):
                    break
                lay = nxt
        out[s:e] = lay
        guess = int(np.median(lay))
        top = int(lay.max()) + 1
        if top > fronts:
            more = np.zeros(top - fronts, dtype=np.int64)
            start, size, room = (np.concatenate([a, more]) for a in (start, size, room))
        by_layer = np.argsort(lay, kind="stable") + s
        counts = np.bincount(lay, minlength=top)
        pos = 0
        for k in np.flatnonzero(counts).tolist():
            c = int(counts[k])
            rows = by_layer[pos : pos + c]
            pos += c
            need = int(size[k]) + c
            if need > room[k]:  # move the front to the end, with twice the room
                grow = max(2 * need, 16)
                if used + grow > cap:
                    cap = 2 * (used + grow)
                    buf = [np.concatenate([w[:used], np.empty(cap - used, np.uint64)]) for w in buf]
                a0, a1 = int(start[k]), int(start[k] + size[k])
                for w in buf:
                    w[used : used + a1 - a0] = w[a0:a1]
                start[k], room[k] = used, grow
                used += grow
            a = int(start[k] + size[k])
            for w, q in zip(buf, q_words):
                w[a : a + c] = q[rows]
            size[k] = need
    return out[inv]


def strength(layer: np.ndarray) -> np.ndarray:
    """U_pareto = 1 - layer / (L - 1), in [0, 1]."""
    if layer.size == 0:
        return np.zeros(0)
    top = int(layer.max())
    return np.ones(len(layer)) if top == 0 else 1.0 - layer / top
