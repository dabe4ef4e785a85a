"""Errors of the evaluators (one clear line in the CLI)."""

from engine.errors import PoiseError


class EvaluationError(PoiseError):
    """A suite evaluation cannot run as asked (unknown suite/backend, missing model, no server...)."""
