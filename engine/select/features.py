"""Node features for the selector: mechanism vectors and the discounted top-K descendant gain.

Mechanism vector: a behavioural fingerprint when every node carries ``fingerprint.json``, else code
features of ``algorithm.py`` — identifier/operator tokens (comments and string literals dropped),
hashed into ``DIMS`` buckets, square-rooted counts, L2-normalised.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from itertools import repeat
from typing import Any

import numpy as np

DIMS = 64
FINGERPRINT = "fingerprint.json"
_STRINGS = re.compile(r'("""|\'\'\')[\s\S]*?\1|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')
_COMMENT = re.compile(r"#[^\n]*")
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\*\*|//|[-+*/<>=!]=?|[%@&|^~]")


def code_vector(src: str, dims: int = DIMS) -> np.ndarray:
    """[dims] hashed token histogram of Python source (sqrt counts, unit L2 norm)."""
    text = _COMMENT.sub("", _STRINGS.sub(" ", src))
    v = np.zeros(dims)
    for tok in _TOKEN.findall(text):
        v[zlib.crc32(tok.encode()) % dims] += 1.0
    v = np.sqrt(v)
    norm = np.linalg.norm(v)
    return v / norm if norm > 0 else v


_CODE_CACHE: OrderedDict[bytes, np.ndarray] = OrderedDict()
CODE_CACHE_SIZE = 16384
"""code vectors kept per process (LRU, keyed by a hash of the source; 64 floats each, ~8 MiB full)"""


def cached_code_vector(src: str) -> np.ndarray:
    """:func:`code_vector` memoised across calls in this process by the source's BLAKE2b digest
    (read-only array)."""
    key = hashlib.blake2b(src.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    vec = _CODE_CACHE.get(key)
    if vec is not None:
        _CODE_CACHE.move_to_end(key)
        return vec
    vec = code_vector(src)
    vec.flags.writeable = False
    _CODE_CACHE[key] = vec
    if len(_CODE_CACHE) > CODE_CACHE_SIZE:
        _CODE_CACHE.popitem(last=False)
    return vec


def fingerprint_vector(blob: Any) -> tuple[tuple[str, ...], np.ndarray] | None:
    """``{"vector": [...]}``, a list of numbers, or a flat ``{name: number}`` -> (keys, vector)."""
    if isinstance(blob, (bytes, str)):
        try:
            blob = json.loads(blob)
        except (ValueError, RecursionError):  # not JSON, too deeply nested, an int of > 4300 digits
            return None
    if isinstance(blob, dict) and isinstance(blob.get("vector"), list):
        blob = blob["vector"]
    if isinstance(blob, list):
        keys: tuple[str, ...] = tuple(str(i) for i in range(len(blob)))
        vals = blob
    elif isinstance(blob, dict):
        keys = tuple(
            sorted(
                k
                for k, v in blob.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            )
        )
        vals = [blob[k] for k in keys]
    else:
        return None
    try:
        arr = np.asarray(vals, dtype=float)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond the float range
        return None
    if arr.ndim != 1 or arr.size == 0 or not np.isfinite(arr).all():
        return None
    return keys, arr


HUGE = 1e150
"""a column whose magnitude exceeds this is rescaled before standardising: its variance would overflow"""


def scaled_into_range(a: np.ndarray) -> np.ndarray:
    """``a`` with each column (a 1-D array: as one column) whose largest magnitude exceeds
    :data:`HUGE` divided by that magnitude, so that its mean, span and variance do not overflow;
    ``a`` itself when there is none. Standardising and min-max scaling are scale-free, so only values
    near the float limit (a hand edit, a number of unknown scale) are affected. NaN is ignored."""
    top = np.max(np.abs(np.nan_to_num(a, nan=0.0)), axis=0, initial=0.0)
    big = top > HUGE
    if not np.any(big):
        return a
    return a / np.where(big, top, 1.0)


def mechanism_matrix(
    names: list[str],
    sources: Mapping[str, str] | None,
    fingerprints: Mapping[str, Any] | None,
    fallback: np.ndarray,
) -> tuple[np.ndarray, str]:
    """[N, D] mechanism vectors and their kind: ``fingerprint`` | ``code`` | ``metrics`` (``fallback``)."""
    if fingerprints and names:
        parsed = [
            fingerprint_vector(fingerprints.get(n)) if fingerprints.get(n) is not None else None
            for n in names
        ]
        if all(p is not None for p in parsed) and len({p[0] for p in parsed}) == 1:  # type: ignore[index]
            mat = scaled_into_range(np.stack([p[1] for p in parsed]))  # type: ignore[index]
            sd = mat.std(axis=0)
            mat = (mat - mat.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
            return mat / math.sqrt(mat.shape[1]), "fingerprint"
    if sources and names and all(n in sources for n in names):
        # one vector per distinct source, then one row per node by index
        which: dict[str, int] = {}
        vecs = []
        at = []
        for src in map(sources.__getitem__, names):
            j = which.get(src)
            if j is None:
                j = which[src] = len(vecs)
                vecs.append(cached_code_vector(src))
            at.append(j)
        return np.stack(vecs)[np.array(at, dtype=np.intp)], "code"
    return fallback, "metrics"


def order_by(keys: np.ndarray, names: list[str]) -> np.ndarray:
    """Indices that sort ``keys`` ascending, equal keys by ``names`` (the order of
    ``sorted(range(len(keys)), key=lambda i: (keys[i], names[i]))``): one array sort, then a name
    sort inside each run of equal keys only. With a NaN among the keys, that Python sort itself."""
    keys = np.asarray(keys, dtype=float)
    if np.isnan(keys).any():
        return np.array(sorted(range(len(keys)), key=lambda i: (keys[i], names[i])), dtype=np.intp)
    order = np.argsort(keys, kind="stable")
    ks = keys[order]
    tie = np.flatnonzero(ks[1:] == ks[:-1])
    if tie.size:
        # runs of equal keys: [a, b) where a run starts at a tie not preceded by one
        starts = tie[np.r_[True, tie[1:] != tie[:-1] + 1]]
        ends = tie[np.r_[tie[1:] != tie[:-1] + 1, True]] + 2
        for a, b in zip(starts.tolist(), ends.tolist()):
            run = order[a:b].tolist()
            order[a:b] = sorted(run, key=names.__getitem__)
    return order


def gain_arrays(
    names: list[str],
    util: np.ndarray,
    has_u: np.ndarray,
    child: np.ndarray,
    parent: np.ndarray,
    top_k: int,
    gamma: float,
    beta: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`descendant_gain` on integer node ids ``0..n-1`` (``names`` in the mapping's order):
    ``util`` [n] (read where ``has_u``), the distinct (child, parent) edges between nodes.
    Returns (gain [n], has_gain [n], evaluated descendants [n], int).

    Nodes are placed a generation of the topological peel at a time (all of a node's children
    before it): each node's candidates (its evaluated children at depth 1, their top-K lists one
    deeper) are sorted as arrays by (node, -rank, depth), the first of each (node, descendant)
    kept (its shortest depth) and the first K of each node's. Nodes left on a cycle (malformed
    trailers) are then visited one by one in ``names`` order, a child not yet visited counting as
    having no descendants, as before."""
    n = len(names)
    k = max(int(top_k), 1)
    u = np.asarray(util, dtype=float)
    has_u = np.asarray(has_u, dtype=bool)
    child = np.asarray(child, dtype=np.intp)
    parent = np.asarray(parent, dtype=np.intp)
    # (U, name) order as one integer per evaluated node
    ev = np.flatnonzero(has_u)
    rank = np.full(n, -1, dtype=np.int64)
    rank[ev[order_by(u[ev], [names[i] for i in ev.tolist()])]] = np.arange(ev.size)
    of_rank = np.empty(ev.size, dtype=np.intp)
    of_rank[rank[ev]] = ev
    # children by parent and parents by child (CSR)
    by_p = np.argsort(parent, kind="stable")
    kid = child[by_p]
    n_kids = np.bincount(parent, minlength=n)
    kid_at = np.zeros(n + 1, dtype=np.intp)
    np.cumsum(n_kids, out=kid_at[1:])
    by_c = np.argsort(child, kind="stable")
    par = parent[by_c]
    n_par = np.bincount(child, minlength=n)
    par_at = np.zeros(n + 1, dtype=np.intp)
    np.cumsum(n_par, out=par_at[1:])

    top_r = np.full((n, k), -1, dtype=np.int64)  # ranks of each node's top-K, best first
    top_d = np.zeros((n, k), dtype=np.int64)
    count = np.zeros(n, dtype=np.int64)
    done = np.zeros(n, dtype=bool)
    pending = n_kids.copy()
    front = np.flatnonzero(pending == 0)  # leaves: no descendants
    while front.size:
        done[front] = True
        # this generation's parents: a parent is placed once its last child is
        lens = n_par[front]
        if not lens.any():
            break
        e = _ranges(par_at[front], lens)
        up, hits = np.unique(par[e], return_counts=True)
        pending[up] -= hits
        front = up[pending[up] == 0]
        if front.size:
            count = _place(front, kid, kid_at, n_kids, has_u, rank, top_r, top_d, count, k)
    rest = np.flatnonzero(~done)
    if rest.size:
        count = _place_one_by_one(rest, kid, kid_at, has_u, rank, top_r, top_d, count, done, k)

    # y_d = mean over the top-K of gamma^depth * tanh((U(c) - U(d)) / beta), summed left to right
    has_gain = has_u & (top_r[:, 0] >= 0)
    who = np.flatnonzero(has_gain)
    gain = np.zeros(n)
    if who.size:
        tr, td = top_r[who], top_d[who]
        ok = tr >= 0
        pw = np.array([gamma**i for i in range(int(td.max()) + 1)])
        if beta == 0:
            raise ZeroDivisionError("float division by zero")  # as float arithmetic raises
        with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN silently, as floats do
            diff = (u[of_rank[np.where(ok, tr, 0)]] - u[who][:, None]) / beta
        th = np.array([math.tanh(v) for v in diff[ok].tolist()])
        vals = np.zeros(tr.shape)
        vals[ok] = pw[td[ok]] * th
        length = ok.sum(axis=1)
        total = vals[:, 0].copy()
        for j in range(1, k):
            total += vals[:, j]
        mean = total / length
        long = np.flatnonzero(length >= 8)  # numpy's pairwise sum, as np.mean of the list gave
        for i in long.tolist():
            mean[i] = float(np.mean(vals[i, : length[i]]))
        gain[who] = mean
    return gain, has_gain, count


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The concatenated index ranges [starts[i], starts[i] + lens[i])."""
    total = int(lens.sum())
    offs = np.zeros(len(lens), dtype=np.intp)
    np.cumsum(lens[:-1], out=offs[1:])
    out = np.arange(total, dtype=np.intp)
    out += np.repeat(starts - offs, lens)
    return out


def _place(front, kid, kid_at, n_kids, has_u, rank, top_r, top_d, count, k) -> np.ndarray:
    """Top-K lists and descendant counts of ``front``, whose children are all placed. Returns the
    counts: int64 until a count nears 2^63 (paths multiply where crossovers join lineages), then
    Python integers, as the counts were before."""
    lens = n_kids[front]
    e = _ranges(kid_at[front], lens)
    ch = kid[e]
    owner = np.repeat(np.arange(front.size), lens)
    offs = np.zeros(front.size, dtype=np.intp)
    np.cumsum(lens[:-1], out=offs[1:])
    if count.dtype != object and (np.add.reduceat(count[ch].astype(float), offs).max() >= 2.0**62):
        count = count.astype(object)
    count[front] = np.add.reduceat(has_u[ch] + count[ch], offs)
    own = has_u[ch]
    tr = top_r[ch]
    ok = tr >= 0
    p = np.concatenate([owner[own], np.broadcast_to(owner[:, None], tr.shape)[ok]])
    r = np.concatenate([rank[ch[own]], tr[ok]])
    if not r.size:
        return count
    d = np.concatenate([np.ones(int(own.sum()), dtype=np.int64), top_d[ch][ok] + 1])
    o = np.lexsort((d, -r, p))
    p, r, d = p[o], r[o], d[o]
    first = np.ones(p.size, dtype=bool)  # a descendant's first entry has its shortest depth
    first[1:] = (p[1:] != p[:-1]) | (r[1:] != r[:-1])
    p, r, d = p[first], r[first], d[first]
    start = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])
    pos = np.arange(p.size) - np.repeat(start, np.diff(np.r_[start, p.size]))
    keep = pos < k
    rows = front[p[keep]]
    top_r[rows, pos[keep]] = r[keep]
    top_d[rows, pos[keep]] = d[keep]
    return count


def _place_one_by_one(rest, kid, kid_at, has_u, rank, top_r, top_d, count, done, k) -> np.ndarray:
    """Nodes on or above a cycle, one at a time: a child not yet placed has no descendants."""
    for name in rest.tolist():
        cand: dict[int, int] = {}
        total = 0
        for ch in kid[kid_at[name] : kid_at[name + 1]].tolist():
            if has_u[ch]:
                cand[int(rank[ch])] = 1
                total += 1
            if not done[ch]:
                continue
            total += int(count[ch])  # a Python int: no overflow
            for c, dep in zip(top_r[ch].tolist(), top_d[ch].tolist()):
                if c < 0:
                    break
                dep += 1
                if cand.get(c, dep + 1) > dep:
                    cand[c] = dep
        best = sorted(cand, reverse=True)[:k]
        top_r[name, : len(best)] = best
        top_d[name, : len(best)] = [cand[c] for c in best]
        if total >= 2**62 and count.dtype != object:
            count = count.astype(object)
        count[name] = total
        done[name] = True
    return count


def descendant_gain(
    nodes: Mapping[str, Any],
    util: Mapping[str, float | None],
    top_k: int,
    gamma: float,
    beta: float,
) -> tuple[dict[str, float], dict[str, int]]:
    """y_d = mean over the top-K descendants c of d (by U; fewer if fewer) of
    gamma^depth(c,d) * tanh((U(c) - U(d)) / beta), for every d with U(d) and an evaluated descendant.

    depth(c, d) is the shortest number of generations. Computed bottom-up (:func:`gain_arrays`):
    the top-K of a union of descendant sets is inside the union of the children's top-K lists
    (exact, ties by name). Returns ({d: y_d}, {d: number of evaluated descendants})."""
    names = list(nodes)
    index = {n: i for i, n in enumerate(names)}
    child, parent = edges(names, [nodes[n].parents for n in names], index)
    vals = [util.get(n) for n in names]
    has_u = np.array([v is not None for v in vals], dtype=bool)
    u = np.array([0.0 if v is None else v for v in vals], dtype=float)
    gain, has_gain, count = gain_arrays(names, u, has_u, child, parent, top_k, gamma, beta)
    gains = {
        names[i]: g for i, g in zip(np.flatnonzero(has_gain).tolist(), gain[has_gain].tolist())
    }
    return gains, dict(zip(names, count.tolist()))


def edges(
    names: list[str], parents: list[tuple[str, ...]], index: Mapping[str, int]
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (child, parent) pairs as two integer arrays, ordered by child then parent;
    parents outside ``index`` left out."""
    n = len(names)
    lens = np.fromiter(map(len, parents), dtype=np.intp, count=n)
    flat = [p for ps in parents for p in ps]
    pa = np.fromiter(map(index.get, flat, repeat(-1)), dtype=np.intp, count=len(flat))
    ch = np.repeat(np.arange(n, dtype=np.intp), lens)
    inside = pa >= 0
    ch, pa = ch[inside], pa[inside]
    if lens.size and lens.max() > 1:  # a crossover may name a parent twice: once is an edge
        pair = np.unique(ch * max(n, 1) + pa)
        ch, pa = pair // max(n, 1), pair % max(n, 1)
    return ch, pa
