"""Proposal (operator P): N candidates for a parent from a registered proposer, screened and ranked.

Screening, in order: logical consistency (a mechanism is named, something changes, every proposed
hyperparameter is used by the code), feasibility (the edit applies, the static checks pass, the code runs
on the fingerprint bank; infeasible code is kept at half score for the correction loop), novelty
(behavioural fingerprint: near-duplicates of archived nodes or of better-ranked proposals are dropped),
expected gain. score = 0.6 * expected_gain + 0.4 * min(1, novelty / NOVELTY_FULL), novelty = the weighted
relative L2 part distance to the behaviourally nearest archived node (engine.fingerprint.novelty; 0.5
when unknown).
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.archive.edit import parse_ast
from engine.archive.results import configured_protocol
from engine.errors import EditError, PoiseError
from engine.operators.fingerprint import DUPLICATE_TOL, distance, fingerprints, nearest
from engine.operators.implement import build_source
from engine.operators.llm import make_client
from engine.operators.proposers import get_proposer
from engine.operators.static_check import static_check

log = logging.getLogger(__name__)
NOVELTY_FULL = 0.01
"""novelty that earns the full novelty credit (10 x the duplicate tolerance): a proposal clearly distinct
from everything archived. More behavioural distance earns nothing more: on its own it predicts risk,
not gain (on the CPU proxy the proposals farthest from every archived node, at novelty 0.2-0.54, were
the untested baselines that collapsed training), so among distinct proposals the expected gain ranks"""

INTENTS = (
    "correct_above_wrong",
    "rare_success_larger",
    "invalid_below_wrong",
    "all_fail_negative",
    "shorter_correct_preferred",
    "longer_wrong_penalized_more",
    "longer_wrong_penalized_less",
    "bounded",
)


@dataclass
class Proposal:
    """One candidate mechanism. ``edit``: top-level definitions for ``Archive.spawn`` (LibCST);
    ``hyperparameters``: new defaults of the ``Hyperparameters`` dataclass; ``drop_hyperparameters``:
    its fields the candidate no longer uses."""

    name: str
    motivation: str
    mechanism: str
    expected_effect: str
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    edit: str = ""
    drop_hyperparameters: tuple[str, ...] = ()
    score: float = 0.0
    proposer: str = "offline"
    parents: tuple[str, ...] = ()
    """extra parents (a crossover); the first parent is the one proposed from"""
    intents: tuple[str, ...] = ()
    """intent tests (engine.verify.INTENT_TESTS) the verification suite adds"""
    expected_gain: float = 0.5
    components: dict | None = None
    screening: dict[str, Any] = field(default_factory=dict)
    llm_usage: dict[str, Any] = field(default_factory=dict)

    def markdown(self) -> str:
        hp = (
            "\n".join(f"- `{k}` = {v!r}" for k, v in sorted(self.hyperparameters.items()))
            or "- (defaults)"
        )
        extra = f"\nCrossed with: {', '.join(self.parents)}\n" if self.parents else ""
        return (
            f"# {self.name}\n\n## Motivation\n{self.motivation.strip()}\n\n## Mechanism\n{self.mechanism.strip()}\n\n"
            f"## Expected effect\n{self.expected_effect.strip()}\n\n## Hyperparameters\n{hp}\n{extra}\n"
            f"Proposer: {self.proposer}; intent tests: {', '.join(self.intents) or 'none'}\n"
        )

    def to_record(self) -> dict[str, Any]:
        d = asdict(self)
        d["parents"] = list(self.parents)
        d["intents"] = list(self.intents)
        d["drop_hyperparameters"] = list(self.drop_hyperparameters)
        return d

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> Proposal:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known["parents"] = tuple(known.get("parents", ()))
        known["intents"] = tuple(known.get("intents", ()))
        known["drop_hyperparameters"] = tuple(known.get("drop_hyperparameters", ()))
        return cls(**known)


def slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "-", text.lower()).strip("-")
    return s[:48] or "candidate"


def archived_fingerprints(
    archive, nodes=None
) -> tuple[dict[str, list[float]], list[tuple[str, str]]]:
    """(recorded fingerprints of live nodes from verification.json, [(node, source)] still to compute)."""
    nodes = nodes if nodes is not None else archive.nodes()
    live = [n for n in nodes.values() if n.status not in ("rejected", "failed")]
    blobs = archive.git.cat_blobs([f"{n.commit}:verification.json" for n in live])
    out: dict[str, list[float]] = {}
    todo: list[tuple[str, str]] = []
    for n, blob in zip(live, blobs):
        fp = None
        if blob is not None:
            try:
                fp = json.loads(blob).get("fingerprint")
            except json.JSONDecodeError:
                fp = None
        if isinstance(fp, list) and fp:
            out[n.name] = fp
        else:
            src = archive.algorithm(n.name)
            try:
                static_check(src)
            except PoiseError:
                continue
            todo.append((n.name, src))
    return out, todo


def code_key(source: str, what: str = "algorithm.py") -> str | None:
    """The code's identity for duplicate detection: its syntax tree without docstrings and formatting
    (None when it does not parse or is out of the parser's bounds)."""
    try:
        tree = parse_ast(source, what)
    except EditError:
        return None
    return _tree_key(tree)


def _tree_key(tree: ast.Module) -> str:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


def archived_code(archive, nodes=None) -> dict[str, str]:
    """{code key: node name} over every node of the archive (any status); a node whose code is out
    of the parser's bounds (a pushed branch's) is named in a warning and left out."""
    nodes = nodes if nodes is not None else archive.nodes()
    items = sorted(nodes.values(), key=lambda n: n.name)
    blobs = archive.git.cat_blobs([f"{n.commit}:algorithm.py" for n in items])
    out: dict[str, str] = {}
    for n, blob in zip(items, blobs):
        if blob is None:
            continue
        src = blob.decode("utf-8", "replace") if isinstance(blob, bytes) else blob
        try:
            tree = parse_ast(src, f"node {n.name}'s algorithm.py")
        except EditError as exc:
            if "does not parse" not in str(exc):
                log.warning("poise-git: duplicate screening leaves out %s", exc)
            continue
        out.setdefault(_tree_key(tree), n.name)
    return out


def screen(
    archive, parent: str, proposals: list[Proposal], cfg, *, nodes=None
) -> tuple[list[Proposal], list[Proposal]]:
    """(kept best first, dropped with ``screening['reason']``).

    A proposal whose code is already in the archive (any node, any status) is dropped with a warning:
    evaluating it again would only re-measure that node. Logically inconsistent proposals and
    near-duplicates are dropped. Code that fails to build, the static
    checks or the fingerprint bank is kept with ``screening['feasible'] = False`` and half the score: the
    implementer's correction loop gets to fix it. Feasible proposals rank first."""
    parent_src = archive.algorithm(parent)
    known = archived_code(archive, nodes)
    candidates: list[tuple[Proposal, str | None]] = []
    dropped: list[Proposal] = []
    for p in proposals:
        p.intents = tuple(i for i in p.intents if i in INTENTS)
        p.screening = {"consistent": True, "feasible": True, "reason": ""}
        reason, src, problem = "", None, ""
        if not p.name.strip() or not p.mechanism.strip():
            reason = "inconsistent: the proposal names no mechanism"
        elif not p.edit.strip() and not p.hyperparameters:
            reason = "inconsistent: the proposal changes nothing (no edit, no hyperparameters)"
        else:
            try:
                src = build_source(parent_src, p.edit, p.hyperparameters, p.drop_hyperparameters)
            except PoiseError as exc:
                problem = str(exc)
        twin = known.get(code_key(src)) if src is not None else None
        if twin is not None:
            reason = f"duplicate: the same code as archived node {twin!r}"
            log.warning("skipping proposal %r: %s", p.name, reason)
        elif src is not None:
            unused = [
                k for k in p.hyperparameters if not re.search(rf"\bcfg\.{re.escape(k)}\b", src)
            ]
            if unused:
                reason = f"inconsistent: hyperparameters {', '.join(sorted(unused))} are not used by the mechanism"
            else:
                try:
                    static_check(src, parent_src)
                except PoiseError as exc:
                    problem, src = str(exc), None
        if reason:
            p.screening.update(consistent=False, feasible=False, reason=reason)
            dropped.append(p)
            continue
        if problem:
            p.screening.update(feasible=False, needs_correction=problem)
        candidates.append((p, src))
    if not candidates:
        return [], dropped
    archived, todo = archived_fingerprints(archive, nodes)
    runnable = [src for _, src in candidates if src is not None]
    computed = fingerprints([src for _, src in todo] + runnable)  # a recording child each
    for (name, _), fp in zip(todo, computed):
        if isinstance(fp, list):
            archived[name] = fp
    fp_iter = iter(computed[len(todo) :])
    survivors: list[tuple[Proposal, list[float] | None]] = []
    for p, src in candidates:
        fp = next(fp_iter) if src is not None else None
        if src is not None and not isinstance(fp, list):
            p.screening.update(
                feasible=False, needs_correction=f"fails on the fingerprint bank: {fp}"
            )
            fp = None
        novelty = 0.5
        if fp is not None:
            near, dist, nov = nearest(fp, archived)
            p.screening.update(nearest=near, novelty=None if math.isinf(nov) else round(nov, 6))
            if near is not None and dist < DUPLICATE_TOL:
                p.screening["reason"] = (
                    f"duplicate: behaves like archived node {near!r} (distance {dist:.2g})"
                )
                dropped.append(p)
                continue
            novelty = 1.0 if math.isinf(nov) else nov
        gain = float(p.expected_gain)
        # NaN (a JSON reply may hold one; the schema's bounds do not catch it) is unknown: the default
        gain = max(0.0, min(1.0, gain)) if not math.isnan(gain) else 0.5
        score = 0.6 * gain + 0.4 * min(1.0, novelty / NOVELTY_FULL)
        p.score = round(score if p.screening["feasible"] else 0.5 * score, 6)
        survivors.append((p, fp))
    survivors.sort(key=lambda t: (not t[0].screening["feasible"], -t[0].score))
    final: list[tuple[Proposal, list[float] | None]] = []
    for p, fp in survivors:
        twin = next(
            (
                q
                for q, f in final
                if fp is not None and f is not None and distance(fp, f) < DUPLICATE_TOL
            ),
            None,
        )
        if twin is not None:
            p.screening["reason"] = (
                f"duplicate: behaves like the better-ranked proposal {twin.name!r}"
            )
            dropped.append(p)
        else:
            final.append((p, fp))
    return [p for p, _ in final], dropped


def propose_all(
    archive,
    parent: str,
    cfg,
    n: int | None = None,
    proposer: str | None = None,
    seed: int | None = None,
    *,
    llm=None,
    replay: bool = False,
) -> tuple[list[Proposal], list[Proposal]]:
    """(kept[:n] best first, dropped) — :func:`propose` plus the screened-out candidates and why."""
    # lazy: numpy is heavy (only this path needs it)
    from engine.operators.context import build_context

    n = n or cfg.propose.population
    if n < 1:
        raise PoiseError("--n must be >= 1")
    name = proposer or cfg.propose.proposer
    if name == "llm" and llm is None:
        llm = make_client(cfg, archive, replay=replay)
    nodes = archive.nodes(configured_protocol(cfg))
    if parent in nodes:  # a pushed parent's code: refused in one line before anything parses it
        parse_ast(archive.algorithm(parent), f"node {parent}'s algorithm.py")
    ctx = build_context(archive, parent, cfg, seed=seed, nodes=nodes)
    prop = get_proposer(name, llm=llm)
    raw = prop.propose(archive, parent, ctx, cfg, n, seed)
    for p in raw:
        p.proposer = name
    kept, dropped = screen(archive, parent, raw, cfg, nodes=nodes)
    for p in kept[n:]:
        p.screening["reason"] = f"ranked below the top {n}"
    seen: dict[str, int] = {}
    for p in kept[:n]:  # distinct names within one population
        seen[p.name] = seen.get(p.name, 0) + 1
        if seen[p.name] > 1:
            p.name = f"{p.name}-{seen[p.name]}"
    return kept[:n], dropped + kept[n:]


def propose(
    archive,
    parent: str,
    cfg,
    n: int | None = None,
    proposer: str | None = None,
    seed: int | None = None,
    *,
    llm=None,
    replay: bool = False,
) -> list[Proposal]:
    """N screened proposals for ``parent``, best first (``proposer``: offline | llm; default poise.toml)."""
    return propose_all(archive, parent, cfg, n, proposer, seed, llm=llm, replay=replay)[0]
