"""Parent selection (the acquisition s(d)) and the retrospective parent-retention analysis.

``select_parents(archive, cfg, k=None, seed=None, exclude=()) -> Selection``;
``retrospect(archive, cfg=None) -> dict``. See docs/selection.md.
"""

from engine.select.core import SelectError, Selection, select_parents
from engine.select.retrospect import retrospect

__all__ = ["Selection", "SelectError", "select_parents", "retrospect"]
