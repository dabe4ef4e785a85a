"""The proposal context of a parent: the parent itself, tiered references from the archive, literature
priors and the experiment's directive.

Tiers (DESIGN.md): (i) Pareto-frontier nodes; (ii) complementary nodes, chosen for structural contrast
with the parent (Jaccard distance between the identifier sets of their mechanisms); (iii) exploratory
nodes outside the parent's lineage; plus recently rejected nodes with their reasons (negative evidence).
"""

from __future__ import annotations

import ast
import json
import random
from dataclasses import dataclass, field
from typing import Any

from engine.archive.edit import parse_ast
from engine.archive.results import configured_protocol
from engine.config import utility
from engine.errors import EditError
from engine.operators.tokens import count_tokens
from engine.select import objective
from engine.select.pareto import parse_objectives
from engine.untrusted import UNTRUSTED_NOTE, fence, one_line, quoted
from trainer_template import priors

MAX_PER_TIER = 3
CONTEXT_TOKENS = 12000
"""default token budget of the rendered context (``[propose].context_tokens``)"""


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, (int, float)) else str(v)


def metrics_line(
    metrics: dict[str, float], intervals: dict[str, Any], first: str = "overall"
) -> str:
    """Every metric with its 95% interval, the objective first: ``overall=0.41 [0.39, 0.43]; …``."""
    keys = sorted(metrics, key=lambda k: (k != first, k))
    parts = []
    for k in keys:
        iv = intervals.get(k)
        ok = isinstance(iv, (list, tuple)) and len(iv) == 2 and None not in iv
        parts.append(f"{k}={_num(metrics[k])}" + (f" [{_num(iv[0])}, {_num(iv[1])}]" if ok else ""))
    return "; ".join(parts)


def reflection_digest(text: str) -> str:
    """A reflection without its metrics table (the metrics are listed with their intervals anyway)
    and its trajectory table (what stands out in it is a finding): the diagnostics and the
    mechanism-level analysis, whole."""
    keep, skip = [], False
    for line in text.splitlines():
        if line.startswith("# "):
            continue
        if line.startswith("## "):
            skip = line.startswith(("## Metrics vs parent", "## Training trajectory vs parent"))
            if skip:
                continue
        if not skip and line.strip():
            keep.append(line.rstrip())
    return "\n".join(keep)


@dataclass
class NodeSummary:
    name: str
    status: str
    mechanism: str
    metrics: dict[str, float]
    utility: float | None
    reflection: str = ""
    """the node's REFLECTION.md, whole"""
    reason: str = ""
    components: dict | None = None
    intervals: dict[str, Any] = field(default_factory=dict)
    objective: str = "overall"

    def render(self, reflection: str | None = None) -> str:
        """The node as prompt text; ``reflection`` overrides how its reflection is shown.

        All but the engine's own words is archive text, and so one untrusted-data block
        (``engine.untrusted.fence``): the metric names, the mechanism line (a PROPOSAL.md's first
        line or a docstring), the reason (a candidate's own exception text: one quoted line, cut)
        and the reflection."""
        m = metrics_line(self.metrics, self.intervals, self.objective) or "not evaluated"
        u = "—" if self.utility is None else f"{self.utility:.4g}"
        data = f"metrics (95% intervals): {m}\nmechanism: {one_line(self.mechanism)}"
        if self.reason:
            data += f"\nrejected/failed because: {quoted(self.reason)}"
        refl = reflection_digest(self.reflection) if reflection is None else reflection
        if refl:
            data += "\nreflection:\n" + "\n".join(f"  {ln}" for ln in refl.splitlines())
        return f"- {one_line(self.name, 120)} [{self.status}] U={u}\n" + fence(
            f"node {self.name}", data
        )


@dataclass
class Context:
    parent: NodeSummary
    parent_code: str
    frontier: list[NodeSummary] = field(default_factory=list)
    complementary: list[NodeSummary] = field(default_factory=list)
    exploratory: list[NodeSummary] = field(default_factory=list)
    rejected: list[NodeSummary] = field(default_factory=list)
    priors: list[dict[str, str]] = field(default_factory=list)
    directive: str = ""
    proposal: str = ""
    budget_tokens: int = CONTEXT_TOKENS
    trimmed: list[str] = field(default_factory=list)
    """what :meth:`render` left out to stay within the budget (empty when it all fit)"""

    def _text(self, ref_reflection: str, prior_chars: int | None, tiers: int) -> str:
        parts = [UNTRUSTED_NOTE]
        if self.directive:
            parts.append(f"## Research directive\n{self.directive}")
        p = self.parent
        parts.append(
            f"## Parent node\n{p.render(reflection='')}"
            + (
                "\n\n### Parent's reflection (whole)\n"
                + fence(f"REFLECTION.md of {p.name}", p.reflection.strip())
                if p.reflection
                else ""
            )
        )
        if self.proposal:
            parts.append(
                "### Parent's proposal\n"
                + fence(f"PROPOSAL.md of {p.name}", self.proposal, limit=1500)
            )
        parts.append(
            "### Parent's algorithm.py\n" + fence(f"algorithm.py of {p.name}", self.parent_code)
        )
        named = (
            ("Pareto-frontier nodes", self.frontier),
            ("Rejected or failed nodes (avoid repeating these)", self.rejected),
            ("Complementary nodes (structural contrast)", self.complementary),
            ("Exploratory nodes (outside the parent's lineage)", self.exploratory),
        )
        for title, tier in named[:tiers]:
            if tier:
                rendered = []
                for s in tier:
                    refl = None
                    if ref_reflection == "first":
                        lines = reflection_digest(s.reflection).splitlines()
                        refl = next((ln for ln in lines if ln.startswith("- ")), "")
                    elif ref_reflection == "none":
                        refl = ""
                    rendered.append(s.render(reflection=refl))
                parts.append(f"## {title}\n" + "\n".join(rendered))
        if self.priors:
            parts.append(
                "## Literature priors\n"
                + "\n\n".join(
                    f"### {q['name']}\n{q['card'] if prior_chars is None else q['card'][:prior_chars]}"
                    for q in self.priors
                )
            )
        if self.trimmed:
            parts.append(
                f"(context trimmed to its {self.budget_tokens}-token budget: {'; '.join(self.trimmed)})"
            )
        return "\n\n".join(parts)

    def render(self) -> str:
        """The context as prompt text (sections in a fixed order; deterministic for replay).

        The parent is never cut: every metric with its interval, its whole reflection, proposal and
        code. When the text exceeds ``budget_tokens`` (``engine.operators.tokens.count_tokens``),
        the other nodes' reflections shrink to their first finding, then go; prior cards shrink to
        400 characters; then the exploratory and complementary tiers go. What went is said at the
        end of the text and kept in ``trimmed``."""
        steps = [
            ("full", None, 4, None),
            ("first", None, 4, "other nodes' reflections cut to their first finding"),
            ("none", None, 4, "other nodes' reflections left out"),
            ("none", 400, 4, "literature prior cards cut to 400 characters"),
            ("none", 400, 3, "exploratory nodes left out"),
            ("none", 400, 2, "complementary nodes left out"),
        ]
        self.trimmed = []
        text = ""
        for refl, prior_chars, tiers, note in steps:
            if note:
                self.trimmed.append(note)
            text = self._text(refl, prior_chars, tiers)
            if count_tokens(text) <= self.budget_tokens:
                break
        return text


def identifiers(source: str) -> set[str]:
    """Names and attributes a mechanism uses (its structural signature)."""
    try:
        tree = parse_ast(source, "algorithm.py")
    except EditError:  # out of the parser's bounds (a pushed branch's) or no Python
        return set()
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif (
            isinstance(n, ast.Constant)
            and isinstance(n.value, (int, float))
            and not isinstance(n.value, bool)
        ):
            out.add(f"#{n.value!r}")
    return out


def jaccard_distance(a: set[str], b: set[str]) -> float:
    return 1.0 - len(a & b) / max(1, len(a | b))


def pareto_nodes(
    rows: dict[str, dict[str, float]], objectives: tuple[str, ...], exp=None
) -> list[str]:
    """Nodes no other node dominates; '-' minimizes, '+' maximizes, a bare name takes its
    direction from ``exp`` (``engine.config.metric_direction``)."""
    keys = parse_objectives(objectives, exp)
    pts = {n: [m[k] * s for k, s in keys] for n, m in rows.items() if all(k in m for k, _ in keys)}
    return sorted(objective.pareto_front(pts))


def _edit_functions(edit: str) -> str:
    """The functions a prior's edit defines (its Hyperparameters are listed on its card)."""
    try:
        body = ast.parse(edit).body
    except SyntaxError:
        return ""
    lines = edit.splitlines()
    return "\n\n\n".join(
        "\n".join(lines[n.lineno - 1 : n.end_lineno])
        for n in body
        if isinstance(n, ast.FunctionDef)
    )


def load_priors(limit: int = 6) -> list[dict[str, str]]:
    """Literature priors from ``trainer_template.priors``: each card and, under it, the functions the
    prior's edit replaces in the root's algorithm.py (the root itself has none)."""
    out = []
    try:
        for name in list(priors.list_priors())[:limit]:
            card = str(priors.prior_card(name))[:1200]
            code = _edit_functions(priors.prior_edit(name))[:2500]
            if code:
                card += (
                    f"\n\nFunctions it replaces in the root's algorithm.py:\n```python\n{code}\n```"
                )
            out.append({"name": str(name), "card": card})
    except Exception:  # noqa: BLE001 - a broken prior must not stop the search
        return out
    return out


def mechanism_line(proposal_md: str | None, source: str | None) -> str:
    """One line: the proposal's mechanism section or first line, else compute_advantages' docstring."""
    if proposal_md:
        lines = [ln.strip() for ln in proposal_md.splitlines()]
        for i, ln in enumerate(lines):
            if ln.lower().lstrip("#").strip() == "mechanism":
                rest = [x for x in lines[i + 1 :] if x and not x.startswith("#")]
                if rest:
                    return rest[0][:300]
        first = next((ln.lstrip("#").strip() for ln in lines if ln.strip("# ")), "")
        if first:
            return first[:300]
    if source:
        try:
            for n in parse_ast(source, "algorithm.py").body:
                if isinstance(n, ast.FunctionDef) and n.name == "compute_advantages":
                    return (
                        (ast.get_docstring(n) or "").splitlines()[0][:300]
                        if ast.get_docstring(n)
                        else ""
                    )
        except EditError:
            pass
    return "(no description)"


def build_context(archive, parent: str, cfg, *, seed: int | None = None, nodes=None) -> Context:
    """The full context for proposing children of ``parent``; ``seed`` seeds the exploratory sample
    (default: the number of nodes)."""
    nodes = nodes if nodes is not None else archive.nodes(configured_protocol(cfg))
    if parent not in nodes:
        archive.node(parent)  # raises the 'unknown node' error
    names = sorted(nodes, key=lambda n: nodes[n].created)
    specs = [
        f"{nodes[n].commit}:{p}"
        for n in names
        for p in ("algorithm.py", "PROPOSAL.md", "REFLECTION.md", "records/proposal.json")
    ]
    blobs = archive.git.cat_blobs(specs)
    files: dict[str, dict[str, str | None]] = {}
    for i, n in enumerate(names):
        b = blobs[4 * i : 4 * i + 4]
        files[n] = {
            k: (v.decode("utf-8", "replace") if v is not None else None)
            for k, v in zip(("algo", "proposal", "reflection", "components"), b)
        }

    def summary(n: str) -> NodeSummary:
        node, f = nodes[n], files[n]
        refl = f["reflection"] or ""
        comps = None
        if f["components"]:
            try:
                comps = json.loads(f["components"]).get("components")
            except (json.JSONDecodeError, AttributeError):
                comps = None
        return NodeSummary(
            n,
            node.status,
            mechanism_line(f["proposal"], f["algo"]),
            node.metrics,
            utility(node.metrics, cfg.experiment),
            refl,
            node.trailer("Poise-Reason") or "",
            comps,
            dict(node.result.intervals) if node.result is not None else {},
            cfg.experiment.objective,
        )

    lineage = set(archive.descendants(parent, nodes)) | _ancestors(parent, nodes) | {parent}
    evaluated = [n for n in names if nodes[n].metrics and nodes[n].evaluated]
    objectives = tuple(cfg.experiment.pareto_objectives) or (cfg.experiment.objective,)
    front = [
        n
        for n in pareto_nodes({n: nodes[n].metrics for n in evaluated}, objectives, cfg.experiment)
        if n != parent
    ]
    u_front = {n: utility(nodes[n].metrics, cfg.experiment) for n in front}
    front.sort(key=lambda n: (u_front[n] is None, -(u_front[n] or 0.0)))  # U = 0.0 is a utility
    parent_ids = identifiers(files[parent]["algo"] or "")
    comp_pool = [n for n in evaluated if n != parent and n not in front[:MAX_PER_TIER]]
    comp_pool.sort(
        key=lambda n: (-jaccard_distance(parent_ids, identifiers(files[n]["algo"] or "")), n)
    )
    # without a seed, the archive's size (as the offline proposer and `propose --seed` default):
    # an unseeded draw made the exploratory tier, and so prompts and crossovers, differ run to run
    rng = random.Random(len(nodes) if seed is None else seed)
    explore_pool = [
        n
        for n in names
        if n not in lineage
        and nodes[n].status not in ("rejected", "failed")
        and n not in front[:MAX_PER_TIER]
        and n not in comp_pool[:MAX_PER_TIER]
    ]
    rejected = [
        n for n in reversed(names) if n != parent and nodes[n].status in ("rejected", "failed")
    ][:MAX_PER_TIER]
    return Context(
        parent=summary(parent),
        parent_code=files[parent]["algo"] or "",
        frontier=[summary(n) for n in front[:MAX_PER_TIER]],
        complementary=[summary(n) for n in comp_pool[:MAX_PER_TIER]],
        exploratory=[
            summary(n) for n in rng.sample(explore_pool, min(MAX_PER_TIER, len(explore_pool)))
        ],
        rejected=[summary(n) for n in rejected],
        priors=load_priors(),
        directive=cfg.experiment.directive,
        proposal=files[parent]["proposal"] or "",
        budget_tokens=cfg.propose.context_tokens,
    )


def _ancestors(name: str, nodes) -> set[str]:
    out, stack = set(), [name]
    while stack:
        n = stack.pop()
        for p in getattr(nodes.get(n), "parents", ()):
            if p not in out:
                out.add(p)
                stack.append(p)
    return out


def summary_dict(ctx: Context) -> dict[str, Any]:
    return {
        "parent": ctx.parent.name,
        "frontier": [s.name for s in ctx.frontier],
        "complementary": [s.name for s in ctx.complementary],
        "exploratory": [s.name for s in ctx.exploratory],
        "rejected": [s.name for s in ctx.rejected],
        "priors": [p["name"] for p in ctx.priors],
        "directive": ctx.directive,
    }
