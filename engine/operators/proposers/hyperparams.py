"""Set a candidate's ``Hyperparameters`` defaults with LibCST (every other byte of the file kept)."""

from __future__ import annotations

import keyword
import math
from collections.abc import Mapping, Sequence
from typing import Any

import libcst as cst

from engine.archive.edit import _parse
from engine.errors import EditError
from engine.operators.proposers.codegen import HP_DOCS, source_literal


def _literal(value: Any) -> cst.BaseExpression:
    if isinstance(value, float) and not math.isfinite(value):  # no literal: `nan` is a NameError
        raise EditError(f"hyperparameter value {value!r} must be a finite number")
    if isinstance(value, bool) or isinstance(value, (int, float, str)):
        return cst.parse_expression(source_literal(value))
    raise EditError(f"hyperparameter value {value!r} must be a number, bool or string")


def _field_name(stmt: cst.BaseStatement) -> str | None:
    if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.AnnAssign):
        target = stmt.body[0].target
        return target.value if isinstance(target, cst.Name) else None
    return None


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


class _Defaults(cst.CSTTransformer):
    def __init__(self, values: Mapping[str, Any], docs: Mapping[str, str], drop: set[str]):
        self.values = dict(values)
        self.docs = docs
        self.drop = drop
        self.done: set[str] = set()
        self.found = False

    def leave_ClassDef(self, original, updated):
        if updated.name.value != "Hyperparameters":
            return updated
        self.found = True
        body: list[cst.BaseStatement] = []
        dropping = False
        for stmt in updated.body.body:
            name = _field_name(stmt)
            if dropping and _is_docstring(stmt):  # the dropped field's docstring goes with it
                dropping = False
                continue
            dropping = False
            if name in self.drop:
                dropping = True
                continue
            if name in self.values:
                ann = stmt.body[0]
                stmt = stmt.with_changes(body=[ann.with_changes(value=_literal(self.values[name]))])
                self.done.add(name)
            body.append(stmt)
        for k, v in self.values.items():
            if k not in self.done:
                body.append(cst.parse_statement(f"{k}: {type(v).__name__} = {source_literal(v)}\n"))
                doc = self.docs.get(k)
                if doc:
                    body.append(cst.parse_statement(f'"""{doc}"""\n'))
                self.done.add(k)
        return updated.with_changes(body=updated.body.with_changes(body=body))


def set_defaults(
    source: str,
    values: Mapping[str, Any],
    drop: Sequence[str] = (),
    docs: Mapping[str, str] | None = None,
) -> str:
    """``source`` with the ``Hyperparameters`` dataclass defaults set: changed fields get the new
    literal, missing ones are appended (with their docstring from ``docs``, default the offline
    catalogue's), ``drop`` fields are removed with their docstrings; every other byte is kept."""
    for k, v in values.items():
        if (
            not isinstance(k, str)
            or not k.isidentifier()
            or keyword.iskeyword(k)
            or k.startswith("_")
        ):
            raise EditError(f"bad hyperparameter name {k!r}")
        _literal(v)
    t = _Defaults(values, HP_DOCS if docs is None else docs, set(drop) - set(values))
    out = _parse(source, "algorithm.py").visit(t)  # within the parser's bounds
    if not t.found:
        raise EditError("algorithm.py has no Hyperparameters dataclass to set hyperparameters on")
    return out.code
