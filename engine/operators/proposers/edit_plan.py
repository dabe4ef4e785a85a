"""The smallest edit taking a parent mechanism to a component spec (the offline proposer's edits)."""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.archive.edit import parse_ast
from engine.errors import EditError
from engine.operators.proposers.codegen import (
    ADVANTAGE_COMPONENTS,
    CONTINUOUS,
    DEFAULT_SPEC,
    entropy_source,
    normalize,
    owns,
    render_advantages,
    root_function,
)


@dataclass(frozen=True)
class EditPlan:
    """The smallest change taking a parent to a spec: an edit (top-level definitions), new or changed
    ``Hyperparameters`` defaults, and fields the child no longer uses."""

    edit: str
    hyperparameters: dict[str, Any]
    drop: tuple[str, ...]


def class_defaults(source: str) -> dict[str, Any]:
    """The literal defaults of the ``Hyperparameters`` dataclass in ``source`` (others skipped)."""
    out: dict[str, Any] = {}
    try:
        tree = parse_ast(source, "algorithm.py")
    except EditError:
        return out
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Hyperparameters":
            for st in node.body:
                if (
                    isinstance(st, ast.AnnAssign)
                    and isinstance(st.target, ast.Name)
                    and st.value is not None
                ):
                    try:
                        out[st.target.id] = ast.literal_eval(st.value)
                    except ValueError:
                        continue
    return out


def _reads(source: str, functions: Sequence[str]) -> set[str]:
    """Attributes of ``cfg`` that the named top-level functions of ``source`` read."""
    try:
        tree = parse_ast(source, "algorithm.py")
    except EditError:
        return set()
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in functions:
            out |= {
                n.attr
                for n in ast.walk(node)
                if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.value.id == "cfg"
            }
    return out


def plan_edit(
    parent_source: str, base: Mapping[str, Any], spec: Mapping[str, Any], *, rendered: bool
) -> EditPlan:
    """The edit taking ``parent_source`` (whose mechanism is ``base``) to ``spec``.

    ``compute_advantages`` is rewritten only when an advantage component differs, the entropy
    controller only when ``entropy_control`` differs, and the root's ``policy_loss`` (with its
    ``entropy_coefficient`` when the parent has none) is brought in only when a changed loss knob is
    not read by the parent's loss. Changed hyperparameters become new field defaults; continuous
    hyperparameters owned by a component option the child no longer has are dropped. ``rendered``:
    the parent's code was generated from ``base`` (else its own functions are kept where possible)."""
    b, s = normalize(base), normalize(spec)
    edits: list[str] = []
    advantage_changed = any(s[k] != b[k] for k in ADVANTAGE_COMPONENTS)
    entropy_changed = s["entropy_control"] != b["entropy_control"]
    if advantage_changed:
        edits.append(render_advantages(s))
    if entropy_changed:
        edits.append(entropy_source(s["entropy_control"]))
    have = class_defaults(parent_source)
    values = {
        k: v
        for k, v in s["hp"].items()
        if k not in have or have[k] != v or type(have[k]) is not type(v)
    }
    loss_reads = _reads(parent_source, ("policy_loss", "entropy_coefficient"))
    loss_knobs = [k for k in values if k in DEFAULT_SPEC["hp"] and k != "eps"]
    if any(k not in loss_reads for k in loss_knobs) or (
        entropy_changed and "def entropy_coefficient" not in parent_source
    ):
        if not entropy_changed and "def entropy_coefficient" not in parent_source:
            edits.append(entropy_source(s["entropy_control"]))
        edits.append(root_function("policy_loss"))
    owned = {h: c[4] for h, c in CONTINUOUS.items() if c[4] is not None}
    drop = tuple(sorted(k for k in have if k in owned and not owns(owned[k], s)))
    if not (advantage_changed or entropy_changed):
        drop = ()
    return EditPlan("\n\n".join(edits), values, drop)
