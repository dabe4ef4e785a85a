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
import tempfile
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
    with tempfile.TemporaryDirectory(prefix=prefix, dir=dir) as tmp:
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
