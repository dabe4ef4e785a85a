"""The published mechanisms, stored as edits over the root: one ``<name>.py`` and one card per prior.

Each ``<name>.py`` holds only the top-level definitions the mechanism changes in the root's
``trainer_template/algorithm.py`` (typically ``Hyperparameters`` and ``compute_advantages``; a loss-side
controller replaces ``entropy_coefficient``); names it does not define (``torch``, ``group_stats``,
``grpo_advantages``, ...) come from the root. ``grpo`` is the root itself (an empty edit). The complete
``algorithm.py`` of a prior is the root with the edit applied by the archive's LibCST edit — the same one
``poise-git spawn --edit`` uses — which lives in the engine (``engine.archive.edit.prior_source``), as
this package never imports the engine.

``list_priors()`` names them, ``prior_edit(name)`` returns the edit source, ``prior_card(name)`` the card
(the equation as implemented, every reading chosen, the paper's reported figures).
"""

from __future__ import annotations

from pathlib import Path

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
ROOT_PRIOR = "grpo"


def _build_registry(names) -> dict[str, Path | None]:
    """{name: edit path (None for the root)}; a duplicate name or a name without its .py and .md is
    rejected."""
    registry: dict[str, Path | None] = {}
    for name in names:
        if name in registry:
            raise ValueError(f"duplicate prior name {name!r}")
        card = PRIORS_DIR / f"{name}.md"
        src = None if name == ROOT_PRIOR else PRIORS_DIR / f"{name}.py"
        if (src is not None and not src.is_file()) or not card.is_file():
            raise ValueError(f"prior {name!r} needs both {name}.py and {card.name}")
        registry[name] = src
    return registry


_REGISTRY = _build_registry(_ORDER)


def list_priors() -> list[str]:
    """Names of the registered priors, the root and the literature baselines first."""
    return list(_REGISTRY)


def _check(name: str) -> None:
    if name not in _REGISTRY:
        raise KeyError(f"unknown prior {name!r}; known: {', '.join(_REGISTRY)}")


def prior_edit(name: str) -> str:
    """The prior's edit: the top-level definitions it changes in the root's algorithm.py ('' for
    ``grpo``, the root itself)."""
    _check(name)
    path = _REGISTRY[name]
    return "" if path is None else path.read_text(encoding="utf-8")


def prior_card(name: str) -> str:
    """The prior's markdown card (motivation, equation as implemented, interpretation choices,
    reported results)."""
    _check(name)
    return (PRIORS_DIR / f"{name}.md").read_text(encoding="utf-8")
