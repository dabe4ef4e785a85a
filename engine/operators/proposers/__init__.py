"""Proposers: one interface, one registry. Built-ins (``offline``, ``llm``) register exactly as a
third-party proposer would, with :func:`register`.

A proposer implements::

    propose(archive, parent, context, cfg, n, seed) -> list[Proposal]      # unscreened candidates
    revise(archive, parent, proposal, failure, cfg, node=None) -> Proposal | None   # a fix, or give up
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Protocol

from engine.errors import PoiseError


class Proposer(Protocol):
    name: str

    def propose(self, archive, parent: str, context, cfg, n: int, seed: int | None) -> list: ...

    def revise(
        self, archive, parent: str, proposal, failure: str, cfg, node: str | None = None
    ): ...


_REGISTRY: dict[str, Callable[..., Proposer]] = {}
_BUILTINS = {
    "offline": "engine.operators.proposers.offline",
    "llm": "engine.operators.proposers.llm",
}


def register(name: str):
    """Class decorator: make a proposer available as ``--proposer NAME``; duplicate names are refused."""

    def deco(factory):
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise PoiseError(f"a proposer named {name!r} is already registered")
        _REGISTRY[name] = factory
        factory.name = name
        return factory

    return deco


def is_known(name: str) -> bool:
    """``name`` is a built-in or a registered proposer (the built-ins are not imported for this)."""
    return name in _REGISTRY or name in _BUILTINS


def available() -> list[str]:
    for mod in _BUILTINS.values():
        importlib.import_module(mod)
    return sorted(_REGISTRY)


def get_proposer(name: str, **kwargs) -> Proposer:
    """An instance of the proposer registered as ``name`` (``kwargs``: e.g. ``llm=`` a client)."""
    if name not in _REGISTRY and name in _BUILTINS:
        importlib.import_module(_BUILTINS[name])
    if name not in _REGISTRY:
        raise PoiseError(f"unknown proposer {name!r} (known: {', '.join(available())})")
    return _REGISTRY[name](**kwargs)
