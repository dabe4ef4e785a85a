"""The proposal context of a parent: the parent itself, tiered references from the archive, literature
priors and the experiment's directive.

Tiers (DESIGN.md): (i) Pareto-frontier nodes; (ii) complementary nodes, chosen for structural contrast
with the parent (Jaccard distance between the identifier sets of their mechanisms); (iii) exploratory
nodes outside the parent's lineage; plus recently rejected nodes with their reasons (negative evidence).
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass, field
from typing import Any

from engine.archive.results import configured_protocol
from engine.config import utility
from engine.select import objective

MAX_PER_TIER = 3


@dataclass
class NodeSummary:
    name: str
    status: str
    mechanism: str
    metrics: dict[str, float]
    utility: float | None
    reflection: str = ""
    reason: str = ""
    components: dict | None = None

    def render(self) -> str:
        m = (
            ", ".join(f"{k}={v:.4g}" for k, v in sorted(self.metrics.items())[:8])
            or "not evaluated"
        )
        u = "—" if self.utility is None else f"{self.utility:.4g}"
        out = f"- {self.name} [{self.status}] U={u}; {m}\n  mechanism: {self.mechanism}"
        if self.reason:
            out += f"\n  rejected/failed because: {self.reason}"
        if self.reflection:
            out += f"\n  reflection: {self.reflection}"
        return out


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

    def render(self) -> str:
        """The context as prompt text (sections in a fixed order; deterministic for replay)."""
        parts = []
        if self.directive:
            parts.append(f"## Research directive\n{self.directive}")
        parts.append(f"## Parent node\n{self.parent.render()}")
        if self.proposal:
            parts.append(f"### Parent's proposal\n{self.proposal[:1500]}")
        parts.append(f"### Parent's algorithm.py\n```python\n{self.parent_code}\n```")
        for title, tier in (
            ("Pareto-frontier nodes", self.frontier),
            ("Complementary nodes (structural contrast)", self.complementary),
            ("Exploratory nodes (outside the parent's lineage)", self.exploratory),
            ("Rejected or failed nodes (avoid repeating these)", self.rejected),
        ):
            if tier:
                parts.append(f"## {title}\n" + "\n".join(s.render() for s in tier))
        if self.priors:
            parts.append(
                "## Literature priors\n"
                + "\n\n".join(f"### {p['name']}\n{p['card']}" for p in self.priors)
            )
        return "\n\n".join(parts)


def identifiers(source: str) -> set[str]:
    """Names and attributes a mechanism uses (its structural signature)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
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


def pareto_front(rows: dict[str, dict[str, float]], objectives: tuple[str, ...]) -> list[str]:
    """Nodes no other node dominates; an objective prefixed '-' is minimized."""
    keys = [(o.lstrip("-"), -1.0 if o.startswith("-") else 1.0) for o in objectives]
    pts = {n: [m[k] * s for k, s in keys] for n, m in rows.items() if all(k in m for k, _ in keys)}
    return sorted(objective.pareto_front(pts))


def load_priors(limit: int = 6) -> list[dict[str, str]]:
    """Literature prior cards from ``trainer_template.priors``."""
    from trainer_template import priors

    out = []
    try:
        for name in list(priors.list_priors())[:limit]:
            card = priors.prior_card(name)
            out.append({"name": str(name), "card": str(card)[:1200]})
    except Exception:  # noqa: BLE001 - a broken prior card must not stop the search
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
            for n in ast.parse(source).body:
                if isinstance(n, ast.FunctionDef) and n.name == "compute_advantages":
                    return (
                        (ast.get_docstring(n) or "").splitlines()[0][:300]
                        if ast.get_docstring(n)
                        else ""
                    )
        except SyntaxError:
            pass
    return "(no description)"


def build_context(archive, parent: str, cfg, *, seed: int | None = None, nodes=None) -> Context:
    """The full context for proposing children of ``parent``."""
    import json

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
        refl = " ".join((f["reflection"] or "").split())[:500]
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
        )

    lineage = set(archive.descendants(parent, nodes)) | _ancestors(parent, nodes) | {parent}
    evaluated = [n for n in names if nodes[n].metrics and nodes[n].evaluated]
    objectives = tuple(cfg.experiment.pareto_objectives) or (cfg.experiment.objective,)
    front = [
        n for n in pareto_front({n: nodes[n].metrics for n in evaluated}, objectives) if n != parent
    ]
    front.sort(key=lambda n: -(utility(nodes[n].metrics, cfg.experiment) or -1e9))
    parent_ids = identifiers(files[parent]["algo"] or "")
    comp_pool = [n for n in evaluated if n != parent and n not in front[:MAX_PER_TIER]]
    comp_pool.sort(
        key=lambda n: (-jaccard_distance(parent_ids, identifiers(files[n]["algo"] or "")), n)
    )
    rng = random.Random(seed)
    explore_pool = [
        n
        for n in names
        if n not in lineage
        and nodes[n].status not in ("rejected", "failed")
        and n not in front[:MAX_PER_TIER]
        and n not in comp_pool[:MAX_PER_TIER]
    ]
    rejected = [n for n in reversed(names) if nodes[n].status in ("rejected", "failed")][
        :MAX_PER_TIER
    ]
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
