"""Nodes × metrics, as ``poise-git compare`` shows them: every metric of a node's typed result
(``engine.archive.results.EvaluationResult``) with its unit and 95% interval, the protocol it was
measured under, the parent and the gain over it.

``compare(nodes, exp, ...) -> Comparison``. A gain is computed only against the parent's result
under the same protocol id and hash, metric by metric on the same unit (``results.comparable``;
results of different protocols are never compared, and a sort never ranks them together); it is
``significant`` when the child's interval clears the parent's in the metric's direction
(``engine.config.metric_direction``), as the loop's promotion rule does for the utility.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.archive.results import ProtocolRef, comparable
from engine.config import ExperimentConfig, is_length_like, metric_direction
from engine.errors import PoiseError


@dataclass
class Comparison:
    metrics: list[str]
    """metric columns, the objective first"""
    rows: list[dict[str, Any]]
    directions: dict[str, str] = field(default_factory=dict)
    sort: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "metrics": self.metrics,
            "directions": self.directions,
            "sort": self.sort,
            "rows": self.rows,
        }


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _direction(metric: str, exp: ExperimentConfig) -> str:
    """``max`` | ``min``, or ``none`` for a length nothing asked about (no configured direction,
    no length directive): a shown length is neither better long nor short."""
    d, why = metric_direction(metric, exp)
    return "none" if why == "default" and is_length_like(metric) else d


def _gain(child: dict, parent: dict, direction: str) -> dict[str, Any]:
    a, b = _num(child.get("value")), _num(parent.get("value"))
    if a is None or b is None:
        return {"delta": None, "better": None, "significant": None}
    d = a - b
    sign = 1.0 if direction == "max" else -1.0
    better = None if d == 0 or direction == "none" else (d * sign > 0)
    ci = (_num(child.get("lo")), _num(child.get("hi")))
    pi = (_num(parent.get("lo")), _num(parent.get("hi")))
    sig = None
    if None not in ci and None not in pi:
        sig = ci[0] > pi[1] or ci[1] < pi[0]
    return {"delta": d, "better": better, "significant": sig}


def _metric_order(names: Iterable[str], objective: str) -> list[str]:
    def key(m: str) -> tuple:
        split, _, base = m.rpartition("/")
        return (m != objective, bool(split), split, base)

    return sorted(set(names), key=key)


def _cells(r: Any) -> dict[str, dict[str, Any]]:
    out = {}
    for k, v in r.metrics.items():
        iv = r.interval(k)
        out[k] = {
            "value": float(v),
            "lo": iv[0] if iv else None,
            "hi": iv[1] if iv else None,
            "unit": r.unit(k),
        }
    return out


def compared_protocol(protocol: str | None, exp_protocol: Any):
    """The predicate on a result's Protocol that :func:`compare` keeps results by: ``all``, an id
    (``proxy/smoke``), ``id@hash``, or a family (``proxy``); None: the experiment's configured
    protocol."""
    if protocol == "all":
        return lambda p: True
    if protocol is None:
        return exp_protocol.matches
    text = protocol.strip()
    if "/" not in text and "@" not in text:
        return lambda p: p.id == text or p.id.split("/", 1)[0] == text
    ref = ProtocolRef.parse(text)
    return ref.matches


def compared_protocol_id(protocol: str | None, exp_protocol: Any) -> str | None:
    """The protocol id :func:`compared_protocol` keeps results of, read by the same rules (None for
    ``all`` or a family): results under it with another hash are another version of it."""
    if protocol == "all":
        return None
    if protocol is None:
        return exp_protocol.id
    text = protocol.strip()
    if "/" not in text and "@" not in text:
        return None
    return ProtocolRef.parse(text).id


def compare(
    nodes: Mapping[str, Any],
    exp: ExperimentConfig,
    names: list[str] | None = None,
    *,
    configured: Any = None,
    statuses: Iterable[str] | None = None,
    protocol: str | None = None,
    metrics: str | None = None,
    sort: str | None = None,
) -> Comparison:
    """The comparison of ``names`` (default: every node), one row per node and matching result.

    ``protocol``: the results to show — None: the experiment's ``configured`` protocol (a
    ``ProtocolRef``); an id, ``id@hash``, a family (``proxy``) or ``all`` (one row per node and
    protocol, sorted within each protocol). ``statuses``: node statuses to keep (default
    ``evaluated``, or any when names are given; ``all``: any). ``metrics``: globs of metric columns
    to keep (the objective stays). ``sort``: a metric, best first in its direction, else creation
    order. A node with no matching result appears (metrics empty) only when its status is kept and
    it was named or ``statuses`` asks for it."""
    if names:
        unknown = [n for n in names if n not in nodes]
        if unknown:
            raise PoiseError(f"unknown node {unknown[0]!r}")
        chosen = list(dict.fromkeys(names))
    else:
        chosen = [n for n, _ in sorted(nodes.items(), key=lambda kv: (kv[1].created, kv[0]))]
    wanted = set(statuses or (["all"] if names else ["evaluated"]))
    keep = compared_protocol(protocol, configured)
    rows, seen = [], set()
    for n in chosen:
        node = nodes[n]
        if "all" not in wanted and node.status not in wanted:
            continue
        results = [r for _pid, r in sorted(node.results.items()) if keep(r.protocol)]
        parent = node.parents[0] if node.parents else None
        pnode = nodes.get(parent) if parent else None
        if not results and (names or statuses):
            results = [None]
        for r in results:
            pr = pnode.results.get(r.protocol.id) if (r is not None and pnode is not None) else None
            same = pr is not None and pr.protocol.hash == r.protocol.hash
            cells = _cells(r) if r is not None else {}
            seen |= set(cells)
            rows.append(
                {
                    "node": n,
                    "status": node.status,
                    "result": r.status if r is not None else None,
                    "protocol": r.protocol.id if r is not None else None,
                    "protocol_key": r.protocol.key if r is not None else None,
                    "protocol_hash": r.protocol.hash if r is not None else None,
                    "seeds": list(r.seeds) if r is not None else [],
                    "interval_kind": r.interval_kind if r is not None else "",
                    "parent": parent,
                    "parent_same_protocol": (same if pr is not None else False)
                    if r is not None and parent
                    else None,
                    "depth": node.depth,
                    "metrics": cells,
                    "gain": {},
                    "_pair": (r, pr) if same and r.ok and pr.ok else None,
                }
            )
    cols = _metric_order(seen, exp.objective)
    if metrics:
        pats = [p.strip() for p in metrics.split(",") if p.strip()]
        cols = [c for c in cols if c == exp.objective or any(fnmatch.fnmatch(c, p) for p in pats)]
    directions = {m: _direction(m, exp) for m in cols}
    for row in rows:
        pair = row.pop("_pair")
        row["metrics"] = {m: row["metrics"][m] for m in cols if m in row["metrics"]}
        if pair is not None:
            r, pr = pair
            pc = _cells(pr)
            row["gain"] = {
                m: _gain(row["metrics"][m], pc[m], directions[m])
                for m in cols
                if m in row["metrics"] and m in pc and comparable(r, pr, m)
            }
    if sort:
        if sort not in directions:
            known = ", ".join(cols[:12])
            raise PoiseError(f"--sort {sort!r}: no such metric column (metrics: {known}…)")
        if directions[sort] == "none":
            raise PoiseError(
                f"--sort {sort!r}: the metric has no direction; set it in poise.toml "
                f'([experiment.directions] "{sort}" = "min" or "max")'
            )
        sign = -1.0 if directions[sort] == "max" else 1.0

        def group(r: dict) -> tuple:  # never ranked across protocols, versions or units
            return (r["protocol_key"], (r["metrics"].get(sort) or {}).get("unit"))

        groups = list(dict.fromkeys(group(r) for r in rows))

        def key(r: dict) -> tuple:
            v = _num((r["metrics"].get(sort) or {}).get("value"))
            g = groups.index(group(r))
            return (g, v is None, sign * v if v is not None else 0.0)

        rows.sort(key=key)
    return Comparison(cols, rows, directions, sort)


CSV_FIELDS = (
    "node",
    "status",
    "result",
    "protocol",
    "protocol_hash",
    "seeds",
    "interval_kind",
    "parent",
    "depth",
)


def to_csv_rows(cmp: Comparison) -> tuple[list[str], list[list[Any]]]:
    """A header and rows: the fixed fields (seeds space-separated), then per metric value, lo, hi,
    unit, gain over the parent."""
    header = list(CSV_FIELDS)
    for m in cmp.metrics:
        header += [m, f"{m} lo", f"{m} hi", f"{m} unit", f"{m} gain"]
    out = []
    for r in cmp.rows:
        row = [" ".join(map(str, r[f])) if f == "seeds" else r[f] for f in CSV_FIELDS]
        for m in cmp.metrics:
            c = r["metrics"].get(m) or {}
            g = (r["gain"].get(m) or {}).get("delta")
            row += [c.get("value"), c.get("lo"), c.get("hi"), c.get("unit"), g]
        out.append(["" if v is None else v for v in row])
    return header, out
