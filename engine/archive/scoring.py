"""The identity of a suite protocol (``<suite>/<preset>`` and the hash of its settings) from its
settings alone, and the settings a verl evaluation scores its checkpoint with.

It lives in the archive layer, beside what names a proxy protocol, because the archive names the
protocol an experiment ranks under (``results.configured_protocol``): a verl experiment ranks under
the suite protocol its checkpoints are scored under, whose hash depends on the suite's settings
(``evaluators``) and on no operator. ``engine.operators.evaluate_suite`` builds its typed
``Protocol`` from :func:`suite_identity`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import EvaluationError
from evaluators.benchmarks import Benchmark
from evaluators.benchmarks import suite as suite_spec
from evaluators.errors import SuiteError
from evaluators.suite import protocol, protocol_hash

SUITE_SEED = 0
"""the sampling seed of a suite evaluation unless one is given"""
SUITE_GRADE_TIMEOUT_S = 10.0
"""seconds one answer's grading may take unless told otherwise (part of the protocol)"""
SCORING = {"suite": "math6", "generator": "vllm"}
"""how a verl evaluation scores its checkpoint: a suite evaluation with these settings (the rest its
defaults), so its result is recorded under ``suite_identity(**SCORING)``, and a verl experiment
without ``[evaluation].protocol`` ranks under it"""


@dataclass(frozen=True)
class SuiteIdentity:
    """What a suite evaluation's settings define before anything runs."""

    id: str
    """``<suite>/<preset>``"""
    hash: str
    preset: str
    settings: dict[str, Any]
    """what the hash covers (``evaluators.suite.protocol``)"""
    benchmarks: tuple[Benchmark, ...]
    max_tokens: int


def _suite_benchmarks(suite: str, preset: str | None) -> tuple[str, tuple[Benchmark, ...], int]:
    """(preset, benchmarks, token budget) of ``suite`` at ``preset`` (None or default: paper). An
    unknown suite or preset, or a shipped dataset missing or damaged, raises EvaluationError."""
    preset = {None: "paper", "default": "paper"}.get(preset, preset)
    try:
        benches, max_tokens = suite_spec(suite, preset)
    except SuiteError as exc:
        raise EvaluationError(str(exc)) from None
    return preset, benches, max_tokens


def suite_identity(
    suite: str = "math6",
    preset: str | None = None,
    generator: str = "transformers",
    *,
    limit: int | None = None,
    grade_timeout_s: float = SUITE_GRADE_TIMEOUT_S,
    seed: int = SUITE_SEED,
) -> SuiteIdentity:
    """The id, hash and settings a suite evaluation with these settings records under."""
    preset, benches, max_tokens = _suite_benchmarks(suite, preset)
    settings = protocol(suite, preset, benches, max_tokens, limit, grade_timeout_s, seed, generator)
    return SuiteIdentity(
        f"{suite}/{preset}", protocol_hash(settings), preset, settings, benches, max_tokens
    )


def verl_ranking_id() -> tuple[str, str]:
    """(id, hash) of the protocol a verl experiment ranks under when its poise.toml names none: the
    one its checkpoints are scored under and its failed trainings recorded under. Where the shipped
    datasets cannot be read (the hash covers their content), the id alone: a broken installation
    still lists its archive, and the scoring refuses to run there anyway."""
    try:
        ident = suite_identity(**SCORING)
    except EvaluationError:
        return f"{SCORING['suite']}/paper", ""
    return ident.id, ident.hash
