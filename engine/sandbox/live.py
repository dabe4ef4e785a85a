"""The child processes this process started (sandboxed or trusted), so that an interrupt can kill
them all — they run in sessions of their own and never see the terminal's signal — and so that no
new one starts once the engine is stopping."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import subprocess
import threading
import time

_live: set[subprocess.Popen] = set()
_lock = threading.Lock()
_stopping = threading.Event()


def add(proc: subprocess.Popen) -> None:
    with _lock:
        _live.add(proc)


def discard(proc: subprocess.Popen) -> None:
    with _lock:
        _live.discard(proc)


def stopping() -> bool:
    return _stopping.is_set()


def _descendants(pid: int) -> list:
    """``pid``'s descendants as psutil processes (none when it is gone)."""
    try:
        import psutil  # lazy: psutil is heavy (only this path needs it)

        return psutil.Process(pid).children(recursive=True)
    except Exception:
        return []


def kill_sandbox_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group and every descendant (under bwrap, the whole namespace dies
    with its first process). The descendants are listed before the group is killed: once ``pid``
    is dead they belong to another parent and could no longer be found from it; those still found
    from it afterwards (it outlived the kill) are killed too."""
    kids = _descendants(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    kids += _descendants(pid)
    for child in kids:
        try:
            child.kill()  # psutil checks it is still the same process (no pid reuse)
        except Exception:
            pass
    _await_death(kids)


def kill_pipe_holders(fds: list[int]) -> None:
    """SIGKILL every other process that holds an end of the pipes ``fds`` belong to: a child's
    descendant that detached itself (``setsid``, double fork) and so escaped both its process group
    and its parent's tree, but kept the channel or its output open. Linux only (``/proc``); a
    process that closed both pipes is not found."""
    pipes = set()
    for fd in fds:
        try:
            pipes.add(f"pipe:[{os.fstat(fd).st_ino}]")
        except OSError:
            pass
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return
    me = os.getpid()
    killed = []
    for pid in pids:
        if pid == me or not _holds(pid, pipes):
            continue
        try:
            import psutil  # lazy: psutil is heavy (only this path needs it)

            proc = psutil.Process(pid)
            proc.kill()
            killed.append(proc)
        except Exception:
            pass
    _await_death(killed)


DEATH_WAIT_S = 2.0
"""how long a kill waits for the processes it signalled to end (SIGKILL is delivered, not obeyed at once)"""


def _await_death(procs: list) -> None:
    """Return once every one of ``procs`` (psutil processes sent SIGKILL) has ended, as a zombie
    or gone, or after :data:`DEATH_WAIT_S`: the kernel acts on a SIGKILL asynchronously, and a
    process still running when the kill returns could write to a file or hold the CPU after the
    engine has moved on (a sandbox's run ended, its result recorded)."""
    deadline = time.monotonic() + DEATH_WAIT_S
    while procs and time.monotonic() < deadline:
        procs = [p for p in procs if _still_running(p)]
        if procs:
            time.sleep(0.005)


def _still_running(proc) -> bool:
    import psutil  # lazy: psutil is heavy (only this path needs it)

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # gone, or no longer readable
        return False


def _holds(pid: int, pipes: set[str]) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in pipes:
                return True
        except OSError:
            continue
    return False


def kill_all() -> None:
    """Kill every child started here and refuse new ones (an interrupt is under way)."""
    _stopping.set()
    with _lock:
        procs = list(_live)
    for proc in procs:
        kill_sandbox_tree(proc.pid)


WAIT_STEP_S = 0.25
"""how often a thread waiting on others wakes (see :func:`results`)"""


def results(futures: list) -> list:
    """The futures' results, in order, waited for in short steps. A signal the kernel delivers to
    another thread of the process only sets a flag for the main thread, whose handler (kill every
    child, then unwind) runs when it next executes Python: a main thread blocked for good in one
    wait would never run it, and the children it waits on would never be killed."""
    pending = set(futures)
    while pending:
        _, pending = cf.wait(pending, timeout=WAIT_STEP_S)
    return [f.result() for f in futures]


def join(thread: threading.Thread) -> None:
    """``thread.join()`` in short steps (see :func:`results`)."""
    while thread.is_alive():
        thread.join(WAIT_STEP_S)
