"""Process locks on files in an archive's git directory (``flock``): the kernel releases one when its
process ends, however it ends, so a killed holder never leaves a lock behind. The file holds who took
it (``pid N, since …``) for the message of whoever finds it taken."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def git_dir(archive) -> str:
    """The archive's common git directory: where its refs live, shared by every linked worktree of
    it (so that a lock taken in one worktree holds in all)."""
    path = archive.git.text("rev-parse", "--path-format=absolute", "--git-common-dir").strip()
    return os.path.realpath(path)


@contextmanager
def held(
    path: str,
    busy: Callable[[str], Exception],
    *,
    wait: bool = False,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[bool]:
    """Hold the lock of ``path`` (created if missing) for the ``with`` block; yields whether another
    process held it first (``wait``: this one waited for it, ``on_wait(holder)`` called before it
    does). Without ``wait``, a held lock raises ``busy(holder)`` at once, ``holder`` saying which
    process holds it (``pid N, since …``)."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        waited = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            if not wait:
                raise busy(holder) from None
            if on_wait is not None:
                on_wait(holder)
            fcntl.flock(fd, fcntl.LOCK_EX)
            waited = True
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
        yield waited
    finally:
        os.close(fd)  # releases the lock
