"""Node features for the selector: mechanism vectors and the discounted top-K descendant gain.

Mechanism vector: a behavioural fingerprint when every node carries ``fingerprint.json``, else code
features of ``algorithm.py`` — identifier/operator tokens (comments and string literals dropped),
hashed into ``DIMS`` buckets, square-rooted counts, L2-normalised.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import re
import zlib
from collections import OrderedDict
from collections.abc import Mapping
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
        memo: dict[str, np.ndarray] = {}
        rows = []
        for n in names:
            src = sources[n]
            if src not in memo:
                memo[src] = cached_code_vector(src)
            rows.append(memo[src])
        return np.stack(rows), "code"
    return fallback, "metrics"


def _mean(vals: list[float]) -> float:
    """``float(np.mean(vals))`` bit for bit, without numpy's per-call cost on short lists (numpy sums
    fewer than 8 values left to right)."""
    if len(vals) >= 8:
        return float(np.mean(vals))
    s = 0.0
    for v in vals:
        s += v
    return s / len(vals)


def descendant_gain(
    nodes: Mapping[str, Any],
    util: Mapping[str, float | None],
    top_k: int,
    gamma: float,
    beta: float,
) -> tuple[dict[str, float], dict[str, int]]:
    """y_d = mean over the top-K descendants c of d (by U; fewer if fewer) of
    gamma^depth(c,d) * tanh((U(c) - U(d)) / beta), for every d with U(d) and an evaluated descendant.

    depth(c, d) is the shortest number of generations. Computed bottom-up in one pass: the top-K of a
    union of descendant sets is inside the union of the children's top-K lists (exact, ties by name).
    Returns ({d: y_d}, {d: number of evaluated descendants})."""
    kids: dict[str, list[str]] = {}
    for n in nodes.values():
        for p in n.parents:
            if p in nodes:
                kids.setdefault(p, []).append(n.name)
    pending = {name: len(set(kids.get(name, ()))) for name in nodes}
    ready = [name for name, c in pending.items() if c == 0]
    top: dict[str, dict[str, int]] = {}  # node -> {descendant: depth}, at most top_k entries
    count: dict[str, int] = {}
    order: list[str] = []
    while ready:
        name = ready.pop()
        order.append(name)
        for p in set(nodes[name].parents):
            if p in pending:
                pending[p] -= 1
                if pending[p] == 0:
                    ready.append(p)
    done = set(order)
    order += [n for n in nodes if n not in done]  # cycles (malformed trailers): best effort
    kid_sets = {p: set(ch) for p, ch in kids.items()}
    # (U, name) order as one integer per node: a C-level sort key
    rank = {
        c: i
        for i, c in enumerate(
            sorted((c for c in nodes if util.get(c) is not None), key=lambda c: (util[c], c))
        )
    }
    key = rank.__getitem__
    gains: dict[str, float] = {}
    empty: dict[str, int] = {}
    for name in order:
        if name not in kid_sets:  # a leaf: no descendants, no gain
            top[name] = empty
            count[name] = 0
            continue
        cand: dict[str, int] = {}
        total = 0
        for ch in kid_sets.get(name, ()):
            if util.get(ch) is not None:
                cand[ch] = 1
                total += 1
            total += count.get(ch, 0)
            for c, dep in top.get(ch, empty).items():
                dep += 1
                if cand.get(c, dep + 1) > dep:
                    cand[c] = dep
        best = (
            heapq.nlargest(top_k, cand, key=key)
            if len(cand) > top_k
            else sorted(cand, key=key, reverse=True)
        )
        top[name] = {c: cand[c] for c in best}
        count[name] = total  # counts paths in DAGs with crossovers: an upper bound there
        u = util.get(name)
        if best and u is not None:
            vals = [gamma ** cand[c] * math.tanh((util[c] - u) / beta) for c in best]
            gains[name] = _mean(vals)
    return gains, count
