"""Load a candidate's ``algorithm.py`` source as a fresh module (never from the working directory)."""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import types
from collections.abc import Mapping
from typing import Any

from trainer_template import INTERFACE_FUNCTIONS


class AlgorithmLoadError(RuntimeError):
    """The candidate's module could not be executed or lacks the interface."""


def load_algorithm(source: str, name: str = "candidate") -> types.ModuleType:
    """Execute ``source`` as a module named ``poise_algorithm_<name>_<hash>`` and check the interface."""
    digest = hashlib.sha1(source.encode("utf-8")).hexdigest()[:10]
    mod_name = f"poise_algorithm_{''.join(c if c.isalnum() else '_' for c in name)}_{digest}"
    module = types.ModuleType(mod_name)
    module.__file__ = f"<poise:{name}/algorithm.py>"
    sys.modules[mod_name] = (
        module  # dataclasses need the module registered while the class body runs
    )
    try:
        exec(compile(source, module.__file__, "exec"), module.__dict__)
    except Exception as exc:
        sys.modules.pop(mod_name, None)
        raise AlgorithmLoadError(
            f"{name}/algorithm.py failed to load: {type(exc).__name__}: {exc}"
        ) from exc
    for fn in INTERFACE_FUNCTIONS:
        if not callable(getattr(module, fn, None)):
            raise AlgorithmLoadError(f"{name}/algorithm.py defines no {fn}()")
    return module


def make_config(module: types.ModuleType, overrides: Mapping[str, Any] | None = None) -> Any:
    """Instantiate the module's ``Hyperparameters`` dataclass with ``overrides`` (unknown keys rejected)."""
    cls = getattr(module, "Hyperparameters", None)
    if cls is None or not dataclasses.is_dataclass(cls):
        if overrides:
            raise AlgorithmLoadError(
                "algorithm.py has no Hyperparameters dataclass to apply overrides to"
            )
        return types.SimpleNamespace()
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(overrides or {}) - names
    if unknown:
        raise AlgorithmLoadError(
            f"unknown hyperparameters {sorted(unknown)}; known: {sorted(names)}"
        )
    return cls(**dict(overrides or {}))
