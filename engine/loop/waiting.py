"""A loop worker that finds its node being evaluated by another process (a hand ``poise-git
evaluate``) waits for it (``engine.operators.evaluate.evaluate_node``'s ``wait_for_other``). The
wait is not the worker's own work: it does not count against the worker's wall-clock limit, and
the run's log says when the result the worker returns is the one the other process recorded.

The worker tells the process that limits it through a pipe of its own (:class:`WaitNote` writes,
:class:`WaitClock` reads): one byte when it starts waiting, one when the wait is over. The clock
stops only once, before the worker's own evaluation begins: nothing that runs later in the worker
(candidate code runs in its sandboxed children, which never get the pipe) can stop it again.
"""

from __future__ import annotations

import os
import time

USED = "used"
"""``other`` of an outcome whose result another process recorded, at this evaluation's seeds"""


class WaitNote:
    """The worker's side: ``evaluate_node``'s ``on_wait`` callback. ``other`` is "" (no wait),
    :data:`USED`, or why the other's result was not this evaluation's (the worker then evaluated
    the node itself); ``waited_s`` the time waited. ``fd``: the pipe to the limiting process."""

    def __init__(self, fd: int | None = None) -> None:
        self.fd = fd
        self.other = ""
        self.waited_s = 0.0
        self._since: float | None = None

    def __call__(self, what: str, detail: str) -> None:
        if what == "waiting":
            self._since = time.monotonic()
            self._say(b"w")
            return
        if self._since is not None:
            self.waited_s = time.monotonic() - self._since
        self.other = USED if what == USED else detail
        self.close()

    def _say(self, byte: bytes) -> None:
        if self.fd is not None:
            try:
                os.write(self.fd, byte)
            except OSError:
                pass

    def close(self) -> None:
        """The wait is over (or never came): the limiting process's clock runs from here on."""
        if self.fd is not None:
            self._say(b"r")
            os.close(self.fd)
            self.fd = None

    def fields(self) -> dict:
        return {"other": self.other, "waited_s": round(self.waited_s, 3)}


class WaitClock:
    """The limiting process's side: the worker's wall time since :meth:`__init__`, less the time it
    waited for another process, read from the pipe ``fd`` (non-blocking; closed at the end)."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd: int | None = fd
        self.start = time.monotonic()
        self._paused_at: float | None = None
        self.waited_s = 0.0

    @property
    def settled(self) -> bool:
        """The clock can stop no more: it runs from here on (or never stopped)."""
        return self.fd is None

    @property
    def waiting(self) -> bool:
        """The worker is waiting for another process now (its clock stopped)."""
        return self._paused_at is not None

    def poll(self) -> None:
        if self.fd is None:
            return
        try:
            data = os.read(self.fd, 16)
        except BlockingIOError:
            return
        now = time.monotonic()
        for byte in data[:1]:  # the first byte only: "w" stops the clock, anything else ends it
            if byte == ord("w"):
                self._paused_at = now
        if data == b"" or data[1:] or data[:1] != b"w":  # closed, or the wait is over
            self._resume(now)

    def _resume(self, now: float) -> None:
        if self._paused_at is not None:
            self.waited_s += now - self._paused_at
            self._paused_at = None
        self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def counted(self) -> float:
        """Seconds that count against the worker's limit."""
        now = time.monotonic()
        paused = self.waited_s + (now - self._paused_at if self._paused_at is not None else 0.0)
        return now - self.start - paused


def waited_phrase(other: str, waited_s: float) -> str:
    """What the run's log says of an evaluation that waited for another process's ("" when none)."""
    if not other:
        return ""
    if other == USED:
        return f"recorded by another process, which this run waited {waited_s:.0f} s for"
    return (
        f"waited {waited_s:.0f} s for another process's evaluation and evaluated it again: {other}"
    )
