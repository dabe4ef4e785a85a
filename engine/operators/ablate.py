"""Ablate a node: which of its changes to the root carry its gain (``poise-git ablate``).

A node found by a search differs from the root in several places at once (a hyperparameter here, a
rewritten advantage there), and its gain says nothing about which of them earns it. An ablation takes
the changes one at a time: for each, a child of the node with that one change reverted to the root's
(a ``Hyperparameters`` default set back, a definition replaced by the root's, an added hook removed),
verified and evaluated under the node's protocol at the node's own seeds. The paired difference node
minus child is what that change carries.

What counts as a change, and how one is reverted, is ``engine.operators.ablation_changes``. The
children are ordinary nodes (``Poise-Proposer: ablation``), so ``git diff`` shows each one's single
reverted change, and a second ablation of the same node trains nothing: each child is found again as
the existing node with the same mechanism, the root among them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from engine.archive.mechanism import same_mechanism
from engine.archive.results import EvaluationResult, ProtocolRef
from engine.archive.store import ROOT_NAME
from engine.config import ExperimentConfig
from engine.errors import EvaluationError
from engine.operators.ablation_changes import Change, node_changes, without
from engine.operators.evaluate import evaluate_node, measure_node, proxy_preset, proxy_protocol
from engine.operators.implement import unique_name
from engine.operators.verify import evaluation_gate, verify_node
from engine.select.objective import seed_utilities, utility_label
from engine.stats import paired_interval
from trainer_template.proxy.protocol import get_protocol

CARRIES, HURTS, WITHIN, NO_INTERVAL = "carries gain", "costs", "not measurable", "no interval"
ABLATES_TRAILER = "Poise-Ablates"
SPAWNED, EARLIER, INTERRUPTED, EXISTING = "spawned", "earlier", "interrupted", "existing"
"""Where a row's child comes from: spawned by this ablation; spawned by an earlier ablation of the
same node; spawned by an earlier one that stopped (interrupted, killed) before the child had a result
or a verdict, so this one resumes it; another node with that mechanism (the root, say)."""


@dataclasses.dataclass(frozen=True)
class AblationRow:
    """One change: the child without it, and what the node loses without it (``contribution``:
    U(node) - U(child) over the paired seeds, its 95% interval, the seed count)."""

    change: Change
    child: str | None
    reused: bool
    status: str
    reason: str = ""
    value: float | None = None
    contribution: tuple[float, tuple[float, float] | None, int] | None = None
    origin: str = SPAWNED
    """where the child comes from: SPAWNED, EARLIER, INTERRUPTED or EXISTING"""
    evaluated_now: bool = False
    """whether this ablation trained the child at the seeds (else its recorded result was read)"""

    @property
    def verdict(self) -> str:
        if self.contribution is None:
            return self.status
        mean, iv, _ = self.contribution
        if iv is None:
            return NO_INTERVAL
        return CARRIES if iv[0] > 0 else HURTS if iv[1] < 0 else WITHIN


@dataclasses.dataclass(frozen=True)
class Ablation:
    node: str
    root: str
    protocol: str
    objective: str
    """what the values measure: U (``engine.select.objective.utility_label``), e.g. ``overall`` or
    ``overall - 0.002*mean_length``"""
    seeds: tuple[int, ...]
    gain: tuple[float, tuple[float, float] | None, int] | None
    rows: tuple[AblationRow, ...]
    wall_time_s: float

    def to_json(self) -> dict:
        return {
            "node": self.node,
            "root": self.root,
            "protocol": self.protocol,
            "objective": self.objective,
            "unit": f"{self.objective}; paired differences over the seeds, 95% Student-t",
            "seeds": list(self.seeds),
            "gain_over_root": _pair_json(self.gain),
            "changes": [
                {
                    "kind": r.change.kind,
                    "name": r.change.name,
                    "change": r.change.describe(),
                    "child": r.child,
                    "reused": r.reused,
                    "origin": r.origin,
                    "evaluated_now": r.evaluated_now,
                    "status": r.status,
                    "reason": r.reason,
                    self.objective: r.value,
                    "contribution": _pair_json(r.contribution),
                    "verdict": r.verdict,
                }
                for r in self.rows
            ],
            "wall_time_s": self.wall_time_s,
        }


def _pair_json(pair) -> dict | None:
    if pair is None:
        return None
    mean, iv, n = pair
    return {"mean": mean, "interval": list(iv) if iv else None, "seeds": n}


def _proposal(node: str, change: Change) -> str:
    return (
        f"# Ablation of {node}: without {change.name}\n\n"
        f"{node} with one of its changes to the root reverted: {change.describe()}. Every other "
        f"line is {node}'s. Made by `poise-git ablate {node}` to measure how much of {node}'s gain "
        "this change carries (the paired difference between the two nodes at the same seeds).\n"
    )


def ablate_node(
    archive,
    name: str,
    exp: ExperimentConfig,
    *,
    preset: str | None = None,
    root: str = ROOT_NAME,
    on_event: Callable[[str], None] | None = None,
    cache_dir: str | None = None,
) -> Ablation:
    """Ablate ``name`` under the proxy ``preset`` at the seeds of its recorded result there."""
    say = on_event or (lambda msg: None)
    t0 = time.monotonic()
    preset = proxy_preset(preset, archive.config())
    protocol = proxy_protocol(preset, get_protocol(preset))
    ref = ProtocolRef(protocol.id, protocol.hash)
    nodes = archive.nodes(ref)
    if name not in nodes:
        raise EvaluationError(f"ablate: unknown node {name!r}")
    if root not in nodes:
        raise EvaluationError(f"ablate: unknown root {root!r}")
    if name == root:
        raise EvaluationError(f"ablate: {name} is the root; there is nothing to revert")
    node = nodes[name]
    if node.result is None or not node.evaluated:
        raise EvaluationError(
            f"ablate: {name} has no evaluated result under {protocol.key}: run `poise-git evaluate "
            f"{name} --preset {preset}` first (its seeds are the ablation's)"
        )
    values = seed_utilities(node.result, exp)
    seeds = sorted(values)
    node_src, root_src = archive.algorithm(name), archive.algorithm(root)
    changes = node_changes(node_src, root_src)
    if not changes:
        raise EvaluationError(f"ablate: {name}'s algorithm.py makes no change to {root}'s")
    say(f"{len(changes)} change(s) to {root}, each reverted in turn at seeds {seeds}")
    tags = {"poise.purpose": "ablation", "poise.ablates": name}
    rows = []
    for change in changes:
        row = _child(archive, name, change, without(node_src, root_src, change), say)
        if row.status == "pending":
            row, child_values = _measured(
                archive, row, seeds, preset, ref, exp, tags, say, cache_dir
            )
            if child_values:
                mean = sum(child_values.values()) / len(child_values)
                pair = _as_pair(paired_interval(values, child_values))
                row = dataclasses.replace(row, value=mean, contribution=pair)
        rows.append(row)
    root_node = archive.nodes(ref)[root]
    gain = (
        paired_interval(values, seed_utilities(root_node.result, exp))
        if root_node.result is not None and root_node.evaluated
        else None
    )
    return Ablation(
        node=name,
        root=root,
        protocol=protocol.key,
        objective=utility_label(exp),
        seeds=tuple(seeds),
        gain=_as_pair(gain),
        rows=tuple(rows),
        wall_time_s=round(time.monotonic() - t0, 3),
    )


def _as_pair(d):
    if d is None:
        return None
    mean, iv, n = d
    return mean, (tuple(iv) if iv else None), n


def _child(archive, name: str, change: Change, source: str, say) -> AblationRow:
    """The node ``name`` without ``change``: an existing node with that mechanism (the root, where
    it was the only change; a child an earlier ablation of ``name`` spawned), else a new child of
    ``name``; verified where it is not yet."""
    same = same_mechanism(archive, source)
    if same:
        child, reused = same[0], True
        found = archive.node(child)
        if found.trailer(ABLATES_TRAILER) != name:
            origin, how = EXISTING, f"the same mechanism as {child}"
        elif not found.results and found.status != "rejected":  # it stopped before a verdict
            origin = INTERRUPTED
            how = f"{child}, spawned by an earlier ablation of {name} that was interrupted"
        else:
            origin, how = EARLIER, f"{child}, spawned by an earlier ablation of {name}"
        say(f"without {change.name}: {how}")
    else:
        origin = SPAWNED
        child, reused = unique_name(archive, f"{name[:40].rstrip('-.')}-no-{change.slug}"), False
        archive.spawn(
            name,
            child,
            algorithm=source,
            proposal=_proposal(name, change),
            trailers={"Poise-Proposer": "ablation", ABLATES_TRAILER: name},
            subject=f"poise: {child} (ablation of {name}: without {change.name})",
        )
        say(f"without {change.name}: spawned {child}")
    if archive.node(child).status == "rejected":
        reason = archive.node(child).trailer("Poise-Reason") or "rejected by verification"
        return AblationRow(change, child, reused, "rejected", reason, origin=origin)
    if evaluation_gate(archive, child):  # not verified for this source (template code needs none)
        say(f"{child}: verifying")
        res = verify_node(archive, child, archive.config())
        if not res.ok:
            return AblationRow(change, child, reused, "rejected", res.reason, origin=origin)
    return AblationRow(change, child, reused, "pending", origin=origin)


def _measured(archive, row, seeds, preset, ref, exp, tags, say, cache_dir):
    """(row, the child's utility at each seed): read from its recorded result where that covers the
    seeds; else evaluated at the seeds and recorded (a child without a result under the protocol, or
    an ablation child of this node whose result has fewer seeds: the node was evaluated at more since),
    or measured without recording (another node whose recorded result, which the selection reads, has
    other seeds)."""
    node = archive.nodes(ref)[row.child]
    ours = node.trailer(ABLATES_TRAILER) == tags["poise.ablates"]
    recorded = seed_utilities(node.result, exp) if node.result is not None else {}
    if node.result is not None and not node.evaluated:  # its mechanism failed under the protocol
        return dataclasses.replace(row, status="failed", reason=node.result.reason or ""), None
    if node.evaluated and set(seeds) <= set(recorded):
        return dataclasses.replace(row, status="evaluated"), {s: recorded[s] for s in seeds}
    report = lambda msg: say(f"{row.child}: {msg}")  # noqa: E731
    row = dataclasses.replace(row, evaluated_now=True)
    if node.result is not None and node.evaluated and not ours:
        result = measure_node(
            archive,
            row.child,
            seeds,
            preset=preset,
            tags=tags,
            on_event=report,
            cache_dir=cache_dir,
        )
    else:
        say(f"{row.child}: evaluating at seeds {seeds}")
        result = evaluate_node(
            archive,
            row.child,
            seeds=seeds,
            preset=preset,
            tags=tags,
            on_event=report,
            cache_dir=cache_dir,
        )
    return _outcome(row, result, seeds, exp)


def _outcome(row: AblationRow, result: EvaluationResult, seeds, exp):
    if not result.ok:
        return dataclasses.replace(row, status="failed", reason=result.reason or ""), None
    got = seed_utilities(result, exp)
    missing = sorted(set(seeds) - set(got))
    if missing:
        reason = f"no {exp.objective} at seeds {missing}"
        return dataclasses.replace(row, status="failed", reason=reason), None
    return dataclasses.replace(row, status="evaluated"), {s: got[s] for s in seeds}
