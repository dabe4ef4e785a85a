"""Retrospective parent-retention analysis of a finished archive (the paper's round-by-round check).

For each round r: the selected parents are the parents of the nodes created in round r (trailer
``Poise-Round``); a parent's selection rank / score come from its round-r children's trailers
``Poise-Selection-Rank`` / ``Poise-Selection-Score``. A parent's best descendant is the highest-utility
node in the subtrees of its round-r children (later rounds included). A round with two or more
selected parents is a "hit" when the parent whose best descendant is strongest is the top-ranked one.
Without ``Poise-Round`` the round of a node is its generation (depth); without selection trailers the
rank is the parent's utility order. Both assumptions are reported.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from engine.archive.results import (
    ProtocolRef,
    configured_protocol,
    named_protocol,
    require_comparable,
)
from engine.archive.store import earliest_root
from engine.config import Config, utility
from engine.select.objective import utility_label


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _float(v: str | None) -> float | None:
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


def retrospect(
    archive: Any, cfg: Config | None = None, protocol: ProtocolRef | str | None = None
) -> dict[str, Any]:
    """``{"rounds": [...], "summary": {...}, "assumptions": [...]}`` for an Archive or ``{name: Node}``.

    An Archive's results are read under ``protocol`` (``id`` or ``id@hash``; default: the one
    ``cfg`` defines); ``summary.protocol`` names what the utilities were measured under and
    ``summary.utility`` what U is."""
    if cfg is None:
        cfg = Config() if isinstance(archive, Mapping) else archive.config()
    ref = named_protocol(protocol) or configured_protocol(cfg)
    nodes = dict(archive) if isinstance(archive, Mapping) else archive.nodes(ref)
    util = {  # from successful results only, ranked together only when comparable (as select)
        n: (utility(v.metrics, cfg.experiment) if v.evaluated else None) for n, v in nodes.items()
    }
    require_comparable(
        {n: v.result for n, v in nodes.items() if util[n] is not None}, cfg.experiment.objective
    )
    kids: dict[str, list[str]] = {}
    for v in nodes.values():
        for p in set(v.parents):
            kids.setdefault(p, []).append(v.name)
    root = earliest_root(nodes)
    u_root = util.get(root) if root else None
    assumptions: list[str] = []

    has_round = any(_int(v.trailer("Poise-Round")) is not None for v in nodes.values())
    if has_round:
        rnd = {v.name: _int(v.trailer("Poise-Round")) for v in nodes.values() if v.parents}
        missing = sorted(n for n, r in rnd.items() if r is None)
        if missing:
            assumptions.append(f"{len(missing)} node(s) without Poise-Round left out of the rounds")
    else:
        rnd = {v.name: v.depth for v in nodes.values() if v.parents}
        assumptions.append(
            "no Poise-Round trailers: a node's round is its generation (depth below the root)"
        )

    def best_below(start: list[str]) -> tuple[str | None, int]:
        seen, queue, best = set(start), deque(start), None
        while queue:
            c = queue.popleft()
            if util.get(c) is not None and (best is None or (util[c], c) > (util[best], best)):
                best = c
            for g in kids.get(c, ()):
                if g not in seen:
                    seen.add(g)
                    queue.append(g)
        return best, len(seen)

    by_round: dict[int, list[str]] = {}
    for n, r in rnd.items():
        if r is not None:
            by_round.setdefault(r, []).append(n)
    rounds, no_rank_rounds = [], 0
    for r in sorted(by_round):
        children = sorted(by_round[r], key=lambda n: (nodes[n].created, n))
        parents: dict[str, dict[str, Any]] = {}
        for c in children:
            for p in nodes[c].parents:
                e = parents.setdefault(
                    p,
                    {
                        "parent": p,
                        "utility": util.get(p),
                        "rank": None,
                        "score": None,
                        "children": [],
                    },
                )
                e["children"].append(c)
                rank, score = (
                    _int(nodes[c].trailer("Poise-Selection-Rank")),
                    _float(nodes[c].trailer("Poise-Selection-Score")),
                )
                if e["rank"] is None and rank is not None:
                    e["rank"] = rank
                if e["score"] is None and score is not None:
                    e["score"] = score
        ranked_by = "selection"
        if any(e["rank"] is None and e["score"] is None for e in parents.values()):
            ranked_by = "utility"
            no_rank_rounds += 1
            order = sorted(
                parents.values(),
                key=lambda e: (e["utility"] is None, -(e["utility"] or 0.0), e["parent"]),
            )
            for i, e in enumerate(order):
                e["rank"] = i + 1
        for e in parents.values():
            best, size = best_below(e["children"])
            e["best_descendant"], e["best_utility"] = best, util.get(best) if best else None
            best_child = max(
                (c for c in e["children"] if util.get(c) is not None),
                key=lambda c: (util[c], c),
                default=None,
            )
            e["best_child"], e["best_child_utility"] = (
                best_child,
                util.get(best_child) if best_child else None,
            )
            e["gain"] = (
                None
                if e["best_utility"] is None or e["utility"] is None
                else e["best_utility"] - e["utility"]
            )
            e["subtree"] = size
        plist = sorted(
            parents.values(),
            key=lambda e: (
                e["rank"] if e["rank"] is not None else 1 << 30,
                -(e["score"] or 0.0),
                e["parent"],
            ),
        )
        top = plist[0]["parent"] if plist else None
        scored = [e for e in plist if e["best_utility"] is not None]
        best_parent = (
            max(scored, key=lambda e: (e["best_utility"], e["parent"] == top))["parent"]
            if scored
            else None
        )
        judged = best_parent is not None and len(plist) > 1  # one parent: nothing to compare
        rounds.append(
            {
                "round": r,
                "ranked_by": ranked_by,
                "parents": plist,
                "top_parent": top,
                "best_parent": best_parent,
                "hit": best_parent == top if judged else None,
            }
        )
    if no_rank_rounds:
        assumptions.append(
            f"{no_rank_rounds} round(s) without Poise-Selection-Rank/Score: parents ranked by utility"
        )

    judged = [r for r in rounds if r["hit"] is not None]
    below = [
        (r["round"], e)
        for r in rounds
        for e in r["parents"]
        if u_root is not None
        and e["utility"] is not None
        and e["utility"] < u_root
        and e["parent"] != root
    ]
    led_above = [
        (rd, e) for rd, e in below if e["best_utility"] is not None and e["best_utility"] > u_root
    ]
    gains = [e["gain"] for r in rounds for e in r["parents"] if e["gain"] is not None]
    ranked_under = sorted({nodes[n].result.protocol.key for n, u in util.items() if u is not None})
    summary = {
        # what the utilities were measured under (with the hash, where the reference names none)
        "protocol": ", ".join(ranked_under) or (None if isinstance(archive, Mapping) else ref.key),
        "utility": utility_label(cfg.experiment),
        "root": root,
        "root_utility": u_root,
        "rounds": len(rounds),
        "rounds_judged": len(judged),
        "top_parent_best": sum(r["hit"] for r in judged),
        "top_parent_not_best": sum(not r["hit"] for r in judged),
        "selected_below_root": len(below),
        "below_root_led_above": len(led_above),
        "below_root_led_above_list": [
            {
                "round": rd,
                "parent": e["parent"],
                "utility": e["utility"],
                "best_descendant": e["best_descendant"],
                "best_utility": e["best_utility"],
            }
            for rd, e in led_above
        ],
        "mean_gain": sum(gains) / len(gains) if gains else None,
        "max_gain": max(gains) if gains else None,
    }
    if u_root is None:
        assumptions.append("the root has no utility: the below-root count is not defined")
    return {"rounds": rounds, "summary": summary, "assumptions": assumptions}
