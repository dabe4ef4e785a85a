"""The engine's temporary directories, named so that ``poise-git gc`` finds those a killed process
left behind, and locked while in use so that it never removes one a running process still needs.

Every such directory is made by :func:`scratch_dir` under ``$TMPDIR`` with one of
:data:`SCRATCH_PREFIXES`; the process holds an ``flock`` on its :data:`IN_USE` file for as long as
it uses it (the kernel releases the lock when the process dies, however it dies), and
:func:`in_use` asks for that lock without waiting.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SANDBOX_PREFIX = "poise-sbx-"
"""a sandboxed child's inputs and scratch (verification, evaluation, fingerprints, probes)"""
BLOBS_PREFIX = "poise-blobs-"
"""the files of a node's commit while git hashes them"""
SUITE_PREFIX = "poise-suite-"
"""a benchmark suite's samples while they are logged to MLflow"""
SCRATCH_PREFIXES = (SANDBOX_PREFIX, BLOBS_PREFIX, SUITE_PREFIX)
IN_USE = ".poise-in-use"
"""the file whose lock marks a directory as in use"""


@contextmanager
def scratch_dir(prefix: str, dir: str | Path | None = None) -> Iterator[str]:
    """A fresh temporary directory ``<prefix>XXXXXXXX`` in ``dir`` (default: ``$TMPDIR``), locked as
    in use until the block ends, then removed."""
    # a removal that fails (a file a dying process still writes) leaves it for `gc`, and never
    # replaces the exception that ends the block
    with tempfile.TemporaryDirectory(prefix=prefix, dir=dir, ignore_cleanup_errors=True) as tmp:
        fd = os.open(os.path.join(tmp, IN_USE), os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield tmp
        finally:
            os.close(fd)  # releases the lock


def in_use(path: str | Path) -> bool:
    """Whether a live process holds ``path``'s lock (a directory without the lock file is not in
    use; one whose lock file cannot be opened is taken to be)."""
    try:
        fd = os.open(os.path.join(path, IN_USE), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:  # held (BlockingIOError), or it cannot be told
        return True
    finally:
        os.close(fd)
    return False


ABANDONED_AGE_S = 5.0
"""how old a directory's lock file must be before :func:`remove_abandoned` takes its process for
dead: a process making one holds no lock on it for a moment after creating the file"""


def remove_abandoned(tmpdir: str | Path | None = None) -> list[str]:
    """Remove the engine's temporary directories in ``tmpdir`` (default: ``$TMPDIR``) that a dead
    process left (a SIGKILL, a power loss): this user's, holding their lock file, unlocked, and
    that file older than :data:`ABANDONED_AGE_S`. A directory a live process holds, or one still
    being made (no lock file yet, or a new one), is kept, whatever its age. Returns those removed."""
    tmp = Path(tmpdir or tempfile.gettempdir())
    uid = os.getuid()
    removed = []
    try:
        entries = sorted(tmp.iterdir())
    except OSError:
        return removed
    for p in entries:
        if not p.name.startswith(SCRATCH_PREFIXES):
            continue
        try:
            st = p.lstat()
            lock = os.stat(p / IN_USE, follow_symlinks=False)
        except OSError:
            continue
        if not p.is_dir() or p.is_symlink() or st.st_uid != uid:
            continue
        if time.time() - lock.st_mtime > ABANDONED_AGE_S and not in_use(p):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(str(p))
    return removed
