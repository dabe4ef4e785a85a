"""Run TRUSTED work (no candidate code: the warm-start builder, a GPU launcher) in a child process with
limits: wall clock (whole process group), CPU time, memory; its output read incrementally and capped.

Candidate code never runs through here: it runs behind the boundary (``engine.sandbox.runner``).
"""

from __future__ import annotations

import os
import resource
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine import secrets
from engine.sandbox import live
from engine.sandbox.env import trusted_env

OUTPUT_CAP = 1024 * 1024
"""bytes of stdout and of stderr kept (the tail); the rest is read and dropped"""


@dataclass
class SandboxResult:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def reason(self) -> str:
        """A one-line human reason for a failure."""
        if self.timed_out:
            return f"exceeded the wall-clock limit ({self.wall_s:.0f} s)"
        if self.returncode < 0:
            sig = (
                signal.Signals(-self.returncode).name
                if -self.returncode in signal.Signals._value2member_map_
                else str(-self.returncode)
            )
            hint = {
                "SIGXCPU": " (CPU-time limit)",
                "SIGKILL": " (killed: memory or CPU limit)",
                "SIGSEGV": "",
            }.get(sig, "")
            return f"killed by {sig}{hint}"
        tail = [ln for ln in self.stderr.strip().splitlines() if ln.strip()]
        if any("MemoryError" in ln for ln in tail[-5:]):
            return "ran out of memory (memory limit)"
        return tail[-1][:300] if tail else f"exited with status {self.returncode}"


def _limits(cpu_s: float | None, memory_mb: int | None):
    def apply() -> None:
        if cpu_s:
            soft = int(cpu_s)
            resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 5))
        if memory_mb:
            b = int(memory_mb) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (b, b))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_limited(
    cmd: Sequence[str],
    *,
    timeout_s: float,
    cpu_s: float | None = None,
    memory_mb: int | None = None,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
) -> SandboxResult:
    """Run ``cmd`` with limits; on timeout the whole process group gets SIGKILL. Never raises on failure."""
    start = time.monotonic()
    if live.stopping():
        return SandboxResult(-signal.SIGKILL, "", "interrupted before it started", 0.0, False)
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=dict(env) if env is not None else trusted_env(),
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_limits(cpu_s, memory_mb) if (cpu_s or memory_mb) else None,
    )
    timed_out = False
    live.add(proc)
    try:
        if input is not None:
            try:
                proc.stdin.write(input.encode("utf-8"))
            except BrokenPipeError:
                pass
            proc.stdin.close()
        out, err, timed_out = _read(proc, start + timeout_s)
        if timed_out:
            kill_group(proc.pid)
        rc = proc.wait()
    finally:
        kill_group(proc.pid)  # stragglers the child left behind in its group
        live.discard(proc)
    return SandboxResult(
        rc,
        secrets.scrub(out.decode("utf-8", "replace")),
        secrets.scrub(err.decode("utf-8", "replace")),
        time.monotonic() - start,
        timed_out,
    )


def _read(proc: subprocess.Popen, deadline: float) -> tuple[bytes, bytes, bool]:
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), True
            for key, _ in sel.select(left):
                try:
                    data = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(key.fd)
                    continue
                buf = bufs[key.fd]
                buf += data
                if len(buf) > OUTPUT_CAP:
                    del buf[: len(buf) - OUTPUT_CAP]
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), True
    finally:
        sel.close()
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), False


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def child_env(
    extra: Mapping[str, str] | None = None, *, drop_secrets: bool = True
) -> dict[str, str]:
    """The environment of a trusted child (``engine.sandbox.env.trusted_env``): no secrets."""
    return trusted_env(extra)
