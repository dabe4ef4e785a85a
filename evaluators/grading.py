"""Answer extraction and grading with math-verify (gold first).

math-verify bounds its own work with SIGALRM, which only works in a process's main thread. Here its
internal timeouts are switched off and one per-pair bound (``signal.setitimer``) wraps parse + verify
instead; :mod:`evaluators.pool` runs this in worker processes and adds a watchdog that kills a worker
stuck past the bound. Outside a main thread no bound is applied.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from dataclasses import dataclass

# Bump when extraction, normalization or the math-verify call changes: it is recorded with every result.
GRADER_VERSION = "math6-grader/2"


@dataclass(frozen=True)
class Grade:
    """One graded sample. ``status``: ok | no_answer | unparsable | timeout | error | crash."""

    correct: bool
    valid: bool  # format validity: a non-empty boxed answer math-verify extracts anything from
    status: str = "ok"
    detail: str = ""


class GradingTimeout(BaseException):
    """The per-pair time bound expired (a BaseException: math-verify swallows every Exception)."""


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces; None if absent."""
    if not text:
        return None
    best = None
    for marker in ("\\boxed", "\\fbox"):
        start = text.rfind(marker)
        if start > (best[0] if best else -1):
            best = (start, marker)
    if best is None:
        return None
    i = best[0] + len(best[1])
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
        j += 1
    return None


_MATH_DOLLAR = re.compile(r"(?<!\\)\$")


def normalize_gold(answer) -> str:
    """A gold answer as a LaTeX string: ``27.0`` -> ``27``; a trailing period and every math-mode
    ``$`` dropped (``"$221,$8$"`` -> ``221,8``: a ``$`` left inside made math-verify read one part
    of the answer as the whole); an escaped ``\\$`` (a currency sign) is kept."""
    if isinstance(answer, float):
        return str(int(answer)) if answer.is_integer() else repr(answer)
    if isinstance(answer, int):
        return str(answer)
    s = str(answer).strip()
    if s.endswith(".") and not s.endswith("..."):
        s = s[:-1].rstrip()
    return _MATH_DOLLAR.sub("", s).strip()


def join_answers(parts: list[str]) -> str:
    """Several gold answers (``"$69$,$84$"`` split into parts) as one comma-separated set ``69, 84``."""
    return ", ".join(p for p in (normalize_gold(x) for x in parts) if p)


def split_dollar_answers(s: str) -> list[str]:
    """``"$69$,$84$"`` -> ``["69", "84"]``; a string without ``$…$`` groups -> ``[s]``."""
    s = s.strip()
    if s.count("$") >= 4 and s.count("$") % 2 == 0:
        parts = s.split("$")[1::2]
        return [p.strip() for p in parts if p.strip()]
    return [s]


def _quiet_math_verify() -> None:
    for name in ("math_verify", "math_verify.grader", "math_verify.parser"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _wrap(s: str) -> str:
    s = str(s).strip()
    if s.startswith("$") or "\\boxed" in s:
        return s
    return f"${s}$"


def _verify(gold: str, prediction: str) -> tuple[bool, bool]:
    """(correct, prediction parsable), math-verify with its own alarms off."""
    from math_verify import parse, verify  # lazy: math_verify is heavy (only this path needs it)

    p = parse(_wrap(prediction), parsing_timeout=None)
    if not p:
        return False, False
    g = parse(_wrap(gold), parsing_timeout=None)
    if not g:
        return False, True
    return bool(verify(g, p, timeout_seconds=None)), True


def grade_answer(gold: str, prediction: str | None, timeout_s: float | None = 5.0) -> Grade:
    """Grade an extracted answer against a gold answer under one time bound (main thread only)."""
    _quiet_math_verify()
    if prediction is None or not str(prediction).strip():
        return Grade(False, False, "no_answer")
    bounded = bool(timeout_s) and threading.current_thread() is threading.main_thread()
    old = None
    if bounded:

        def _alarm(signum, frame):
            raise GradingTimeout()

        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, float(timeout_s))
    try:
        correct, valid = _verify(str(gold), str(prediction))
    except GradingTimeout:
        return Grade(False, False, "timeout", f"over {timeout_s:g} s")
    except Exception as exc:  # noqa: BLE001 - a grader failure is a wrong sample, reported
        return Grade(False, False, "error", f"{type(exc).__name__}: {str(exc)[:200]}")
    finally:
        if bounded:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    return Grade(correct, valid, "ok" if valid else "unparsable")


def grade_completion(gold: str, completion: str, timeout_s: float | None = 5.0) -> Grade:
    """Grade a model's completion: its last ``\\boxed{}`` against the gold."""
    return grade_answer(gold, extract_boxed(completion), timeout_s)


def is_equivalent(gold: str, prediction: str, timeout_s: float | None = 5.0) -> bool:
    """math-verify equivalence, gold first. Bounded by ``timeout_s`` in a main thread; False on timeout."""
    if prediction is None:
        return False
    return grade_answer(gold, prediction, timeout_s).correct
