"""One process at a time evaluates a node: the proxy's ``evaluate``, ``evaluate --suite``,
``evaluate --backend verl`` and the loop's workers all hold the node's evaluation lock while they
evaluate it, so that two never evaluate one node at once and the later result silently replaces the
earlier. A process that finds it taken stops at once with one line naming the holder, or (the loop's
workers) waits, then uses the result the other recorded when it is the one it would have recorded."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

from engine.archive.locks import git_dir, held
from engine.archive.results import EvaluationResult, Protocol, now
from engine.errors import EvaluationError

EVAL_LOCKS = "poise-eval"
"""the directory in the archive's git directory holding one lock file per node being evaluated"""


def node_evaluation(
    archive, name: str, *, wait: bool = False, on_wait: Callable[[str], None] | None = None
) -> AbstractContextManager[bool]:
    """Held while this process evaluates ``name`` (``poise-git evaluate`` on every backend, with
    ``--suite``, and the loop's workers alike), so that two never evaluate one node at once and the
    later result silently replaces the earlier. Yields whether it waited for another process
    (``on_wait(holder)`` before it does); without ``wait``, EvaluationError at once when another
    holds it."""
    locks = os.path.join(git_dir(archive), EVAL_LOCKS)
    os.makedirs(locks, exist_ok=True)
    return held(
        os.path.join(locks, f"{name}.lock"),
        lambda holder: EvaluationError(
            f"{name} is being evaluated by another process ({holder}); wait for it to finish, "
            "then read its result with `poise-git show`"
        ),
        wait=wait,
        on_wait=on_wait,
    )


def not_this_evaluation(
    done: EvaluationResult | None, ours: Protocol, seeds: Sequence[int], asked: float
) -> str:
    """Why ``done``, what the process waited for left under ``ours.id``, is not the result of this
    evaluation (of ``seeds`` under ``ours``, asked at ``asked``); "" when it is."""
    if done is None or done.recorded_at < asked:
        return "it recorded no result"
    if done.protocol.hash != ours.hash:
        return f"its result is under another version of {ours.id} ({done.protocol.hash[:12]})"
    if list(done.seeds) != list(seeds):
        return f"its result is at seeds {list(done.seeds)}, not {list(seeds)}"
    return ""


@contextmanager
def evaluation_turn(
    archive,
    name: str,
    ours: Protocol,
    seeds: Sequence[int],
    *,
    wait: bool = False,
    on_wait: Callable[[str, str], None] | None = None,
) -> Iterator[EvaluationResult | None]:
    """Hold ``name``'s evaluation lock (:func:`node_evaluation`) for the ``with`` block, yielding the
    result the process this one waited for recorded when it is this evaluation's (under ``ours`` at
    ``seeds``, :func:`not_this_evaluation`): the caller returns it instead of evaluating; else None,
    and the caller evaluates. ``on_wait(what, detail)`` is told of a wait: ``("waiting", holder)``
    before it, then ``("used", "")`` when the other's result is yielded, or ``("evaluating", why)``
    when the caller is to evaluate (``why`` "" when it did not wait)."""
    asked = now()
    told = on_wait or (lambda what, detail: None)
    waiting = functools.partial(told, "waiting")
    with node_evaluation(archive, name, wait=wait, on_wait=waiting) as waited:
        done = archive.node(name).results.get(ours.id) if waited else None
        why = not_this_evaluation(done, ours, seeds, asked) if waited else ""
        if waited and not why:
            told("used", "")
            yield done  # the process this one waited for has just evaluated it so
            return
        told("evaluating", why)
        yield None
