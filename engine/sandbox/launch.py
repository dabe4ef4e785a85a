"""The first code that runs in a sandboxed child, before any candidate code:

    python -s -B -m engine.sandbox.launch SPEC_JSON

It dies with its parent (PR_SET_PDEATHSIG), drops to the unprivileged uid the parent chose when it
starts as root, applies the kernel limits (rlimits: CPU time, address space, file size, processes,
open files, no core dumps), closes every inherited descriptor but the channel, imports the modules
the parent names in ``preload`` (trusted packages the target imports anyway: torch, pytest) with the
cyclic garbage collector off and then freezes them (``gc.freeze``), then runs the target module as
``__main__``. Only the standard library is imported here, and nothing before the limits apply.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import resource
import runpy
import signal
import sys


def _die_with_parent(parent: int | None) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if parent and os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _drop(uid: int) -> None:
    if os.geteuid() != 0:
        return
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:  # pragma: no cover - the kernel refused
        os._exit(71)


def _limit(rlimits: dict[str, list[int]]) -> None:
    for name, (soft, hard) in rlimits.items():
        res = getattr(resource, name)
        cur_soft, cur_hard = resource.getrlimit(res)
        if cur_hard != resource.RLIM_INFINITY:
            hard = min(hard, cur_hard)
            soft = min(soft, hard)
        resource.setrlimit(res, (soft, hard))


def _close_fds(keep: set[int]) -> None:
    try:
        fds = [int(x) for x in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _preload(modules: list[str]) -> None:
    """Import ``modules`` with the cyclic collector off, then freeze what they made.

    torch's import makes some 270,000 objects that live as long as the process; with the collector on,
    its passes over them while they are made cost about a fifth of the import, and every full
    collection afterwards walks them again (pytest runs five at its exit). Frozen, they are left out
    of every later collection; the target's and the candidate's own objects are collected as before
    (the collector is on again before the target runs)."""
    if not modules:
        return
    gc.disable()
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        gc.freeze()
        gc.enable()


def main() -> None:
    spec = json.loads(sys.argv[1])
    _die_with_parent(spec.get("parent"))
    if spec.get("uid") is not None:
        _drop(int(spec["uid"]))
    _limit(spec.get("rlimits", {}))
    os.umask(0o077)
    channel = os.environ.get("POISE_CHANNEL_FD", "")
    _close_fds({int(channel)} if channel.isdigit() else set())
    _preload(spec.get("preload", []))
    sys.argv = [spec["module"], *spec.get("args", [])]
    runpy.run_module(spec["module"], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
