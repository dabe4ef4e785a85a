"""The first code that runs in a sandboxed child, before any candidate code:

    python -s -B -m engine.sandbox.launch SPEC_JSON

It dies with its parent (PR_SET_PDEATHSIG), drops to the unprivileged uid the parent chose when it
starts as root, applies the kernel limits (rlimits: CPU time, address space, file size, processes,
open files, no core dumps), closes every inherited descriptor but the channel, then runs the target
module as ``__main__``. Only the standard library is imported here.
"""

from __future__ import annotations

import ctypes
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


def main() -> None:
    spec = json.loads(sys.argv[1])
    _die_with_parent(spec.get("parent"))
    if spec.get("uid") is not None:
        _drop(int(spec["uid"]))
    _limit(spec.get("rlimits", {}))
    os.umask(0o077)
    channel = os.environ.get("POISE_CHANNEL_FD", "")
    _close_fds({int(channel)} if channel.isdigit() else set())
    sys.argv = [spec["module"], *spec.get("args", [])]
    runpy.run_module(spec["module"], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
