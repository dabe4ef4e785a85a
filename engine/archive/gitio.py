"""Thin git plumbing over subprocess: no working tree, no index, compare-and-swap ref updates.

GitPython is used for repository handling (init, clone in tests); the hot paths here call git plumbing
directly because every extra process start costs 2-4 ms and object-by-object traversal is ~100x slower.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
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


@dataclass
class Git:
    """Runs git in one repository (``git -C path``)."""

    path: Path

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
            out = self.text(
                "hash-object",
                "-w",
                "--no-filters",
                "--stdin-paths",
                input="\n".join(paths).encode() + b"\n",
            )
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
        return self.text(
            "mktree", input=("\n".join(lines) + "\n").encode() if lines else b""
        ).strip()

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
        out = self.run("cat-file", "--batch", input=("\n".join(specs) + "\n").encode("utf-8"))
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
