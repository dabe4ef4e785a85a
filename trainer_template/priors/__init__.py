"""The published mechanisms: one complete ``algorithm.py`` alternative per prior, plus a markdown card.

``list_priors()`` names them, ``prior_source(name)`` returns the module source (spawnable with
``Archive.spawn(parent, name, algorithm=prior_source(name))``), ``prior_card(name)`` the card.
"""

from __future__ import annotations

from pathlib import Path

from trainer_template import ALGORITHM_FILE

PRIORS_DIR = Path(__file__).resolve().parent

_ORDER = (
    "grpo",
    "dr_grpo",
    "rloo",
    "dapo",
    "av_grpo",
    "vm_av_grpo",
    "msa_grpo",
    "fa_grpo",
    "bn_grpo",
    "sa_grpo",
    "dfr_grpo",
    "dace_grpo",
    "cag_grpo",
    "dcbe_grpo",
)


def _build_registry(names) -> dict[str, Path]:
    """{name: module path}; a duplicate name or a name without its .py and .md is rejected.

    ``grpo`` is the root itself: its module is ``trainer_template/algorithm.py`` (one copy, not a twin)."""
    registry: dict[str, Path] = {}
    for name in names:
        if name in registry:
            raise ValueError(f"duplicate prior name {name!r}")
        src = ALGORITHM_FILE if name == "grpo" else PRIORS_DIR / f"{name}.py"
        card = PRIORS_DIR / f"{name}.md"
        if not src.is_file() or not card.is_file():
            raise ValueError(f"prior {name!r} needs both {src.name} and {card.name}")
        registry[name] = src
    return registry


_REGISTRY = _build_registry(_ORDER)


def list_priors() -> list[str]:
    """Names of the registered priors, the literature baselines first."""
    return list(_REGISTRY)


def _path(name: str) -> Path:
    if name not in _REGISTRY:
        raise KeyError(f"unknown prior {name!r}; known: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def prior_source(name: str) -> str:
    """The prior's complete algorithm.py source."""
    return _path(name).read_text(encoding="utf-8")


def prior_card(name: str) -> str:
    """The prior's markdown card (motivation, method, equations, reported results)."""
    _path(name)  # an unknown name raises KeyError
    return (PRIORS_DIR / f"{name}.md").read_text(encoding="utf-8")
