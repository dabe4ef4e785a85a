"""The weak mode (no bubblewrap: rlimits, an allowlisted environment and a session of its own):
what it still guarantees against a child that detaches a process."""

from __future__ import annotations

import time

import psutil
import pytest

from engine.sandbox.boundary import Boundary
from engine.sandbox.limits import Limits
from engine.sandbox.runner import run_sandboxed

DAEMON = (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        open(sys.argv[2], 'w').write(str(os.getpid()))\n"
    "        time.sleep(120)\n"
    "    os._exit(0)\n"
    "time.sleep(0.5)\n"
)


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(4))
def test_a_detached_daemon_holding_the_pipes_neither_holds_the_engine_nor_survives(
    tmp_path, attempt
):
    """The daemon is dead by the time the run returns, not merely sent SIGKILL: before the kill
    waited for it, it was still running right after the run in about 4 of 10 attempts."""
    pid_file = tmp_path / "daemon.pid"
    t0 = time.monotonic()
    res = run_sandboxed(
        "engine.sandbox.exec_source",
        ["{input}/case.py", str(pid_file)],
        limits=Limits(wall_s=40, memory_mb=1024),
        inputs={"case.py": DAEMON.encode()},
        boundary=Boundary("rlimits", "test"),
    )
    spent = time.monotonic() - t0
    pid = int(pid_file.read_text())
    try:
        assert res.returncode == 0 and not res.killed, res.reason()
        assert spent < 20, f"the engine waited {spent:.0f} s for the daemon's pipes"
        proc = psutil.Process(pid) if psutil.pid_exists(pid) else None
        alive = proc is not None and proc.status() != psutil.STATUS_ZOMBIE
        assert not alive, "the detached daemon outlived its sandbox"
    finally:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
