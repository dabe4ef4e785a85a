"""Removing nodes without losing them, and collecting stale scratch data.

``drop`` moves a node's branch ``refs/heads/poise/<name>`` to the hidden ref
``refs/poise-dropped/<name>/<batch>`` in one ``git update-ref --stdin`` transaction (all or nothing):
the node leaves the lineage (``log``, ``select``, the loop) while every object stays reachable, so
``git fsck`` stays clean and ``restore`` brings the node back (under the very parents it was spawned
from: a parent is checked by commit, not by name). A batch is one drop (a node and the descendants
dropped with it); its id is the UTC time of the drop, which ``gc --prune`` reads.

``gc`` removes what no command needs any more: temporary directories that killed processes left
behind (:mod:`engine.scratch`), the verl work dirs (checkpoints) of nodes no longer in the archive;
it drops failed and rejected leaf nodes (restorable); with ``prune`` it deletes dropped batches for
good. Everything is limited to what is older than ``older_than_days``.
"""

from __future__ import annotations

import calendar
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.archive.store import REF_PREFIX, Archive, parse_trailers
from engine.errors import ArchiveError
from engine.scratch import SCRATCH_PREFIXES, in_use

DROPPED_PREFIX = "refs/poise-dropped/"
_BATCH_FMT = "%Y%m%dT%H%M%S"

PRUNE_GRACE = "1.hour.ago"
"""``gc --prune`` lets git delete only unreachable objects older than this: a command writing the
archive meanwhile (a run, a spawn) writes its objects a moment before the ref that reaches them, and
``--prune=now`` could delete them in between (git's own default grace is two weeks, for this)"""


@dataclass(frozen=True)
class DroppedNode:
    name: str
    batch: str
    commit: str
    status: str
    parents: tuple[str, ...]

    @property
    def dropped_at(self) -> float:
        """Unix time of the drop (from the batch id ``YYYYmmddTHHMMSS-mmm``)."""
        stamp, _, ms = self.batch.partition("-")
        try:
            t = calendar.timegm(time.strptime(stamp, _BATCH_FMT))
        except ValueError:
            return 0.0
        return t + (int(ms) / 1000 if ms.isdigit() else 0.0)

    @property
    def ref(self) -> str:
        return f"{DROPPED_PREFIX}{self.name}/{self.batch}"


def _batch_id(now: float | None = None) -> str:
    t = time.time() if now is None else now
    return f"{time.strftime(_BATCH_FMT, time.gmtime(t))}-{int(t * 1000) % 1000:03d}"


def _apply(archive: Archive, lines: list[str], what: str) -> None:
    err = archive.git.ref_transaction(lines)
    if err is not None:
        raise ArchiveError(f"could not {what}: {err} (nothing changed)")


def drop(
    archive: Archive,
    names: list[str],
    *,
    with_descendants: bool = False,
    dry_run: bool = False,
    now: float | None = None,
) -> list[str]:
    """Drop ``names`` (and, with ``with_descendants``, every node below them) in one batch; returns
    the dropped names. Refuses the root, unknown names, and nodes with descendants otherwise."""
    nodes = archive.nodes()
    if not names:
        raise ArchiveError("name at least one node to drop")
    for n in names:
        if n not in nodes:
            archive.node(n)  # the 'unknown node' error with a suggestion
        if not nodes[n].parents:  # the root, whatever its name (a child may be named grpo)
            raise ArchiveError(f"{n!r} is a root node; a root cannot be dropped")
    below: dict[str, None] = {}
    for n in names:
        for d in sorted(archive.descendants(n, nodes), key=lambda d: (nodes[d].created, d)):
            if d not in names:
                below[d] = None
    if below and not with_descendants:
        shown = ", ".join(list(below)[:5]) + (
            f" and {len(below) - 5} more" if len(below) > 5 else ""
        )
        raise ArchiveError(
            f"{', '.join(names)} has descendants ({shown}); "
            "drop them too with --with-descendants, or drop those first"
        )
    targets = list(dict.fromkeys(names)) + list(below)
    if dry_run:
        return targets
    batch = _batch_id(now)
    lines = []
    for n in targets:
        tip = nodes[n].commit
        lines.append(f"create {DROPPED_PREFIX}{n}/{batch} {tip}")
        lines.append(f"delete {REF_PREFIX}{n} {tip}")
    _apply(archive, lines, f"drop {', '.join(names)}")
    return targets


def dropped(archive: Archive) -> list[DroppedNode]:
    """Every dropped node (newest batch first), read in one ``for-each-ref``."""
    fmt = "%(refname)%1f%(objectname)%1f%(contents)%1e"
    out = archive.git.text("for-each-ref", f"--format={fmt}", DROPPED_PREFIX)
    found = []
    for rec in out.split("\x1e"):
        rec = rec.lstrip("\n")
        if not rec:
            continue
        ref, oid, msg = rec.split("\x1f", 2)
        name, _, batch = ref[len(DROPPED_PREFIX) :].rpartition("/")
        tr = parse_trailers(msg)
        found.append(
            DroppedNode(
                name=name,
                batch=batch,
                commit=oid,
                status=(tr.get("Poise-Status") or ["spawned"])[-1],
                parents=tuple(tr.get("Poise-Parent", [])),
            )
        )
    return sorted(found, key=lambda d: (d.batch, d.name), reverse=True)


def restore(archive: Archive, name: str, batch: str | None = None) -> list[str]:
    """Bring back the latest drop of ``name`` (or the given ``batch``) with every node dropped
    together with it; returns the restored names. Refuses when a name is taken again or a parent
    is missing."""
    gone = dropped(archive)
    mine = [d for d in gone if d.name == name and (batch is None or d.batch == batch)]
    if not mine:
        known = sorted({d.name for d in gone})
        hint = f" (dropped nodes: {', '.join(known[:10])})" if known else " (nothing is dropped)"
        raise ArchiveError(
            f"no dropped node {name!r}" + (f" in batch {batch}" if batch else "") + hint
        )
    chosen = mine[0].batch
    group = [d for d in gone if d.batch == chosen]
    live = archive.nodes()
    taken = [d.name for d in group if d.name in live]
    if taken:
        raise ArchiveError(
            f"cannot restore: {', '.join(taken)} exist(s) again; drop or rename those first"
        )
    names = {d.name for d in group}
    tips = {n: node.commit for n, node in live.items()} | {d.name: d.commit for d in group}
    for d in group:  # parents by commit, not by name: a name may have been taken by another node
        bases = dict(zip(d.parents, _spawned_from(archive, d)))
        for p in d.parents:
            base = bases.get(p)
            if p in tips and (base is None or _holds(archive, tips[p], base)):
                continue
            raise ArchiveError(_parent_problem(archive, d, p, base, gone, present=p in tips))
    lines = []
    for d in group:
        lines.append(f"create {REF_PREFIX}{d.name} {d.commit}")
        lines.append(f"delete {d.ref} {d.commit}")
    _apply(archive, lines, f"restore {name}")
    return sorted(names, key=lambda n: (n != name, n))


def _spawned_from(archive: Archive, d: DroppedNode) -> list[str]:
    """The commits ``d`` was spawned from, one per ``Poise-Parent`` (the git parents of its first
    commit); [] where its history does not tell (a node written by hand)."""
    out = archive.git.text("log", "--first-parent", "--format=%P%x1f%B%x1e", d.commit)
    first: list[str] = []
    for rec in out.split("\x1e"):
        rec = rec.strip("\n")
        if not rec:
            continue
        parents, msg = rec.split("\x1f", 1)
        if parse_trailers(msg).get("Poise-Node", [None])[-1] != d.name:
            break
        first = parents.split()
    return first if len(first) == len(d.parents) else []


def _holds(archive: Archive, tip: str, commit: str) -> bool:
    """Whether ``commit`` is ``tip`` or one of its ancestors."""
    return archive.git.ok("merge-base", "--is-ancestor", commit, tip)


def _parent_problem(
    archive: Archive,
    d: DroppedNode,
    parent: str,
    base: str | None,
    gone: list[DroppedNode],
    *,
    present: bool,
) -> str:
    """Why ``d`` cannot go back under ``parent`` (absent, or ``present`` but made again as another
    node: its branch does not hold ``base``, the commit ``d`` was spawned from), and what to do."""
    if present and base is not None:
        head = (
            f"cannot restore {d.name}: its parent {parent} was made again as a different node "
            f"(poise/{parent} does not hold {base[:10]}, the commit {d.name} was spawned from)"
        )
        then = f"drop or rename the new {parent}, then restore the old one first"
    else:
        head = f"cannot restore {d.name}: its parent {parent} is not in the archive"
        then = f"restore {parent} first"
    if base is None:
        return f"{head}; {then}"
    # the old parent's drop, newest first: its tip holds the base
    old = [g for g in gone if g.name == parent and _holds(archive, g.commit, base)]
    if not old:
        return (
            f"{head}; the old {parent} is no longer among the dropped nodes (pruned), so "
            f"{d.name} cannot be restored"
        )
    return f"{head}; {then} (poise-git restore {parent} --batch {old[0].batch})"


@dataclass
class GcReport:
    scratch: list[str] = field(default_factory=list)
    """removed (or, dry run, removable) directories"""
    scratch_bytes: int = 0
    failed: list[str] = field(default_factory=list)
    """failed / rejected leaf nodes dropped (restorable)"""
    pruned: list[str] = field(default_factory=list)
    """dropped nodes deleted for good (``name@batch``)"""
    dry_run: bool = False


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def _mtime(path: Path) -> float:
    """The newest modification time under ``path`` (a directory still written to is not stale)."""
    newest = path.lstat().st_mtime
    for root, dirs, files in os.walk(path):
        for f in dirs + files:
            try:
                newest = max(newest, os.lstat(os.path.join(root, f)).st_mtime)
            except OSError:
                pass
    return newest


def scratch_candidates(
    archive: Archive, cutoff: float, tmpdir: str | Path | None = None
) -> list[Path]:
    """Stale scratch directories, untouched since ``cutoff`` (Unix time): the engine's temporary
    directories of this user that no running process holds (:mod:`engine.scratch`), and the
    per-node verl work dirs (``.poise/verl/nodes/<node>``, ``.poise/verl/smoke/nodes/<node>``) of
    nodes no longer in the archive (dropped or pruned)."""
    out = []
    tmp = Path(tmpdir or tempfile.gettempdir())
    uid = os.getuid() if hasattr(os, "getuid") else None
    if tmp.is_dir():
        for p in sorted(tmp.iterdir()):
            if not p.name.startswith(SCRATCH_PREFIXES) or p.is_symlink() or not p.is_dir():
                continue
            st = p.lstat()
            if uid is not None and st.st_uid != uid:
                continue
            if _mtime(p) < cutoff and not in_use(p):
                out.append(p)
    per_node = [d for d in _verl_node_dirs(archive.path) if d.is_dir() and not d.is_symlink()]
    if per_node:
        live = set(archive.nodes())
        for d in per_node:
            for p in sorted(d.iterdir()):
                if p.is_dir() and not p.is_symlink() and p.name not in live and _mtime(p) < cutoff:
                    out.append(p)
    return out


def _verl_node_dirs(root: Path) -> tuple[Path, ...]:
    """The directories under ``<archive>/.poise/verl`` that hold one subdirectory per node (a
    training's work dir and checkpoints): ``nodes/<node>`` and ``smoke/nodes/<node>``. Everything
    else there (``data/``, ``smoke/shared/``: data, model and tokenizer caches of the archive) is
    shared and never collected."""
    verl = root / ".poise" / "verl"
    return (verl / "nodes", verl / "smoke" / "nodes")


def gc(
    archive: Archive,
    older_than_days: float = 14.0,
    *,
    dry_run: bool = False,
    drop_failed: bool = True,
    prune: bool = False,
    tmpdir: str | Path | None = None,
    now: float | None = None,
) -> GcReport:
    """Collect what is older than ``older_than_days``: stale scratch directories, failed / rejected
    leaf nodes (dropped, restorable) and, with ``prune``, dropped nodes (deleted for good)."""
    if older_than_days < 0:
        raise ArchiveError("--older-than must be >= 0 days")
    now = time.time() if now is None else now
    cutoff = now - older_than_days * 86400.0
    rep = GcReport(dry_run=dry_run)
    for p in scratch_candidates(archive, cutoff, tmpdir):
        rep.scratch.append(str(p))
        rep.scratch_bytes += _size(p)
        if not dry_run:
            shutil.rmtree(p, ignore_errors=True)
    if drop_failed:
        nodes = archive.nodes()
        has_kids = {p for n in nodes.values() for p in n.parents}
        stale = [
            n.name
            for n in sorted(nodes.values(), key=lambda n: (n.created, n.name))
            if n.status in ("failed", "rejected")
            and n.name not in has_kids
            and n.parents
            and n.created < cutoff
        ]
        if stale:
            rep.failed = drop(archive, stale, dry_run=dry_run, now=now)
    if prune:
        old = [d for d in dropped(archive) if d.dropped_at < cutoff]
        rep.pruned = [f"{d.name}@{d.batch}" for d in old]
        if old and not dry_run:
            _apply(archive, [f"delete {d.ref} {d.commit}" for d in old], "prune dropped nodes")
            archive.git.run("reflog", "expire", "--expire-unreachable=now", "--all", check=False)
            archive.git.run("gc", f"--prune={PRUNE_GRACE}", "--quiet", check=False)
    return rep
