"""Thin git plumbing over subprocess: no working tree, no index, compare-and-swap ref updates.

GitPython is used for repository handling (init, clone in tests); the hot paths here call git plumbing
directly because every extra process start costs 2-4 ms and object-by-object traversal is ~100x slower.
Small requests go to long-lived batch processes of the handle (``cat-file --batch``, ``mktree
--batch``, ``hash-object --stdin-paths``: :class:`_Batch`), so that a spawn starts two processes,
not five; anything they cannot answer is asked again of a process of its own, which fails as usual.
"""

from __future__ import annotations

import os
import subprocess
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from engine import secrets
from engine.scratch import BLOBS_PREFIX, scratch_dir

ZERO_OID = "0" * 40

_IDENTITY = {
    "GIT_AUTHOR_NAME": "poise-git",
    "GIT_AUTHOR_EMAIL": "poise-git@localhost",
    "GIT_COMMITTER_NAME": "poise-git",
    "GIT_COMMITTER_EMAIL": "poise-git@localhost",
}


class GitError(RuntimeError):
    def __init__(self, args: list[str], returncode: int, stderr: str):
        self.args_ = args
        self.returncode = returncode
        self.stderr = stderr.strip()
        super().__init__(
            f"git {' '.join(args[:3])}… failed ({returncode}): {self.stderr.splitlines()[-1] if self.stderr else ''}"
        )


def _env() -> dict[str, str]:
    hidden = secrets.names()
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    for k, v in _IDENTITY.items():
        env.setdefault(k, v)
    env.setdefault("GIT_TERMINAL_PROMPT", "0")
    return env


_ENV = _env()
_BATCH_INPUT = 32 * 1024
"""requests up to this size go to a long-lived process: written whole before its answer is read,
so they must fit in a pipe's buffer (64 KiB on Linux), or both sides would wait on each other"""


class _Gone(Exception):
    """A long-lived process ended or answered out of turn: ask a process of its own."""


class _Batch:
    """One long-lived git process in a batch mode, per :class:`Git` handle and OS process: started
    on first use, restarted after a fork (a child never shares its parent's pipes) and after any
    failure, ended with its handle (its stdin closed: git exits). Thread-safe (one request at a
    time). Its stderr is dropped: a request it fails is asked again of a one-shot process."""

    def __init__(self, path: Path, args: list[str]):
        self.cmd = ["git", "-C", str(path), *args]
        self.proc: subprocess.Popen | None = None
        self.pid = 0
        self.lock = threading.Lock()
        self._finalizer: weakref.finalize | None = None

    def ask(self, data: bytes, answer) -> object:
        """Write ``data``, then ``answer(stdout)``; raises :class:`_Gone` where the process cannot."""
        with self.lock:
            proc = self._proc()
            try:
                proc.stdin.write(data)
                proc.stdin.flush()
                return answer(proc.stdout)
            except (OSError, ValueError, _Gone):
                self._stop()
                raise _Gone from None

    def _proc(self) -> subprocess.Popen:
        if self.proc is not None and self.pid == os.getpid() and self.proc.poll() is None:
            return self.proc
        if self.pid == os.getpid():
            self._stop()
        self.proc = subprocess.Popen(
            self.cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=_ENV,
        )
        self.pid = os.getpid()
        self._finalizer = weakref.finalize(self, _end, self.proc, self.pid)
        return self.proc

    def _stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self.proc, self._finalizer = None, None


def _end(proc: subprocess.Popen, pid: int) -> None:
    """End a long-lived process: EOF on its stdin ends git; killed where it does not within 1 s.
    Only by the OS process that started it (a forked child leaves its parent's alone)."""
    if os.getpid() != pid:
        return
    try:
        proc.stdin.close()
        proc.wait(timeout=1.0)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
    finally:
        proc.stdout.close()


def _line(out) -> bytes:
    line = out.readline()
    if not line.endswith(b"\n"):
        raise _Gone
    return line[:-1]


@dataclass
class Git:
    """Runs git in one repository (``git -C path``)."""

    path: Path
    _batches: dict[str, _Batch] = field(default_factory=dict, init=False, repr=False, compare=False)

    def _batch(self, *args: str) -> _Batch:
        key = " ".join(args)
        b = self._batches.get(key)
        if b is None:
            b = self._batches.setdefault(key, _Batch(self.path, list(args)))
        return b

    def __getstate__(self) -> dict:
        return {"path": self.path}  # a copy elsewhere starts its own processes

    def __setstate__(self, state: dict) -> None:
        self.path = state["path"]
        self._batches = {}

    def close(self) -> None:
        """End this handle's long-lived processes (they also end with the handle)."""
        for b in list(self._batches.values()):
            with b.lock:
                b._stop()

    def run(self, *args: str, input: bytes | None = None, check: bool = True) -> bytes:
        cmd = ["git", "-C", str(self.path), *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, env=_ENV)
        if check and proc.returncode != 0:
            raise GitError(list(args), proc.returncode, proc.stderr.decode("utf-8", "replace"))
        return proc.stdout

    def text(self, *args: str, input: bytes | None = None) -> str:
        return self.run(*args, input=input).decode("utf-8", "replace")

    def ok(self, *args: str) -> bool:
        cmd = ["git", "-C", str(self.path), *args]
        return (
            subprocess.run(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_ENV
            ).returncode
            == 0
        )

    # -- objects -------------------------------------------------------------------------------
    def write_blobs(self, contents: list[bytes]) -> list[str]:
        """Write blobs in one ``hash-object -w --stdin-paths`` process; returns their ids in order."""
        if not contents:
            return []
        contents = [secrets.scrub_bytes(c) for c in contents]  # no secret value reaches git
        with scratch_dir(BLOBS_PREFIX) as tmp:
            paths = []
            for i, data in enumerate(contents):
                p = Path(tmp) / str(i)
                p.write_bytes(data)
                paths.append(str(p))
            data = "\n".join(paths).encode() + b"\n"
            if len(data) <= _BATCH_INPUT and not any("\n" in p for p in paths):
                try:
                    return self._batch("hash-object", "-w", "--no-filters", "--stdin-paths").ask(
                        data, lambda out: [_line(out).decode() for _ in paths]
                    )  # type: ignore[return-value]
                except _Gone:
                    pass
            out = self.text("hash-object", "-w", "--no-filters", "--stdin-paths", input=data)
        return out.split()

    def write_tree(self, files: dict[str, tuple[str, str]]) -> str:
        """Build (nested) trees from ``{path: (mode, blob_id)}`` with ``mktree``; returns the root tree id."""
        root: dict = {}
        for path, (mode, oid) in files.items():
            parts = path.split("/")
            node = root
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = (mode, oid)
        return self._mktree(root)

    def _mktree(self, node: dict) -> str:
        lines = []
        for name in sorted(node):
            entry = node[name]
            if isinstance(entry, dict):
                lines.append(f"040000 tree {self._mktree(entry)}\t{name}")
            else:
                mode, oid = entry
                kind = {"160000": "commit", "40000": "tree", "040000": "tree"}.get(mode, "blob")
                mode = "040000" if kind == "tree" else mode
                lines.append(f"{mode} {kind} {oid}\t{name}")
        data = ("\n".join(lines) + "\n").encode() if lines else b""
        if lines and len(data) < _BATCH_INPUT and not any("\n" in n for n in node):
            try:
                return self._batch("mktree", "--batch").ask(
                    data + b"\n", lambda out: _line(out).decode()
                )  # type: ignore[return-value]
            except _Gone:
                pass
        return self.text("mktree", input=data).strip()

    def commit_tree(self, tree: str, parents: list[str], message: str) -> str:
        args = ["commit-tree", tree]
        for p in parents:
            args += ["-p", p]
        return self.text(*args, input=secrets.scrub(message).encode("utf-8")).strip()

    def ls_tree(self, rev: str) -> dict[str, tuple[str, str]]:
        """``{path: (mode, blob_id)}`` of every file under ``rev`` (recursive)."""
        out = self.run("ls-tree", "-r", "-z", "--full-tree", rev)
        files = {}
        for rec in out.split(b"\0"):
            if not rec:
                continue
            meta, path = rec.split(b"\t", 1)
            mode, _kind, oid = meta.decode().split()
            files[path.decode("utf-8", "surrogateescape")] = (mode, oid)
        return files

    def cat_objects(self, specs: list[str]) -> list[tuple[str, str, bytes] | None]:
        """``(oid, type, content)`` of many objects (``rev:path``, refs, ids) in one ``cat-file --batch``."""
        if not specs:
            return []
        data = ("\n".join(specs) + "\n").encode("utf-8")
        if len(data) <= _BATCH_INPUT and data.count(b"\n") == len(specs):
            try:
                return self._batch("cat-file", "--batch").ask(
                    data, lambda out: [_object(out) for _ in specs]
                )  # type: ignore[return-value]
            except _Gone:
                pass
        out = self.run("cat-file", "--batch", input=data)
        results: list[tuple[str, str, bytes] | None] = []
        pos = 0
        for _ in specs:
            nl = out.index(b"\n", pos)
            header = out[pos:nl].decode("utf-8", "replace")
            pos = nl + 1
            if header.endswith(" missing") or header.endswith(" ambiguous"):
                results.append(None)
                continue
            oid, kind, size = header.rsplit(" ", 2)
            results.append((oid, kind, out[pos : pos + int(size)]))
            pos += int(size) + 1
        return results

    def cat_blobs(self, specs: list[str]) -> list[bytes | None]:
        """Read many objects' contents (``rev:path`` or ids) in one ``cat-file --batch``; None where missing."""
        return [None if obj is None else obj[2] for obj in self.cat_objects(specs)]

    def update_ref(self, ref: str, new: str, old: str | None, message: str = "poise") -> bool:
        """Compare-and-swap ``ref`` from ``old`` (None: must not exist) to ``new``; False if lost."""
        expected = ZERO_OID if old is None else old
        cmd = ["git", "-C", str(self.path), "update-ref", "-m", message, ref, new, expected]
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_ENV)
        return proc.returncode == 0

    def ref_transaction(self, lines: list[str]) -> str | None:
        """Apply ``update-ref --stdin`` commands (``create REF NEW``, ``delete REF OLD``...) as one
        transaction: all or none. None on success, else git's last error line."""
        script = "start\n" + "".join(line + "\n" for line in lines) + "prepare\ncommit\n"
        cmd = ["git", "-C", str(self.path), "update-ref", "--stdin"]
        proc = subprocess.run(cmd, input=script.encode(), capture_output=True, env=_ENV)
        if proc.returncode == 0:
            return None
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        return err[-1] if err else f"git update-ref failed ({proc.returncode})"


def _object(out) -> tuple[str, str, bytes] | None:
    """One answer of ``cat-file --batch``: (id, type, content), None for a missing object."""
    header = _line(out).decode("utf-8", "replace")
    if header.endswith(" missing") or header.endswith(" ambiguous"):
        return None
    try:
        oid, kind, size = header.rsplit(" ", 2)
        n = int(size)
    except ValueError:
        raise _Gone from None
    content = out.read(n + 1)
    if len(content) != n + 1 or not content.endswith(b"\n"):
        raise _Gone
    return oid, kind, content[:-1]


def parse_tree(raw: bytes) -> dict[str, tuple[str, str]]:
    """``{name: (mode, oid)}`` of one raw tree object (as ``cat-file --batch`` returns it)."""
    entries = {}
    pos, n = 0, len(raw)
    while pos < n:
        sp = raw.index(b" ", pos)
        nul = raw.index(b"\0", sp)
        mode = raw[pos:sp].decode()
        name = raw[sp + 1 : nul].decode("utf-8", "surrogateescape")
        width = _OID_BYTES
        entries[name] = (mode, raw[nul + 1 : nul + 1 + width].hex())
        pos = nul + 1 + width
    return entries


_OID_BYTES = 20  # SHA-1 repositories (git's default)
