"""The offline proposer's remedies: the moves that counter a finding of the reflection on a parent's
training trajectory, and the archive's record of whether they did.

A remedy is meant to move one training series (an entropy collapse's remedies: the policy's
entropy, up). Each evaluated child of a parent with the finding that applied a remedy is one trial
of it, judged on that series against its parent's, seed by seed
(:func:`engine.operators.reflect.compare_with_parent`). A remedy tried on
``[propose].remedy_trials`` such children that all trained alike there (or moved it the other way)
is spent on this archive: the diagnosis no longer directs mutations to it, nor credits it a prior.
It stays among the uniform mutations, so the search can still try it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from engine.config import REMEDY_MOVES
from engine.operators.proposers.codegen import CONTINUOUS
from engine.operators.reflect import compare_with_parent, trajectory_diagnostics

REMEDIES: dict[str, tuple[str, ...]] = {
    "entropy collapse": ("kl", "entropy_control", "entropy", "clip_higher"),
}
"""the reflection's trajectory findings (by their first words) the offline search acts on, and the
moves that counter each: a policy sharpening until its entropy collapses is held back by a stronger
anchor to the reference policy (``kl``), an entropy controller, a larger entropy bonus, or a higher
upper clip bound (DAPO's clip-higher)"""
REMEDY_TARGET: dict[str, tuple[str, str]] = {"entropy collapse": ("train/entropy", "up")}
"""the training series each finding's remedies are meant to move, and which way"""
REMEDY_PRIOR = 0.5
"""the expected effect credited to a proposal that applies a remedy of its parent's diagnosis, in
units of ``[select].beta``: before evidence it ranks above an untried option, and an option the archive
has seen fail (a fitted effect below ``-REMEDY_PRIOR * beta``) still sinks it"""


def _has_room(move: str, base: dict) -> bool:
    hp = base["hp"]
    if move == "kl":
        return hp.get("kl_coef", 0.0) < CONTINUOUS["kl_coef"][1]
    if move == "entropy":
        return (
            base["entropy_control"] == "none"
            and hp.get("entropy_coef", 0.0) < CONTINUOUS["entropy_coef"][1]
        )
    if move == "entropy_control":
        return base["entropy_control"] == "none"
    if move == "clip_higher":
        return hp.get("clip_ratio_high", 0.2) < CONTINUOUS["clip_ratio_high"][1]
    return False


def remedies_for(
    findings: list[str], base: dict, allowed: tuple[str, ...] = REMEDY_MOVES
) -> tuple[str, ...]:
    """The moves among ``allowed`` (``[propose].remedies``) that counter the parent's findings
    (:data:`REMEDIES`) and that its spec leaves room for (an anchor already at the range's top cannot
    be strengthened)."""
    out: list[str] = []
    for finding in findings:
        for key, moves in REMEDIES.items():
            if finding.startswith(key):
                out += [m for m in moves if m in allowed and m not in out and _has_room(m, base)]
    return tuple(out)


def remedies_applied(spec: dict, base: dict, remedies: tuple[str, ...]) -> tuple[str, ...]:
    """Which of ``remedies`` the move from ``base`` to ``spec`` applies, however it was drawn."""
    a, b = spec["hp"], base["hp"]
    done = {
        "kl": a.get("kl_coef", 0.0) > b.get("kl_coef", 0.0),
        "entropy": a.get("entropy_coef", 0.0) > b.get("entropy_coef", 0.0),
        "entropy_control": spec["entropy_control"] != "none" == base["entropy_control"],
        "clip_higher": a.get("clip_ratio_high", 0.2) > b.get("clip_ratio_high", 0.2)
        and a.get("clip_ratio_high", 0.2) > a.get("clip_ratio_low", 0.2),
    }
    return tuple(m for m in remedies if done.get(m))


@dataclass(frozen=True)
class RemedyTrial:
    """One evaluated child that applied remedies of its parent's finding."""

    node: str
    parent: str
    finding: str
    """the finding's key in :data:`REMEDIES`"""
    moves: tuple[str, ...]
    """the remedies it applied"""
    verdict: str
    """what the finding's target series (:data:`REMEDY_TARGET`) did against the parent's:
    'up', 'down', 'alike' or 'unclear' (:data:`engine.operators.reflect.SERIES_VERDICTS`)"""


def remedy_trials(nodes: Mapping, specs: Mapping[str, dict | None]) -> list[RemedyTrial]:
    """Every evaluated child whose parent's recorded trajectory has a finding of :data:`REMEDIES`
    and whose spec applies one of its remedies against the parent's, with the verdict on the
    finding's target series. ``nodes`` are the archive's nodes under one protocol
    (``archive.nodes(protocol)``), ``specs`` each node's component spec with the hyperparameters
    its code sets (None: unreadable, never counted)."""
    out: list[RemedyTrial] = []
    for name in sorted(nodes):
        node = nodes[name]
        par = nodes.get(node.parent) if node.parent else None
        if par is None or not (node.evaluated and par.evaluated):
            continue
        mine, theirs = specs.get(name), specs.get(node.parent)
        if mine is None or theirs is None:
            continue
        findings = trajectory_diagnostics(dict(par.result.trajectory))
        comparison = None
        for key, moves in REMEDIES.items():
            if not any(f.startswith(key) for f in findings):
                continue
            applied = remedies_applied(mine, theirs, moves)
            if not applied:
                continue
            comparison = comparison or compare_with_parent(node.result, par.result)
            if comparison is None:
                break
            verdict = comparison.verdict(REMEDY_TARGET[key][0]) or "unclear"
            out.append(RemedyTrial(name, node.parent, key, applied, verdict))
    return out


def spent_remedies(
    trials: list[RemedyTrial], findings: tuple[str, ...], needed: int
) -> dict[str, str]:
    """move -> why it is spent: the remedies of ``findings`` (keys of :data:`REMEDIES`) that at
    least ``needed`` trials judged on their target series (alike, or moved the other way) and none
    saw move it the way the remedy is meant to. ``needed`` 0 spends nothing."""
    out: dict[str, str] = {}
    if needed <= 0:
        return out
    for key in findings:
        series, way = REMEDY_TARGET[key]
        for move in REMEDIES[key]:
            mine = [t for t in trials if t.finding == key and move in t.moves]
            judged = [t for t in mine if t.verdict != "unclear"]
            if len(judged) < needed or any(t.verdict == way for t in mine):
                continue
            alike = sum(t.verdict == "alike" for t in judged)
            out.setdefault(
                move,
                f"{len(judged)} children that applied it against a parent's {key} kept "
                f"{series.split('/')[-1]} "
                + (
                    "as their parents did"
                    if alike == len(judged)
                    else f"as their parents did or moved it {'down' if way == 'up' else 'up'}"
                )
                + f" ({', '.join(t.node for t in judged[:3])}{', ...' if len(judged) > 3 else ''})",
            )
    return out
