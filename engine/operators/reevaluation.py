"""What evaluating a node again replaces: a node holds one result per protocol id, so a second
``poise-git evaluate`` under the same id (a legitimate re-run, with more seeds, say; on the proxy
or a ``--suite``) replaces the first. :func:`replaced_line` says so in one progress line: which
result, that the new one has fewer seeds where it has, and which seeds the per-seed cache reads
back rather than trains again. A verl evaluation records under one of two ids, which it knows before
training: :func:`verl_replaced_lines` says what each would replace."""

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
    failed: Protocol,
) -> list[str]:
    """What a verl evaluation replaces among the node's ``results`` (protocol id -> result), said
    before it trains: the result under ``scored`` (the suite protocol its checkpoint is scored
    under, at ``seeds``) when training succeeds, the one under ``failed`` when it does not (a
    failure there is removed when training succeeds: the scored checkpoint supersedes it)."""
    lines = []
    scored_line = replaced_line(results.get(scored.id), scored.hash, seeds)
    if scored_line:
        lines.append(f"{scored_line} once the trained checkpoint is scored")
    failed_line = replaced_line(results.get(failed.id), failed.hash, ())
    if failed_line:
        failed_line += " if training fails"
        if not results[failed.id].ok:  # a scored checkpoint supersedes an earlier failure
            failed_line += ", and is removed once the trained checkpoint is scored"
        lines.append(failed_line)
    return lines
