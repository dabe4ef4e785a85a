"""The lineage index: what each node commit parses to, kept beside the refs it summarizes.

A lineage read lists the refs under ``refs/heads/poise/`` (names and object ids only, which git reads
from ``packed-refs`` without opening an object) and needs, for each tip commit, its parsed trailers
and its parsed result files. A commit id fixes the commit's message and tree, hence everything parsed
from them: an entry keyed by commit id can never be wrong, only missing. So the index holds entries
by commit id, and a read looks each tip up and parses from git only the tips it lacks (then adds
them). Nothing here trusts the ref list it was built from: a branch deleted, moved, renamed or pushed
behind the engine's back only changes which entries a read looks up.

Where: ``<git common dir>/poise/index.sqlite`` (with its ``-wal``/``-shm``), inside the repository's
git directory, which a ``git push`` or ``git fetch`` into the archive cannot write (they write refs
and objects), so archive content cannot inject entries.

Layout (SQLite, WAL, so concurrent writers serialize on SQLite's lock and readers never see half a
write): ``meta`` (the format's fingerprint and a generation counter), ``snapshot`` (one row: every
entry of the last compaction, pickled together, which loads ~10x faster than row by row), ``entry``
(entries added since, one row each), ``tail`` (the result fields a snapshot leaves out, by commit id
and path: read when first needed) and ``mech`` (commit id -> mechanism hash, node name, created
time, indexed by hash: the duplicate-mechanism check looks a hash up without reading the lineage).
The fingerprint covers the parsers' source files and the Python version: an index written by other
parsing code is dropped and rebuilt, as is one SQLite cannot read (torn, truncated, not a database).
Pickles are read with an unpickler that builds only the result types, never calls anything else.
"""

from __future__ import annotations

import copyreg
import gc
import hashlib
import io
import logging
import os
import pickle
import re
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.archive.results import (
    TAIL_FIELDS,
    EvaluationResult,
    _PlainUnpickler,
    from_packed,
    packed_head,
    packed_state,
    packed_tail,
    parse_result,
)
from engine.errors import ArchiveError

log = logging.getLogger(__name__)

FORMAT = "poise-lineage-index/3"
INDEX_DIR = "poise"
INDEX_FILE = "index.sqlite"
_PARSERS = ("store.py", "results.py", "mechanism.py", "index.py")
"""the modules whose code decides what an entry holds: any change to them rebuilds the index"""
_ALLOWED = {
    ("engine.archive.results", "from_packed"),
    ("engine.archive.results", "EvaluationResult"),
    ("engine.archive.results", "Protocol"),
}
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS snapshot(id INTEGER PRIMARY KEY CHECK (id = 1), data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS entry(oid TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS tail(oid TEXT NOT NULL, path TEXT NOT NULL, data BLOB NOT NULL,
                                PRIMARY KEY (oid, path));
CREATE TABLE IF NOT EXISTS mech(oid TEXT PRIMARY KEY, hash TEXT, name TEXT NOT NULL,
                                created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS mech_by_hash ON mech(hash);
"""
_COMPACT_MIN = 2000
"""entries added since the snapshot before a read folds them into it (or a tenth of the snapshot)"""

ENTRY_LEN = 10
"""an entry: (owner, problem, status, created, parents, trailers, subject, result files, results by
protocol id, unreadable files by path)"""
_FREEZE_MIN = 20_000
"""snapshots this large are moved out of the cycle collector's generations once loaded"""

_FINGERPRINT: str | None = None


def fingerprint() -> str:
    """The format, the Python version (pickles) and the parsers' source, hashed."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        h = hashlib.sha256(f"{FORMAT}\n{sys.version_info[:2]}\n".encode())
        here = Path(__file__).resolve().parent
        for name in _PARSERS:
            h.update((here / name).read_bytes())
        _FINGERPRINT = h.hexdigest()
    return _FINGERPRINT


class _Unpickler(pickle.Unpickler):
    """Builds plain values and the result types alone: a tampered file fails to load, never runs.
    The one persistent id, ``tails``, is the index's :class:`_Tails` (what a snapshot's results read
    their :data:`~engine.archive.results.TAIL_FIELDS` fields through)."""

    def __init__(self, file: io.BytesIO, tails: _Tails | None = None):
        super().__init__(file)
        self.tails = tails

    def persistent_load(self, pid: Any) -> Any:
        if pid == "tails" and self.tails is not None:
            return self.tails
        raise pickle.UnpicklingError(f"{pid!r} is not an index reference")

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not an index type")
        return super().find_class(module, name)


def _loads(data: bytes, tails: _Tails | None = None) -> Any:
    with no_gc():
        return _Unpickler(io.BytesIO(data), tails).load()


@contextmanager
def no_gc() -> Iterator[None]:
    """The cycle collector paused: building 100k entries' objects (none of them in a cycle) otherwise
    triggers full collections that walk every object the process holds, several times over."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Pickler(pickle.Pickler):
    """Writes each result in its packed form (:func:`packed_state`: its protocol and status, the
    rest in one string), one object for equal protocols, so that a snapshot of 100k results loads
    without building what a lineage read does not look at."""

    def __init__(self, file: io.BytesIO):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.shared: dict[Any, Any] = {}

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is not EvaluationResult:
            return NotImplemented
        state, packed = packed_state(obj)
        p = state["protocol"]
        key = ("p", p.id, p.hash, p.backend, p.preset, repr(p.settings))
        state["protocol"] = self.shared.setdefault(key, p)
        return from_packed, (state, packed)


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf).dump(obj)
    return buf.getvalue()


class _SnapshotPickler(_Pickler):
    """Writes a snapshot: each result as its protocol, status and
    :data:`~engine.archive.results.HEAD_FIELDS` (what a lineage read and a selection read of every node;
    names, units and seeds one object per distinct value), its other fields left to its row in the
    ``tail`` table, read through the index's :class:`_Tails` (persistent id ``tails``) when first
    needed. ``where``: each result's (commit id, file path), by object id."""

    def __init__(self, file: io.BytesIO, tails: _Tails, where: dict[int, tuple[str, str]]):
        super().__init__(file)
        self.tails, self.where = tails, where
        self.source = (tails,)

    def persistent_id(self, obj: Any) -> Any:
        return "tails" if obj is self.tails else None

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is not EvaluationResult:
            return NotImplemented
        at = self.where.get(id(obj))
        if at is None:
            return super().reducer_override(obj)
        p = obj.__dict__["protocol"]
        key = ("p", p.id, p.hash, p.backend, p.preset, repr(p.settings))
        state = {"protocol": self.shared.setdefault(key, p), "status": obj.__dict__["status"]}
        head = packed_head(obj)
        if type(head) is tuple:
            keys, values, units, utility, seeds = head
            share = self.shared.setdefault
            head = (
                share(("k", keys), keys),
                values,
                share(("u", units), units),
                share(("s", utility), utility),
                share(("e", seeds), seeds),
            )
        state["_head"] = head
        state["_tail"] = (self.source, at[0], self.shared.setdefault(("f", at[1]), at[1]))
        # built as a plain object is (NEWOBJ, then its __dict__ set in C): no call per result
        return copyreg.__newobj__, (EvaluationResult,), state


class _Tails:
    """What a snapshot's results read their :data:`~engine.archive.results.TAIL_FIELDS` fields through: the
    row the snapshot's compaction wrote for (commit id, path), else (the row gone: a later
    compaction dropped the commit, or the file was rebuilt) the result file, parsed from git."""

    def __init__(self, index: LineageIndex):
        self.index = index

    def tail(self, oid: str, path: str) -> dict[str, Any]:
        row = self.index._run(
            "reading",
            lambda db: db.execute(
                "SELECT data FROM tail WHERE oid = ? AND path = ?", (oid, path)
            ).fetchone(),
            None,
        )
        if row is not None:
            try:
                values = _PlainUnpickler(io.BytesIO(row[0])).load()
            except Exception:  # a damaged row: the file in git says the same
                values = None
            if type(values) is dict and set(values) == set(TAIL_FIELDS):
                return values
        common = str(self.index.dir.parent)
        done = subprocess.run(
            ["git", f"--git-dir={common}", "cat-file", "blob", f"{oid}:{path}"],
            capture_output=True,
            check=False,
        )
        if done.returncode:
            raise ArchiveError(
                f"the result file {path} of commit {oid} cannot be read: "
                f"{done.stderr.decode('utf-8', 'replace').strip()[:200]}"
            )
        result = parse_result(done.stdout, f"{oid[:12]}:{path}")
        return {k: getattr(result, k) for k in TAIL_FIELDS}


class LineageIndex:
    """The index of one repository (its common git directory), shared by the handles of a process.

    ``get`` and ``add`` are the whole interface of the lineage read; every failure of the file
    (unreadable, locked too long, from other code) is logged and treated as an empty index, so the
    read falls back to git and stays right."""

    def __init__(self, common_dir: str):
        self.dir = Path(common_dir) / INDEX_DIR
        self.path = self.dir / INDEX_FILE
        self.memo: dict[str, Any] = {}
        """entries known to this process (immutable: keyed by commit id)"""
        self.generation: str | None = None
        """the snapshot generation loaded into ``memo`` (None: none loaded)"""
        self.lineage: Any = None
        """the depths of the last lineage read in this process, or of the snapshot's (the lineage
        read's to keep: :func:`engine.archive.store._depths`), where it had no cycle"""
        self.lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._said = False
        self.tails = _Tails(self)

    # -- the database ----------------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        if self._db is not None and self._pid == os.getpid():
            return self._db
        self._pid = os.getpid()  # a forked child opens its own connection
        self.dir.mkdir(exist_ok=True)
        db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            row = db.execute("SELECT value FROM meta WHERE key = 'fingerprint'").fetchone()
            if row is None or row[0] != fingerprint():
                with _txn(db):
                    for table in ("snapshot", "entry", "tail", "mech", "meta"):
                        db.execute(f"DELETE FROM {table}")
                    db.execute("INSERT INTO meta VALUES ('fingerprint', ?)", (fingerprint(),))
                    db.execute("INSERT INTO meta VALUES ('generation', '0')")
        except BaseException:
            db.close()
            raise
        self._db = db
        return db

    def _run(self, what: str, fn, default):
        """``fn(connection)``; on a broken index file: remove it, retry once on a new one; on any
        other failure (a lock held past the timeout, a read-only directory): ``default``."""
        for attempt in (0, 1):
            try:
                with self.lock:
                    return fn(self._conn())
            except OSError as exc:
                self._failed(what, exc)
                return default
            except Exception as exc:  # the index is never needed: whatever fails, git is read
                if attempt or not _broken(exc):
                    self._failed(what, exc)
                    return default
                log.warning("lineage index %s is unreadable (%s); rebuilding it", self.path, exc)
                self._reset()
        return default

    def _failed(self, what: str, exc: BaseException) -> None:
        """Say that the index could not be used, once per process at warning level (a read-only
        archive would otherwise say it on every read)."""
        level = logging.DEBUG if self._said else logging.WARNING
        self._said = True
        log.log(level, "lineage index %s: %s failed (%s); reading git", self.path, what, exc)

    def _reset(self) -> None:
        """Remove a broken index file (its WAL too); the next use creates a new one."""
        with self.lock:
            if self._db is not None:
                try:
                    self._db.close()
                except sqlite3.Error:
                    pass
            self._db = None
            self.memo.clear()
            self.generation = None
            self.lineage = None
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.unlink(f"{self.path}{suffix}")
                except FileNotFoundError:
                    pass

    # -- entries ---------------------------------------------------------------------------------
    def get(self, oids: Iterable[str]) -> dict[str, Any]:
        """The entries of ``oids`` the index holds (missing ones are left out)."""
        oids = list(oids)
        found = {o: self.memo[o] for o in oids if o in self.memo}
        missing = [o for o in oids if o not in found]
        if not missing:
            return found

        def load(db: sqlite3.Connection) -> dict[str, Any]:
            out: dict[str, Any] = {}
            gen = _meta(db, "generation")
            if gen != self.generation and (self.generation is None or len(missing) > 1000):
                # a snapshot this process has not loaded: worth loading when much is missing
                row = db.execute("SELECT data FROM snapshot WHERE id = 1").fetchone()
                if row is not None:
                    with no_gc():
                        snap, lineage = _snapshot(_loads(row[0], self.tails))
                        if len(snap) >= _FREEZE_MIN:
                            # kept for the process's life, and acyclic: out of the cycle
                            # collector's way, whose next collections would otherwise walk its
                            # millions of objects (reference counting still frees them)
                            gc.freeze()
                    self.memo.update(snap)
                    if self.lineage is None:
                        self.lineage = lineage
                self.generation = gen
                out.update((o, self.memo[o]) for o in missing if o in self.memo)
            rest = [o for o in missing if o not in out]
            for i in range(0, len(rest), 500):
                chunk = rest[i : i + 500]
                marks = ",".join("?" * len(chunk))
                for oid, data in db.execute(
                    f"SELECT oid, data FROM entry WHERE oid IN ({marks})", chunk
                ):
                    e = _loads(data)
                    if not _is_entry(e):
                        raise pickle.UnpicklingError(f"the entry of {oid} is malformed")
                    out[oid] = self.memo[oid] = e
            return out

        found.update(self._run("reading", load, {}))
        return found

    def add(
        self,
        entries: Mapping[str, Any],
        mechanisms: Iterable[tuple[str, str | None, str, float]] = (),
        *,
        tips: Iterable[str] | None = None,
        lineage: Any = None,
    ) -> None:
        """Record ``entries`` (commit id -> entry) and their ``mechanisms`` rows (commit id, hash or
        None where unknown, node name, created) in one transaction. ``tips``: the commit ids the
        lineage points to now (a full read's), which lets this call fold the added entries into a new
        snapshot of those tips when enough have accumulated (entries of older commits are dropped);
        ``lineage``: that read's depths, kept with the snapshot for the next process's first read."""
        entries = dict(entries)
        mechanisms = list(mechanisms)
        with self.lock:
            self.memo.update(entries)
        if not entries and not mechanisms:
            return
        keep = set(tips) if tips is not None else None

        def write(db: sqlite3.Connection) -> None:
            with _txn(db):
                db.executemany("INSERT OR REPLACE INTO mech VALUES (?, ?, ?, ?)", mechanisms)
                if keep is not None:
                    pending = db.execute("SELECT count(*) FROM entry").fetchone()[0] + len(entries)
                    first = db.execute("SELECT 1 FROM snapshot WHERE id = 1").fetchone() is None
                    if first or pending >= max(_COMPACT_MIN, len(self.memo) // 10):
                        self._compact(
                            db, keep, lineage
                        )  # the entries are in memo: they go in with it
                        return
                db.executemany(
                    "INSERT OR REPLACE INTO entry VALUES (?, ?)",
                    [(oid, _dumps(e)) for oid, e in entries.items()],
                )

        self._run("writing", write, None)

    def _compact(self, db: sqlite3.Connection, keep: set[str], lineage: Any = None) -> None:
        """Inside a write transaction: one snapshot of the entries of ``keep`` this process holds
        plus every entry another process added (it may be a tip this read has not seen), the added
        rows emptied, the generation moved on (other processes then reload the snapshot only when
        they miss much)."""
        snap = {o: self.memo[o] for o in keep if o in self.memo}
        for oid, data in db.execute("SELECT oid, data FROM entry"):
            if oid not in snap:
                e = _loads(data)
                if not _is_entry(e):
                    raise pickle.UnpicklingError(f"the entry of {oid} is malformed")
                snap[oid] = self.memo[oid] = e
        gen = str(int(_meta(db, "generation") or "0") + 1)
        db.execute("CREATE TEMP TABLE IF NOT EXISTS keep(oid TEXT PRIMARY KEY)")
        db.execute("DELETE FROM keep")
        db.executemany("INSERT OR IGNORE INTO keep VALUES (?)", ((o,) for o in snap))
        db.execute("DELETE FROM mech WHERE oid NOT IN (SELECT oid FROM keep)")
        db.execute("DELETE FROM tail WHERE oid NOT IN (SELECT oid FROM keep)")
        where: dict[int, tuple[str, str]] = {}
        rows = []
        for oid, e in snap.items():
            for path, result, _why in e[7]:
                if result is None:
                    continue
                where[id(result)] = (oid, path)
                t = result.__dict__.get("_tail")
                if t is None or t[0][0] is not self.tails or t[1] != oid or t[2] != path:
                    rows.append((oid, path, packed_tail(result)))
                # else: its row is there, unless a compaction elsewhere dropped it (then it is
                # read from git)
        db.executemany("INSERT OR REPLACE INTO tail VALUES (?, ?, ?)", rows)
        out = {o: e[:5] + (trailer_text(e[5]),) + e[6:] for o, e in snap.items()}
        buf = io.BytesIO()
        _SnapshotPickler(buf, self.tails, where).dump((out, lineage))
        db.execute("INSERT OR REPLACE INTO snapshot VALUES (1, ?)", (buf.getvalue(),))
        db.execute("DELETE FROM entry")
        db.execute("INSERT OR REPLACE INTO meta VALUES ('generation', ?)", (gen,))
        self.memo = snap
        self.generation = gen

    # -- mechanisms ------------------------------------------------------------------------------
    def built(self) -> bool:
        """Whether a whole lineage read has filled this index (else the mechanism rows are not
        known to cover the archive)."""
        return bool(
            self._run(
                "reading",
                lambda db: db.execute("SELECT 1 FROM snapshot WHERE id = 1").fetchone(),
                None,
            )
        )

    def mechanism_rows(self, digest: str) -> list[tuple[str, str, float]] | None:
        """(commit id, node name, created) of every indexed commit whose mechanism hash is
        ``digest``; None where the index cannot be read."""
        return self._run(
            "reading",
            lambda db: db.execute(
                "SELECT oid, name, created FROM mech WHERE hash = ?", (digest,)
            ).fetchall(),
            None,
        )

    def unhashed_rows(self) -> list[tuple[str, str, float]]:
        """(commit id, node name, created) of indexed commits without a mechanism hash (nodes made
        before the ``Poise-Mechanism`` trailer existed), to hash from their files once."""
        return self._run(
            "reading",
            lambda db: db.execute(
                "SELECT oid, name, created FROM mech WHERE hash IS NULL"
            ).fetchall(),
            [],
        )

    def set_hashes(self, hashes: Mapping[str, str]) -> None:
        """Store mechanism hashes computed from files (commit id -> hash; '' where the file does
        not parse, so that it is not hashed again)."""

        def write(db: sqlite3.Connection) -> None:
            with _txn(db):
                db.executemany(
                    "UPDATE mech SET hash = ? WHERE oid = ?", [(h, o) for o, h in hashes.items()]
                )

        if hashes:
            self._run("writing", write, None)


class _txn:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on an exception)."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind, exc, tb) -> None:
        if kind is None:
            self.db.execute("COMMIT")
        else:
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.Error:
                pass


_TRAILER_RE = re.compile(r"^[ \t]*(Poise-[A-Za-z-]+): (.*)$", re.MULTILINE)


def parse_trailers(message: str) -> dict[str, list[str]]:
    """A commit message's ``Poise-*`` trailers: key -> its values in order."""
    out: dict[str, list[str]] = {}
    for key, value in _TRAILER_RE.findall(message):
        out.setdefault(key, []).append(value.strip())
    return out


def trailer_text(trailers: Any) -> Any:
    """The trailers of an entry as a snapshot keeps them: one line per value, which
    :class:`engine.archive.store.Node` parses back on first access (one string to load, not a dict
    of lists); the dict itself where its text would not parse back to it."""
    if type(trailers) is not dict:
        return trailers
    text = "\n".join(f"{k}: {v}" for k, vs in trailers.items() for v in vs)
    return text if parse_trailers(text) == trailers else trailers


def _is_entry(e: Any) -> bool:
    """The shape of an entry (``Archive``'s: the commit's head, seven values, its result files, and
    its results and unreadable files by name)."""
    return (
        type(e) is tuple
        and len(e) == ENTRY_LEN
        and type(e[7]) is tuple
        and type(e[8]) is dict
        and type(e[9]) is dict
    )


def _snapshot(data: Any) -> tuple[dict[str, Any], Any]:
    """(the entries, the lineage's depths or None) of a loaded snapshot; raises on any other shape
    (a file this code did not write)."""
    if type(data) is not tuple or len(data) != 2 or type(data[0]) is not dict:
        raise pickle.UnpicklingError("the snapshot is not a map of entries")
    snap, lineage = data
    if not all(map(_is_entry, snap.values())):
        raise pickle.UnpicklingError("the snapshot is not a map of entries")
    if lineage is not None and not _is_lineage(lineage):
        raise pickle.UnpicklingError("the snapshot's depths are malformed")
    return snap, lineage


def _is_lineage(x: Any) -> bool:
    """The shape of a lineage's depths: ({name: (parents, depth)}, frozenset of names)."""
    if type(x) is not tuple or len(x) != 2 or type(x[0]) is not dict or type(x[1]) is not frozenset:
        return False
    return all(
        type(v) is tuple and len(v) == 2 and type(v[0]) is tuple and type(v[1]) is int
        for v in x[0].values()
    )


def _meta(db: sqlite3.Connection, key: str) -> str | None:
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else row[0]


def _broken(exc: BaseException) -> bool:
    """Whether ``exc`` says the index file itself is bad (rebuild it), not that it is busy."""
    if isinstance(exc, (sqlite3.ProgrammingError, sqlite3.InterfaceError)):
        return False
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return not any(
            w in text
            for w in ("locked", "busy", "readonly", "unable to open", "disk i/o error", "full")
        )  # the file is fine where the disk, a size limit or another process is in the way
    return True


_INDEXES: dict[str, LineageIndex] = {}
_INDEXES_LOCK = threading.Lock()


def index_for(common_dir: str) -> LineageIndex:
    """The process's one :class:`LineageIndex` of the repository at ``common_dir``."""
    with _INDEXES_LOCK:
        idx = _INDEXES.get(common_dir)
        if idx is None:
            idx = _INDEXES[common_dir] = LineageIndex(common_dir)
        return idx


def forget(common_dir: str | None = None) -> None:
    """Drop what this process holds in memory of the index (all repositories' by default): the next
    read loads it from its file. For benchmarks and tests of a cold process."""
    with _INDEXES_LOCK:
        for key in [k for k in _INDEXES if common_dir is None or k == common_dir]:
            idx = _INDEXES.pop(key)
            with idx.lock:
                if idx._db is not None and idx._pid == os.getpid():
                    idx._db.close()
                idx._db = None
                idx.memo = {}
                idx.generation = None
                idx.lineage = None
