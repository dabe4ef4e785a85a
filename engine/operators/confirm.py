"""Confirm a search's comparison on held-out seeds (``poise-git confirm``, ``run --confirm-seeds``).

The node and the node it is compared with are trained and scored again, exactly as an evaluation runs
them (``measure_node``), at seeds disjoint from every seed the search used under the protocol; the
paired difference there is recorded as a :class:`engine.archive.confirmation.Confirmation` on the
node's branch. The nodes' own results, which the selection reads, are left as they were.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.archive.confirmation import FAILED, Confirmation, record_confirmation
from engine.archive.results import EvaluationResult, ProtocolRef
from engine.config import ExperimentConfig
from engine.errors import EvaluationError
from engine.operators.evaluate import measure_node, proxy_preset, proxy_protocol
from engine.select.objective import describe_objective, paired_difference, seed_utilities
from trainer_template.proxy.protocol import get_protocol

TAG = "confirmation"


def search_seeds(nodes, protocol_id: str) -> list[int]:
    """Every seed at which any node holds a result under ``protocol_id``: what the search has seen."""
    seen: set[int] = set()
    for n in nodes.values():
        r = n.results.get(protocol_id)
        if r is not None:
            seen.update(int(s) for s in r.seeds)
            seen.update(int(row["seed"]) for row in r.per_seed if "seed" in row)
    return sorted(seen)


def heldout_seeds(seen: list[int], count: int, first: int | None = None) -> list[int]:
    """``count`` seeds from ``first`` (default: one past the largest seed seen); refused when any of
    them was seen."""
    if count < 1:
        raise EvaluationError(f"confirm: --seeds must be 1 or more, got {count}")
    start = (max(seen) + 1 if seen else 0) if first is None else first
    if start < 0:
        raise EvaluationError(f"confirm: --first-seed must be >= 0, got {start}")
    seeds = list(range(start, start + count))
    overlap = sorted(set(seeds) & set(seen))
    if overlap:
        raise EvaluationError(
            f"confirm: seeds {overlap} were used by the search under this protocol, so they are "
            f"not held out; leave --first-seed out (it then starts at {max(seen) + 1}) or start "
            "past them"
        )
    return seeds


def confirm_node(
    archive,
    name: str,
    against: str,
    exp: ExperimentConfig,
    *,
    seeds: int = 2,
    first_seed: int | None = None,
    preset: str | None = None,
    on_event: Callable[[str], None] | None = None,
    cache_dir: str | None = None,
) -> Confirmation:
    """Measure ``name`` and ``against`` at held-out seeds under the proxy preset and record the
    paired difference on ``name``'s branch. Both must hold a result under the protocol (the
    comparison being confirmed); a candidate that fails at a held-out seed gives a ``failed``
    confirmation that says why."""
    say = on_event or (lambda msg: None)
    t0 = time.monotonic()
    preset = proxy_preset(preset, archive.config())
    protocol = proxy_protocol(preset, get_protocol(preset))
    if name == against:
        raise EvaluationError(f"confirm: {name} cannot be confirmed against itself")
    # the search's comparison is read under this very protocol version: a result under the same id
    # with another hash was measured differently and is not compared (nor confirmed)
    nodes = archive.nodes(ProtocolRef(protocol.id, protocol.hash))
    for n in (name, against):
        if n not in nodes:
            raise EvaluationError(f"confirm: unknown node {n!r}")
        if nodes[n].result is None or not nodes[n].evaluated:
            stale = nodes[n].stale
            older = (
                f" (its result there is from another version, {stale.protocol.key})"
                if stale is not None
                else ""
            )
            raise EvaluationError(
                f"confirm: {n} has no evaluated result under {protocol.key}{older}: a "
                f"confirmation re-measures a comparison the search made; run `poise-git evaluate "
                f"{n} --preset {preset}` first"
            )
    seen = search_seeds(nodes, protocol.id)
    held = heldout_seeds(seen, seeds, first_seed)
    search = paired_difference(nodes[name], nodes[against], exp)
    tags = {"poise.purpose": TAG, "poise.confirms": f"{name} vs {against}"}
    measured: dict[str, EvaluationResult] = {}
    for n in (name, against):
        say(f"{n}: held-out seeds {held} ...")
        measured[n] = measure_node(
            archive,
            n,
            held,
            preset=preset,
            tags=tags,
            on_event=lambda msg, n=n: say(f"{n}: {msg}"),
            cache_dir=cache_dir,
        )
    base = dict(
        protocol=protocol,
        node=name,
        against=against,
        node_commit=measured[name].node_commit,
        against_commit=measured[against].node_commit,
        objective=describe_objective(exp),
        seeds=tuple(held),
        search_seeds=tuple(seen),
        search_difference=search,
        mlflow_run_ids=tuple(i for r in measured.values() for i in r.mlflow_run_ids),
        wall_time_s=round(time.monotonic() - t0, 3),
    )
    failed = {n: r for n, r in measured.items() if not r.ok}
    if failed:
        reason = "; ".join(f"{n}: {r.reason}" for n, r in failed.items())[:1000]
        conf = Confirmation(verdict=FAILED, reason=reason, recorded_at=time.time(), **base)
    else:
        values, reference = (seed_utilities(measured[n], exp) for n in (name, against))
        missing = sorted(set(held) - (set(values) & set(reference)))
        if missing:
            conf = Confirmation(
                verdict=FAILED,
                reason=f"no {exp.objective} at held-out seeds {missing}",
                recorded_at=time.time(),
                **base,
            )
        else:
            conf = Confirmation.measured(values=values, reference=reference, **base)
    record_confirmation(archive, conf)
    return conf
