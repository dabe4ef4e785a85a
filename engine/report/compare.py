"""Nodes × metrics, as ``poise-git compare`` shows them: every metric with its 95% interval, the
protocol it was measured under, the parent and the gain over it.

``compare(nodes, exp, ...) -> Comparison``. A gain is computed only against a parent measured under
the same protocol (same protocol hash; results of different protocols are never compared); it is
``significant`` when the child's interval clears the parent's in the metric's direction
(``engine.config.metric_direction``), as the loop's promotion rule does for the utility.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.config import ExperimentConfig, metric_direction
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


def result_view(node: Any) -> dict[str, Any] | None:
    """What compare needs of a node's results: protocol id and hash, metrics with intervals."""
    r = node.results
    if not r:
        return None
    metrics = r.get("metrics") or {}
    intervals = r.get("intervals") or {}
    backend = r.get("backend") or r.get("source") or "?"
    preset = r.get("preset")
    proto_hash = r.get("protocol_hash") or ""
    protocol = backend + (f":{preset}" if preset else "")
    cells = {}
    for k, v in metrics.items():
        iv = intervals.get(k)
        lo, hi = (iv[0], iv[1]) if isinstance(iv, (list, tuple)) and len(iv) == 2 else (None, None)
        cells[k] = {"value": v, "lo": lo, "hi": hi}
    return {"protocol": protocol, "protocol_hash": proto_hash, "metrics": cells}


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _gain(child: dict, parent: dict, direction: str) -> dict[str, Any]:
    a, b = _num(child.get("value")), _num(parent.get("value"))
    if a is None or b is None:
        return {"delta": None, "better": None, "significant": None}
    d = a - b
    sign = 1.0 if direction == "max" else -1.0
    better = None if d == 0 else (d * sign > 0)
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


def compare(
    nodes: Mapping[str, Any],
    exp: ExperimentConfig,
    names: list[str] | None = None,
    *,
    statuses: Iterable[str] | None = None,
    protocol: str | None = None,
    metrics: str | None = None,
    sort: str | None = None,
) -> Comparison:
    """The comparison of ``names`` (default: every node with results), filtered by status (default:
    ``evaluated``, or any status when names are given; ``all``: any) and protocol (a substring of
    the protocol id or a prefix of its hash); ``metrics`` a glob (``hard/*``) of columns to keep;
    ``sort`` a metric, best first in its direction (else creation order)."""
    if names:
        unknown = [n for n in names if n not in nodes]
        if unknown:
            raise PoiseError(f"unknown node {unknown[0]!r}")
        chosen = list(dict.fromkeys(names))
    else:
        chosen = [n for n, _ in sorted(nodes.items(), key=lambda kv: (kv[1].created, kv[0]))]
    wanted = set(statuses or (["all"] if names else ["evaluated"]))
    rows, seen_metrics = [], set()
    views = {n: result_view(v) for n, v in nodes.items()}
    for n in chosen:
        node, view = nodes[n], views[n]
        if "all" not in wanted and node.status not in wanted:
            continue
        if protocol and not (
            view and (protocol in view["protocol"] or view["protocol_hash"].startswith(protocol))
        ):
            continue
        parent = node.parents[0] if node.parents else None
        pview = views.get(parent) if parent else None
        same = bool(
            view
            and pview
            and view["protocol_hash"] == pview["protocol_hash"]
            and view["protocol"] == pview["protocol"]
        )
        cells = dict(view["metrics"]) if view else {}
        seen_metrics |= set(cells)
        rows.append(
            {
                "node": n,
                "status": node.status,
                "protocol": view["protocol"] if view else None,
                "protocol_hash": view["protocol_hash"] if view else None,
                "parent": parent,
                "parent_same_protocol": same if pview else None,
                "depth": node.depth,
                "metrics": cells,
                "gain": {},
                "_parent_cells": pview["metrics"] if same else None,
            }
        )
    cols = _metric_order(seen_metrics, exp.objective)
    if metrics:
        pats = [p.strip() for p in metrics.split(",") if p.strip()]
        cols = [c for c in cols if c == exp.objective or any(fnmatch.fnmatch(c, p) for p in pats)]
    directions = {m: metric_direction(m, exp)[0] for m in cols}
    for r in rows:
        pc = r.pop("_parent_cells")
        r["metrics"] = {m: r["metrics"][m] for m in cols if m in r["metrics"]}
        if pc is not None:
            r["gain"] = {
                m: _gain(r["metrics"][m], pc[m], directions[m])
                for m in cols
                if m in r["metrics"] and m in pc
            }
    if sort:
        if sort not in directions:
            known = ", ".join(cols[:12])
            raise PoiseError(f"--sort {sort!r}: no such metric column (metrics: {known}…)")
        sign = -1.0 if directions[sort] == "max" else 1.0

        def key(r: dict) -> tuple:
            v = _num((r["metrics"].get(sort) or {}).get("value"))
            return (v is None, sign * v if v is not None else 0.0)

        rows.sort(key=key)
    return Comparison(cols, rows, directions, sort)


CSV_FIELDS = ("node", "status", "protocol", "protocol_hash", "parent", "depth")


def to_csv_rows(cmp: Comparison) -> tuple[list[str], list[list[Any]]]:
    """A header and rows: the fixed fields, then per metric value, lo, hi, gain over the parent."""
    header = list(CSV_FIELDS)
    for m in cmp.metrics:
        header += [m, f"{m} lo", f"{m} hi", f"{m} gain"]
    out = []
    for r in cmp.rows:
        row = [r[f] for f in CSV_FIELDS]
        for m in cmp.metrics:
            c = r["metrics"].get(m) or {}
            g = (r["gain"].get(m) or {}).get("delta")
            row += [c.get("value"), c.get("lo"), c.get("hi"), g]
        out.append(["" if v is None else v for v in row])
    return header, out
