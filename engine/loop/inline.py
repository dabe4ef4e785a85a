"""Evaluations in threads of the loop's own process: the executor of in-process tests and debugging.

The evaluation itself is the real one (``evaluate_node``: the proxy's seeds still run as limited,
sandboxed processes and record their result), but there is no worker process around it: no
whole-tree wall-clock limit beyond the seeds' own and nothing to kill on shutdown (a running
evaluation is waited for). At scale the loop uses ``engine.loop.executor``'s worker processes.
"""

from __future__ import annotations

import concurrent.futures as cf
import time

from engine.errors import PoiseError
from engine.loop.executor import (
    SETUP_FAILED,
    EvalJob,
    EvalOutcome,
    evaluate_job_node,
    record_failure,
)
from engine.loop.waiting import WaitNote
from engine.operators.evaluate import WarmStartFailed


class InlineExecutor:
    """At most ``workers`` evaluations at once, each ``evaluate_node`` in a thread of this process."""

    kind = "inline"

    def __init__(self, workers: int = 1):
        self.workers = max(1, int(workers))
        self._pool = cf.ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix="poise-inline"
        )

    def submit(self, job: EvalJob) -> cf.Future:
        return self._pool.submit(evaluate_job, job)

    def shutdown(self, kill: bool = False) -> None:
        self._pool.shutdown(wait=True, cancel_futures=kill)


def evaluate_job(job: EvalJob) -> EvalOutcome:
    """Run ``job`` here; an engine error (a bad preset) fails the node with it, a failed warm start
    (the trusted set-up, not the candidate) is a :data:`SETUP_FAILED` outcome that records nothing."""
    start = time.monotonic()
    note = WaitNote()  # a `poise-git evaluate` of this node in flight: waited for, as a worker does
    try:
        result = evaluate_job_node(job, wait_for_other=True, on_wait=note)
    except WarmStartFailed as exc:
        return EvalOutcome(job.node, SETUP_FAILED, str(exc), None, time.monotonic() - start)
    except PoiseError as exc:
        return record_failure(job, f"evaluation error: {exc}", time.monotonic() - start)
    return EvalOutcome(
        job.node,
        result.status,
        result.reason,
        result.value,
        time.monotonic() - start,
        other=note.other,
        waited_s=note.waited_s,
    )
