"""Run untrusted work in a child process with limits: wall clock (whole process group), CPU time, memory."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


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
        os.setsid()  # a new process group: the wall-clock limit kills all of it
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
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_limits(cpu_s, memory_mb),
    )
    timed_out = False
    try:
        out, err = proc.communicate(input=input, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc.pid)
        out, err = proc.communicate()
    finally:
        kill_group(proc.pid)  # stragglers the child left behind in its group
    return SandboxResult(proc.returncode, out or "", err or "", time.monotonic() - start, timed_out)


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def child_env(
    extra: Mapping[str, str] | None = None, *, drop_secrets: bool = True
) -> dict[str, str]:
    """The environment for an untrusted child: one torch thread, no API keys, the project importable."""
    repo = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if not (drop_secrets and _secret(k))}
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def _secret(key: str) -> bool:
    k = key.upper()
    return any(s in k for s in ("API_KEY", "TOKEN", "SECRET", "PASSWORD")) or k.startswith("AWS_")
