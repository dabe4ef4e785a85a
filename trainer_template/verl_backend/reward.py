"""verl reward function: ``reward.custom_reward_function.path=<this file>``, ``name=compute_score``.

score 1.0 when the last ``\\boxed{}`` of the response is math-verify-equivalent to the gold answer, else
0.0; ``format_valid`` says a boxed answer was found, ``acc`` that it was correct. verl stores the two
extras per sample (``reward_extra_info``); the poise trainer routes them to the estimator as
``valid`` / ``correct``.
"""

from __future__ import annotations

import threading
from typing import Any

from evaluators.grading import extract_boxed, is_equivalent
from evaluators.pool import GraderPool

GRADE_TIMEOUT_S = 5.0
"""the bound on grading one response (math-verify can take for ever, e.g. on ``9^{9^{9^{9}}}``)"""
_pool: GraderPool | None = None
_pool_lock = threading.Lock()


def _equivalent(gold: str, pred: str) -> bool:
    if threading.current_thread() is threading.main_thread():
        return is_equivalent(gold, pred, timeout_s=GRADE_TIMEOUT_S)
    # the bound is an alarm (SIGALRM), which only a main thread can take; verl's reward workers may
    # call from another thread, so there one grader process (its own main thread, killed when it
    # overruns) grades, one response at a time: a response that would grade for ever scores 0
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = GraderPool(workers=1, timeout_s=GRADE_TIMEOUT_S, grace_s=2.0, extract=False)
        return _pool.grade([(gold, pred)])[0].correct


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any
) -> dict:
    """{"score": 0/1, "acc": 0/1, "format_valid": 0/1} for one response (verl's signature)."""
    pred = extract_boxed(solution_str or "")
    valid = pred is not None and pred != ""
    correct = bool(valid and ground_truth is not None and _equivalent(str(ground_truth), pred))
    return {
        "score": 1.0 if correct else 0.0,
        "acc": 1.0 if correct else 0.0,
        "format_valid": 1.0 if valid else 0.0,
    }


def answer_recall(ground_truth: str, response: str) -> float:
    """Share of the distinct non-space characters of the gold answer that occur in the response."""
    gold = {c for c in str(ground_truth or "") if not c.isspace()}
    if not gold:
        return 0.0
    seen = set(response or "")
    return len(gold & seen) / len(gold)


def compute_smoke_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any
) -> dict:
    """The CPU smoke's reward: :func:`compute_score`, plus partial credit ``0.5 * answer_recall`` for
    a wrong response, so a randomly initialised policy still sees rewards that vary within a group
    (a constant reward gives zero advantages everywhere and would hide a broken mechanism). ``acc``
    and ``format_valid`` are :func:`compute_score`'s. Never used by the GPU protocol."""
    out = compute_score(data_source, solution_str, ground_truth, extra_info)
    if not out["acc"]:
        out["score"] = 0.5 * answer_recall(ground_truth, solution_str)
    return out
