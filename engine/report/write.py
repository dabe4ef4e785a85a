"""The report's page written whole or not at all: a command killed while it writes (Ctrl-C, SIGTERM,
``kill -9``), or a write that fails part way (a full disk), leaves the earlier page as it was, never
a half-written one served as the report."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path

from engine.errors import PoiseError

STALE_S = 600.0
"""how old a temporary page beside the report must be to be taken for one a killed writer left"""


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, renamed over it once complete
    (and on disk). A failed write removes its temporary file and raises :class:`PoiseError`; those
    that killed writers left (older than :data:`STALE_S`) are removed here."""
    _remove_stale(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # as a plain write would make it (mkstemp's is 0600)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise PoiseError(
                f"could not write {path}: {exc.strerror or exc}; the earlier report is kept"
            ) from exc
        raise


def _remove_stale(path: Path) -> None:
    for p in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            if time.time() - p.stat().st_mtime > STALE_S:
                p.unlink()
