"""Set a candidate's ``Hyperparameters`` defaults with LibCST (every other byte of the file kept)."""

from __future__ import annotations

import json
import keyword
from collections.abc import Mapping
from typing import Any

import libcst as cst

from engine.errors import EditError


def _literal(value: Any) -> cst.BaseExpression:
    if isinstance(value, bool) or isinstance(value, (int, float, str)):
        return cst.parse_expression(json.dumps(value) if isinstance(value, str) else repr(value))
    raise EditError(f"hyperparameter value {value!r} must be a number, bool or string")


class _Defaults(cst.CSTTransformer):
    def __init__(self, values: Mapping[str, Any]):
        self.values = dict(values)
        self.done: set[str] = set()
        self.found = False

    def leave_ClassDef(self, original, updated):
        if updated.name.value != "Hyperparameters":
            return updated
        self.found = True
        body = list(updated.body.body)
        for i, stmt in enumerate(body):
            if isinstance(stmt, cst.SimpleStatementLine) and isinstance(
                stmt.body[0], cst.AnnAssign
            ):
                ann = stmt.body[0]
                if isinstance(ann.target, cst.Name) and ann.target.value in self.values:
                    body[i] = stmt.with_changes(
                        body=[ann.with_changes(value=_literal(self.values[ann.target.value]))]
                    )
                    self.done.add(ann.target.value)
        for k, v in self.values.items():
            if k not in self.done:
                body.append(cst.parse_statement(f"{k}: {type(v).__name__} = {v!r}\n"))
                self.done.add(k)
        return updated.with_changes(body=updated.body.with_changes(body=body))


def set_defaults(source: str, values: Mapping[str, Any]) -> str:
    """``source`` with the ``Hyperparameters`` dataclass defaults set (missing fields appended)."""
    for k, v in values.items():
        if (
            not isinstance(k, str)
            or not k.isidentifier()
            or keyword.iskeyword(k)
            or k.startswith("_")
        ):
            raise EditError(f"bad hyperparameter name {k!r}")
        _literal(v)
    t = _Defaults(values)
    out = cst.parse_module(source).visit(t)
    if not t.found:
        raise EditError("algorithm.py has no Hyperparameters dataclass to set hyperparameters on")
    return out.code
