"""What evaluating a node again replaces: a node holds one result per protocol id, so a second
``poise-git evaluate`` under the same id (a legitimate re-run, with more seeds, say; on the proxy
or a ``--suite``) replaces the first. :func:`replaced_line` says so in one progress line: which
result, that the new one has fewer seeds where it has, and which seeds the per-seed cache reads
back rather than trains again. A verl evaluation records its outcome (a scored checkpoint or a
failed training) under the suite protocol it scores under, which it knows before training:
:func:`verl_replaced_lines` says what it replaces, and which older failure it removes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from engine.archive.results import EvaluationResult, Protocol, seeds_phrase


def replaced_line(
    old: EvaluationResult | None,
    protocol_hash: str,
    seeds: Sequence[int],
    cached: Sequence[int] = (),
) -> str | None:
    """One line on the result ``old`` that an evaluation at ``seeds`` under ``protocol_hash`` (the
    same protocol id) replaces; ``cached``: the seeds read back from the per-seed cache. None when
    there is nothing to replace."""
    if old is None:
        return None
    version = (
        f"; another version of {old.protocol.id}" if old.protocol.hash != protocol_hash else ""
    )
    line = f"replaces the {old.status} result under {old.protocol.key} "
    line += f"({seeds_phrase(old.seeds)}{version})"
    if old.seeds and len(seeds) < len(old.seeds):
        line += f": the new one has fewer seeds ({seeds_phrase(seeds)})"
    if cached:
        some = f"seed {cached[0]} is" if len(cached) == 1 else f"{seeds_phrase(cached)} are"
        line += (
            f"; {some} read back from the per-seed cache ($POISE_EVAL_CACHE), measured before "
            "under the same code, protocol and harness"
        )
    return line


def verl_replaced_lines(
    results: Mapping[str, EvaluationResult],
    scored: Protocol,
    seeds: Sequence[int],
    legacy: Protocol,
) -> list[str]:
    """What a verl evaluation replaces among the node's ``results`` (protocol id -> result), said
    before it trains: the result under ``scored`` (the suite protocol its checkpoint is scored
    under, at ``seeds``), which its outcome replaces whichever it is (the trained checkpoint's
    score, or the training's failure: both are recorded there); and a failure an earlier version
    recorded under ``legacy`` (``verl/paper``), removed once this outcome is recorded."""
    lines = []
    line = replaced_line(results.get(scored.id), scored.hash, seeds)
    if line:
        lines.append(
            f"{line} with this evaluation's outcome: the trained checkpoint's score, or the "
            "failure if training fails"
        )
    old = results.get(legacy.id)
    if old is not None and not old.ok:
        lines.append(
            f"removes the failed result under {old.protocol.key} ({seeds_phrase(old.seeds)}), an "
            "earlier training's, once this evaluation's outcome is recorded"
        )
    return lines
