"""A node's changes to the root's ``algorithm.py``, and the node with one of them reverted: the edits
``poise-git ablate`` (``engine.operators.ablate``) spawns as children. Pure source work (ast and
LibCST); nothing here touches an archive."""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

from engine.archive.edit import _parse, apply_edit, defined_names, parse_ast
from engine.archive.mechanism import normalized
from engine.errors import EvaluationError
from engine.operators.proposers.edit_plan import class_defaults
from engine.operators.proposers.hyperparams import set_defaults

HYPERPARAMETER, DEFINITION, ADDED = "hyperparameter", "definition", "added"


@dataclasses.dataclass(frozen=True)
class Change:
    """One change of a node's ``algorithm.py`` to the root's: a ``Hyperparameters`` default
    (``hyperparameter``), a top-level definition both have that differs beyond docstrings
    (``definition``; one only the root has counts too), or a definition only the node has that no
    other definition calls (``added``: a hook the harness looks up by name)."""

    kind: str
    name: str
    node_value: Any = None
    root_value: Any = None

    def describe(self) -> str:
        if self.kind == HYPERPARAMETER:
            return f"{self.name} = {self.node_value!r} (root: {self.root_value!r})"
        if self.kind == ADDED:
            return f"{self.name} (added; the root has none)"
        return f"{self.name} (rewritten)"

    @property
    def slug(self) -> str:
        return self.name.replace("_", "-").lower()


def _definitions(tree: ast.Module) -> dict[str, ast.stmt]:
    """Top-level functions, classes and single-name assignments by name (``Hyperparameters`` apart)."""
    out: dict[str, ast.stmt] = {}
    for st in tree.body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = st.name
        elif isinstance(st, ast.Assign) and len(st.targets) == 1:
            name = getattr(st.targets[0], "id", None)
        elif isinstance(st, ast.AnnAssign):
            name = getattr(st.target, "id", None)
        else:
            continue
        if name and name != "Hyperparameters":
            out[name] = st
    return out


def _same(a: ast.stmt, b: ast.stmt) -> bool:
    return normalized(ast.unparse(a)) == normalized(ast.unparse(b))


def _referenced(defs: dict[str, ast.stmt], name: str) -> bool:
    """Whether any other definition names ``name`` (a helper of a rewritten definition)."""
    return any(
        isinstance(n, ast.Name) and n.id == name
        for other, st in defs.items()
        if other != name
        for n in ast.walk(st)
    )


def node_changes(node_src: str, root_src: str) -> list[Change]:
    """The node's changes to the root, hyperparameters first, each in file order."""
    node_tree = parse_ast(node_src, "the node's algorithm.py")  # a pushed branch's: bounded
    root_tree = parse_ast(root_src, "the root's algorithm.py")
    node_hp, root_hp = class_defaults(node_src), class_defaults(root_src)
    changes = [
        Change(HYPERPARAMETER, k, node_hp.get(k), v)
        for k, v in root_hp.items()
        if k not in node_hp or node_hp[k] != v or type(node_hp[k]) is not type(v)
    ]
    node_defs, root_defs = _definitions(node_tree), _definitions(root_tree)
    for name, st in node_defs.items():
        if name in root_defs:
            if not _same(st, root_defs[name]):
                changes.append(Change(DEFINITION, name))
        elif not _referenced(node_defs, name):
            changes.append(Change(ADDED, name))
    changes += [Change(DEFINITION, n) for n in root_defs if n not in node_defs]
    return changes


def without(node_src: str, root_src: str, change: Change) -> str:
    """``node_src`` with ``change`` reverted to the root's; every other byte kept."""
    if change.kind == HYPERPARAMETER:
        return set_defaults(node_src, {change.name: change.root_value})
    if change.kind == ADDED:
        mod = _parse(node_src, "the node's algorithm.py")
        body = [st for st in mod.body if change.name not in defined_names(st)]
        return mod.with_changes(body=body).code
    root = _parse(root_src, "the root's algorithm.py")
    for st in root.body:
        if change.name in defined_names(st):
            return apply_edit(node_src, root.code_for_node(st))
    raise EvaluationError(f"ablate: the root has no definition {change.name!r}")
