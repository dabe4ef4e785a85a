"""Grading in a pool of worker processes, each bounding every pair in its main thread (SIGALRM).

A watchdog in the parent kills a worker that reports nothing for ``timeout_s + grace_s`` (a hang that
the alarm could not break) or that dies (a crash); the pair it was on is graded wrong with status
``timeout`` / ``crash`` and the rest of its chunk goes back to the queue. Grading never hangs.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import resource
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from evaluators.grading import Grade

Pair = tuple[str, str]  # (gold answer, completion)


def _resolve(grader: str):
    mod, _, fn = grader.partition(":")
    return getattr(importlib.import_module(mod), fn)


def _worker(conn, timeout_s: float, memory_mb: int | None, grader: str) -> None:
    if memory_mb:
        try:
            resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        except (ValueError, OSError):
            pass
    fn = _resolve(grader)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        for idx, gold, text in msg:
            g = fn(gold, text, timeout_s)
            conn.send((idx, g.correct, g.valid, g.status, g.detail))


@dataclass
class _Slot:
    proc: mp.Process
    conn: object
    chunk: list = field(default_factory=list)
    done: int = 0
    last: float = 0.0


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover
        return max(1, os.cpu_count() or 1)


class GraderPool:
    """``with GraderPool(workers=2) as pool: grades = pool.grade(pairs)``.

    ``pairs``: (gold, completion) — the last ``\\boxed{}`` of the completion is graded — or, with
    ``extract=False``, (gold, answer). Returns one :class:`Grade` per pair, in order. ``grader``
    ("module:function", ``fn(gold, text, timeout_s) -> Grade``) replaces the math-verify grader.
    """

    def __init__(
        self,
        workers: int | None = None,
        timeout_s: float = 5.0,
        grace_s: float = 5.0,
        chunk: int = 16,
        memory_mb: int | None = 4096,
        extract: bool = True,
        grader: str | None = None,
    ):
        self.workers = max(1, int(workers or default_workers()))
        self.timeout_s, self.grace_s, self.chunk = (
            float(timeout_s),
            float(grace_s),
            max(1, int(chunk)),
        )
        self.memory_mb = memory_mb
        self.grader = grader or (
            "evaluators.grading:grade_completion" if extract else "evaluators.grading:grade_answer"
        )
        ctx_name = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        self._ctx = mp.get_context(ctx_name)
        if ctx_name == "forkserver":
            self._ctx.set_forkserver_preload(["evaluators.grading", "math_verify"])
        self._slots: list[_Slot] = []
        self.restarts = 0

    def _start(self) -> _Slot:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_worker, args=(child, self.timeout_s, self.memory_mb, self.grader), daemon=True
        )
        proc.start()
        child.close()
        return _Slot(proc, parent)

    def start(self) -> GraderPool:
        while len(self._slots) < self.workers:
            self._slots.append(self._start())
        return self

    def _replace(self, slot: _Slot) -> _Slot:
        self._kill(slot)
        self.restarts += 1
        return self._start()

    @staticmethod
    def _kill(slot: _Slot) -> None:
        if slot.proc.is_alive():
            slot.proc.kill()
        slot.proc.join(timeout=5)
        try:
            slot.conn.close()
        except OSError:
            pass

    def grade(
        self, pairs: Sequence[Pair], progress: Callable[[int], None] | None = None
    ) -> list[Grade]:
        self.start()
        out: list[Grade | None] = [None] * len(pairs)
        queue = deque([(i, str(g), t) for i, (g, t) in enumerate(pairs)])
        remaining = len(pairs)
        hard = self.timeout_s + self.grace_s
        while remaining:
            for k, slot in enumerate(self._slots):  # keep up to two chunks in flight per worker
                if queue and len(slot.chunk) - slot.done <= self.chunk // 2:
                    if slot.done >= len(slot.chunk):  # idle: start its clock afresh
                        slot.chunk, slot.done, slot.last = [], 0, time.monotonic()
                    work = [queue.popleft() for _ in range(min(self.chunk, len(queue)))]
                    slot.chunk += work
                    try:
                        slot.conn.send(work)
                    except (OSError, BrokenPipeError):
                        queue.extendleft(reversed(slot.chunk[slot.done :]))
                        slot.chunk, slot.done = [], 0
                        self._slots[k] = self._replace(slot)
            busy = {s.conn: s for s in self._slots if s.done < len(s.chunk)}
            ready = wait(list(busy) + [s.proc.sentinel for s in busy.values()], timeout=0.5)
            now = time.monotonic()
            for k, slot in enumerate(self._slots):
                if slot.done >= len(slot.chunk):
                    continue
                failed = None
                if slot.conn in ready:
                    try:
                        while slot.conn.poll():
                            idx, correct, valid, status, detail = slot.conn.recv()
                            out[idx] = Grade(bool(correct), bool(valid), status, detail)
                            slot.done += 1
                            slot.last = time.monotonic()
                            remaining -= 1
                            if progress:
                                progress(1)
                    except (EOFError, OSError):
                        failed = ("crash", f"worker died (exit code {slot.proc.exitcode})")
                if failed is None and slot.done < len(slot.chunk):
                    if not slot.proc.is_alive():
                        failed = ("crash", f"worker died (exit code {slot.proc.exitcode})")
                    elif now - slot.last > hard:
                        failed = ("timeout", f"worker killed after {hard:g} s on one pair")
                if failed and slot.done < len(slot.chunk):
                    idx = slot.chunk[slot.done][0]
                    out[idx] = Grade(False, False, failed[0], failed[1])
                    remaining -= 1
                    if progress:
                        progress(1)
                    queue.extendleft(reversed(slot.chunk[slot.done + 1 :]))
                    slot.chunk, slot.done = [], 0
                    self._slots[k] = self._replace(slot)
        return out  # type: ignore[return-value]

    def pids(self) -> list[int]:
        """Process ids of the live workers (e.g. to read their CPU time)."""
        return [s.proc.pid for s in self._slots if s.proc.pid is not None]

    def close(self) -> None:
        for slot in self._slots:
            try:
                slot.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for slot in self._slots:
            slot.proc.join(timeout=2)
            self._kill(slot)
        self._slots = []

    def __enter__(self) -> GraderPool:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def grade_pairs(
    pairs: Sequence[Pair],
    workers: int | None = None,
    timeout_s: float = 5.0,
    extract: bool = True,
    progress: Callable[[int], None] | None = None,
) -> list[Grade]:
    """One-shot :class:`GraderPool` grading (see there)."""
    with GraderPool(workers=workers, timeout_s=timeout_s, extract=extract) as pool:
        return pool.grade(pairs, progress=progress)
