"""The archive IS git: one branch ``refs/heads/poise/<node>`` per candidate, lineage in commit trailers.

Every node commit carries the trailers ``Poise-Node``, ``Poise-Parent`` (repeatable), ``Poise-Status``
and ``Poise-Created``; later records (results, reflection, verification) are further commits on the
node's own branch, never rewrites. Writes use plumbing only (hash-object, mktree, commit-tree,
compare-and-swap update-ref) so concurrent writers never share an index or working tree. Reading the
whole lineage is one ``for-each-ref`` plus one ``cat-file --batch`` (one more of each where a branch
points to an object the repository lacks, which is then named and skipped).
"""

from __future__ import annotations

import difflib
import logging
import math
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import secrets
from engine.archive.confirmation import CONFIRMATIONS_DIR
from engine.archive.edit import apply_edit, check_interface
from engine.archive.gitio import Git, GitError, parse_tree
from engine.archive.index import LineageIndex, index_for, no_gc, parse_trailers
from engine.archive.locks import git_dir
from engine.archive.mechanism import TRAILER as MECHANISM_TRAILER
from engine.archive.mechanism import mechanism_hash
from engine.archive.results import (
    LEGACY_FILE,
    RESULTS_DIR,
    EvaluationResult,
    ProtocolRef,
    configured_protocol,
    named_protocol,
    parse_result,
)
from engine.config import DEFAULT_TOML, parse_config
from engine.errors import ArchiveError
from trainer_template import ALGORITHM_FILE

log = logging.getLogger(__name__)
_WARNED_REMOTE_ONLY: set[Path] = set()
"""archives whose remote-only nodes were already warned about in this process"""
_WARNED: set[tuple[str, str, str]] = set()
_WARNED_CONFIG: set[Path] = set()
"""archives whose edited poise.toml was already warned about in this process"""
REF_PREFIX = "refs/heads/poise/"
ROOT_REF = "refs/poise-root"
"""the archive's init commit, written by ``init`` (and by the first :meth:`Archive.root` of an
archive made before it): a hint that finds the root without walking the lineage, used only where
the root's branch still holds that commit. Outside ``refs/poise/``: git resolves a short name
``poise/X`` to ``refs/poise/X`` before ``refs/heads/poise/X``, so a ref there would hide the
branch of a node named X from ``git log poise/X``"""
ROOT_NAME = "grpo"
ALGORITHM = "algorithm.py"
REFLECTION = "REFLECTION.md"
PROPOSAL = "PROPOSAL.md"
# Files that belong to one node and are not inherited by its children.
NODE_FILES = (PROPOSAL, REFLECTION, LEGACY_FILE, "verification.json")
NODE_DIRS = ("tests/", "records/", RESULTS_DIR + "/", CONFIRMATIONS_DIR + "/")
STATUSES = ("spawned", "verified", "rejected", "evaluating", "evaluated", "failed")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")

_EXCLUDE = "mlflow.db\nmlruns/\n.poise/\n__pycache__/\n"
_EXPERIMENT_README = """\
# A poise-git experiment

This repository is a poise-git archive: every candidate RL algorithm is a branch `poise/<node>` whose
commits carry its edited `algorithm.py`, `PROPOSAL.md`, generated `tests/`, `results/` and
`REFLECTION.md`. Lineage lives in the commit trailers (`Poise-Node`, `Poise-Parent`).

    poise-git log                       # the lineage tree
    poise-git show NODE                 # proposal, mechanism diff vs parent, results, reflection
    git log --all --graph               # plain git works just as well
    git show poise/NODE:algorithm.py    # any file of any node, as it is now

The files in this directory are the root node as it was created (a detached checkout, for reading):
the archive itself lives in the branches, which poise-git writes without touching this directory, so
`git status` stays clean. `poise.toml` holds the experiment's protocol settings: poise-git reads the
root node's, fixed at init (`poise-git init DIR --config FILE`), so editing the file here changes
nothing (poise-git warns that it is not read).
"""


@dataclass(slots=True)
class Node:
    """One archived candidate, as read from its branch tip. ``results`` and ``unreadable`` are the
    lineage index entry's, shared by every read of the same commit in a process (a read builds no
    copy of them), as are ``trailers`` unless the index's snapshot keeps them as text (then each
    node parses its own on first access): read them, never change them."""

    name: str
    commit: str
    parents: tuple[str, ...]
    status: str
    created: float
    trailers: dict[str, list[str]] = field(default_factory=dict)
    results: dict[str, EvaluationResult] = field(default_factory=dict)
    """every recorded result, by protocol id"""
    result: EvaluationResult | None = None
    """the result under the protocol this lineage read compares (None: not evaluated under it)"""
    stale: EvaluationResult | None = None
    """a result under the compared protocol id but another hash (an older protocol version)"""
    unreadable: dict[str, str] = field(default_factory=dict)
    """result files that could not be read (a hand edit, a bad write): path -> why"""
    depth: int = 0
    subject: str = ""

    @property
    def metrics(self) -> dict[str, float]:
        """The compared result's metrics ({} when there is none)."""
        return dict(self.result.metrics) if self.result is not None else {}

    @property
    def overall(self) -> float | None:
        v = self.metrics.get("overall")
        return None if v is None else float(v)

    @property
    def evaluated(self) -> bool:
        """Has a successful result under the compared protocol."""
        return self.result is not None and self.result.ok

    @property
    def parent(self) -> str | None:
        return self.parents[0] if self.parents else None

    def trailer(self, key: str, default: str | None = None) -> str | None:
        vals = self.trailers.get(key)
        return vals[-1] if vals else default


_TRAILERS = Node.trailers  # the slot


def _trailers(node: Node) -> dict[str, list[str]]:
    """A node's trailers; where it holds them as text (a lineage index snapshot keeps them as one
    string, :func:`engine.archive.index.trailer_text`: a read then builds no dict of lists per
    node), parsed into the dict on first access."""
    v = _TRAILERS.__get__(node, Node)
    if type(v) is str:
        v = {sys.intern(k): vals for k, vals in parse_trailers(v).items()}
        _TRAILERS.__set__(node, v)
    return v


Node.trailers = property(_trailers, _TRAILERS.__set__, doc=_trailers.__doc__)  # type: ignore[assignment]


def earliest_root(nodes: Mapping[str, Node]) -> str | None:
    """The root among ``nodes`` read without the archive: the earliest node without parents
    (whatever its name; a node named ``grpo`` under a root of the user's own code is not it).
    :meth:`Archive.root` finds the same node from git (the oldest init commit)."""
    roots = sorted((n for n in nodes.values() if not n.parents), key=lambda n: (n.created, n.name))
    return roots[0].name if roots else None


def _node_from(name: str, oid: str, kind: str, msg: str) -> tuple[Node | None, str]:
    """The node a ref under refs/heads/poise/ describes, or (None, what is wrong with it)."""
    if kind == "missing":
        return None, f"it points to {oid}, an object this repository does not have"
    if kind != "commit":
        return None, f"it points to a {kind}, not a commit"
    return _node_of(name, oid, _entry(_head(msg), ()))


def _head(msg: str) -> tuple:
    """What a node commit's message says, whatever branch points to it (the first part of a lineage
    index entry): (owner, problem, status, created, parents, trailers, subject); ``problem`` is what
    is wrong with its status or creation time ('' when nothing is), ``owner`` None without a
    ``Poise-Node`` trailer."""
    tr = {sys.intern(k): v for k, v in parse_trailers(msg).items()}  # one key object in an index
    owner = (tr.get("Poise-Node") or [None])[-1]
    status = sys.intern((tr.get("Poise-Status") or ["spawned"])[-1])
    problem, created = "", 0.0
    if status not in STATUSES:
        problem = f"its Poise-Status {status[:40]!r} is unknown"
    else:
        try:
            created = float((tr.get("Poise-Created") or ["0"])[-1])
        except ValueError:
            problem = "its Poise-Created trailer is not a number"
        else:
            if not math.isfinite(created):
                problem = "its Poise-Created trailer is not a number"
    subject = msg.splitlines()[0] if msg else ""
    return owner, problem, status, created, tuple(tr.get("Poise-Parent", [])), tr, subject


def _node_of(name: str, oid: str, entry: tuple) -> tuple[Node | None, str]:
    """The node the branch ``name`` pointing to the commit ``oid`` is, from the commit's lineage index
    entry (:func:`_head` plus its result files), or (None, what is wrong with it)."""
    if not _NAME_RE.match(name) or name.endswith(".lock"):
        return None, "its name is not a poise-git node name"
    owner, problem, status, created, parents, tr, subject, _files, results, unreadable = entry
    if owner is None:
        return None, "its commit is not a poise-git node's (no Poise-Node trailer)"
    if owner != name:
        return (
            None,
            f"its commit is node {owner[:40]!r}'s (Poise-Node: {owner[:40]}), not {name!r}'s",
        )
    if problem:
        return None, problem
    node = Node(
        name=name,
        commit=oid,
        parents=parents,
        status=status,
        created=created,
        trailers=tr,
        results=results,
        unreadable=unreadable,
        subject=subject,
    )
    return node, ""


def _entry(head: tuple, files: tuple) -> tuple:
    """A lineage index entry: the commit's :func:`_head`, its result files ((path, result, None) or
    (path, None, why)), and what a node of it holds of them: its results by protocol id and its
    unreadable files by path (read-only: shared by every node read of the commit)."""
    results: dict[str, EvaluationResult] = {}
    unreadable: dict[str, str] = {}
    for path, result, why in files:
        if result is not None:
            results[result.protocol.id] = result
        elif why is not None:
            unreadable[path] = why
    return head + (files, results, unreadable)


def _read_files(path_results: Iterable[tuple[str, bytes | None]], owner: str) -> tuple:
    """The result files part of a lineage index entry: (path, result, None) for each file read,
    (path, None, why) for one that could not be, nothing for an absent one."""
    out = []
    for p, blob in path_results:
        if blob is None:
            continue
        try:
            out.append((p, parse_result(blob, f"{owner}:{p}"), None))
        except (ArchiveError, KeyError, TypeError, ValueError, RecursionError) as exc:
            # unreadable: the node shows as not evaluated, and says why
            out.append((p, None, " ".join(str(exc).split())[:300] or type(exc).__name__))
    return tuple(out)


class Archive:
    """An experiment repository. ``Archive(path)`` opens one; ``Archive.init(path)`` creates one."""

    def __init__(self, path: str | Path):
        self.path = Path(path).resolve()
        if not self.path.exists():
            raise ArchiveError(
                f"{self.path} does not exist (no archive there; `poise-git init` creates one)"
            )
        if not self.path.is_dir():
            raise ArchiveError(f"{self.path} is not a directory (an archive is one)")
        if not (self.path / ".git").exists() and not (self.path / "HEAD").is_file():
            raise ArchiveError(
                f"{self.path} is not a poise-git archive (no git repository; run `poise-git init`)"
            )
        self.git = Git(self.path)
        self.skipped: dict[str, str] = {}
        """refs under refs/heads/poise/ the last ``nodes()`` ignored, with the reason"""
        self._root: str | None = None  # the root's name, found once (the init commit never changes)
        self._root_hint: str | None = None  # what ROOT_REF pointed to when last read
        self._lineage_index: LineageIndex | None = None
        if (
            not self.git.ok("rev-parse", "--verify", "-q", REF_PREFIX + ROOT_NAME)
            and not self._any_node()
        ):
            raise ArchiveError(
                f"{self.path} is a git repository but not a poise-git archive (no poise/* branches; "
                "a clone of an archive needs them as local branches: `git clone --mirror`, or "
                "`git fetch origin 'refs/heads/poise/*:refs/heads/poise/*'` in the clone)"
            )
        self._warn_remote_only()
        head = self.path / ".git" / "HEAD"
        if head.is_file() and head.read_text().startswith("ref: " + REF_PREFIX):
            # made before the detached checkout: HEAD follows the root's branch, which records move,
            # so `git status` showed them as staged deletions. Detach HEAD at the commit that was
            # checked out (the root's first); the index and the files stay as they are.
            first = self.git.text("rev-list", "--max-parents=0", "HEAD").split()
            if first:
                self.git.run("update-ref", "--no-deref", "HEAD", first[-1], check=False)

    def remote_only(self) -> dict[str, str]:
        """Nodes a remote has that this repository has no branch for (a plain ``git clone`` makes a
        local branch of the checked-out one alone): node name -> the remote-tracking ref."""
        refs = self.git.text("for-each-ref", "--format=%(refname)", "refs/remotes/", REF_PREFIX)
        local = {ref for ref in refs.split() if ref.startswith(REF_PREFIX)}
        out: dict[str, str] = {}
        for ref in refs.split():
            remote, _, rest = ref.removeprefix("refs/remotes/").partition("/")
            if rest.startswith("poise/") and REF_PREFIX + rest.removeprefix("poise/") not in local:
                out.setdefault(rest.removeprefix("poise/"), f"{remote}/{rest}")
        return out

    def _warn_remote_only(self) -> None:
        """Warn, once per archive and process, that the lineage read here lacks nodes a remote has."""
        if self.path in _WARNED_REMOTE_ONLY:
            return
        _WARNED_REMOTE_ONLY.add(self.path)
        missing = self.remote_only()
        if missing:
            remote = next(iter(missing.values())).split("/", 1)[0]
            shown = ", ".join(list(missing)[:3]) + (" …" if len(missing) > 3 else "")
            log.warning(
                "%d node(s) of %s are only remote-tracking branches here (%s), so the lineage read "
                "here lacks them; make them local: git -C %s fetch %s "
                "'refs/heads/poise/*:refs/heads/poise/*'",
                len(missing),
                remote,
                shown,
                self.path,
                remote,
            )

    def _any_node(self) -> bool:
        return bool(
            self.git.text("for-each-ref", "--count=1", "--format=%(refname)", REF_PREFIX).strip()
        )

    # -- creation ------------------------------------------------------------------------------
    @classmethod
    def init(
        cls,
        path: str | Path,
        *,
        algorithm: str | None = None,
        config_toml: str | None = None,
        root_name: str = ROOT_NAME,
        proposal: str | None = None,
    ) -> Archive:
        """Create an archive whose root node ``poise/<root_name>`` holds the trainer template."""
        path = Path(path).resolve()
        if path.exists() and not path.is_dir():
            raise ArchiveError(f"{path} exists and is not a directory; choose a new directory")
        if path.exists() and any(path.iterdir()):
            raise ArchiveError(f"{path} exists and is not empty; choose a new directory")
        check_name(root_name)
        template = ALGORITHM_FILE.read_text(encoding="utf-8")
        algo = algorithm if algorithm is not None else template
        # before anything is created, so that a refused root leaves no directory behind
        check_interface(template, algo, "the root's algorithm.py")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a parent that is a file, a read-only or missing mount...
            raise ArchiveError(f"cannot create {path}: {exc.strerror or exc}") from None
        subprocess.run(["git", "init", "-q", "-b", f"poise/{root_name}", str(path)], check=True)
        git = Git(path)
        (path / ".git" / "info").mkdir(exist_ok=True)
        (path / ".git" / "info" / "exclude").write_text(_EXCLUDE)
        files = {
            ALGORITHM: algo.encode(),
            "poise.toml": (config_toml or DEFAULT_TOML).encode(),
            "README.md": _EXPERIMENT_README.encode(),
        }
        if proposal:
            files[PROPOSAL] = proposal.encode()
        names = list(files)
        oids = git.write_blobs([files[n] for n in names])
        tree = git.write_tree({n: ("100644", o) for n, o in zip(names, oids)})
        msg = _message(
            f"poise: root node {root_name}",
            "",
            root_name,
            (),
            "spawned",
            time.time(),
            _set_mechanism({"Poise-Event": ["init"]}, algo),
        )
        commit = git.commit_tree(tree, [], msg)
        if not git.update_ref(REF_PREFIX + root_name, commit, None, "poise init"):
            raise ArchiveError("could not create the root branch")
        git.update_ref(ROOT_REF, commit, None, "poise init")
        _detach_checkout(git, commit)
        return cls(path)

    # -- reading -------------------------------------------------------------------------------
    def nodes(self, protocol: ProtocolRef | str | None = None) -> dict[str, Node]:
        """Every node with parents, status and results.

        One ``for-each-ref`` lists the branch tips (names and ids, no object read); each tip commit
        is looked up in the lineage index (:mod:`engine.archive.index`); only the tips it lacks are
        read from git (one ``cat-file --batch`` of the commits, one of their result files) and then
        added to it. ``protocol`` (a :class:`ProtocolRef`, or ``id`` / ``id@hash``; default: the
        experiment's configured one) is the protocol whose result each node's ``result`` holds.
        Depths start from the last lineage this process (or the index's snapshot) assigned them
        for: where only nodes were added, only theirs are computed (:func:`_depths`)."""
        self.skipped: dict[str, str] = {}
        tips = self._refs()
        index = self._index()
        oids = {oid for _ref, oid in tips}
        entries = index.get(oids)
        others: dict[str, tuple[str, str]] = {}
        new: dict[str, tuple] = {}
        mechs: list[tuple[str, str | None, str, float]] = []
        if len(entries) < len(oids):
            new, mechs, others = self._parse_tips(sorted(oids - entries.keys()))
            entries.update(new)
        ref = self.protocol_ref(protocol)
        with no_gc():
            nodes = self._assemble(tips, entries, others, ref)
            lineage = _depths(nodes, index.lineage)
            if lineage is None:  # pushed branches naming each other as parents: skipped, named
                self._skip_cycles(nodes)
                lineage = _depths(nodes, None)
        index.lineage = lineage
        if new:
            index.add(new, mechs, tips=oids, lineage=lineage)
        return nodes

    def _skip_cycles(self, nodes: dict[str, Node]) -> None:
        """Remove from ``nodes`` every node on a cycle of parent links (pushed branches naming each
        other, or themselves, as parent), each named once in a warning and in :attr:`skipped`."""
        for name, cycle in _parent_cycles(nodes).items():
            ref = REF_PREFIX + name
            self.skipped[ref] = f"its Poise-Parent lineage is a cycle ({' -> '.join(cycle)})"
            del nodes[name]
            if (str(self.path), ref, "cycle") not in _WARNED:
                _WARNED.add((str(self.path), ref, "cycle"))
                log.warning("poise-git: ignoring %s: %s", ref, self.skipped[ref])

    def _assemble(
        self,
        tips: list[tuple[str, str]],
        entries: Mapping[str, tuple],
        others: Mapping[str, tuple[str, str]],
        ref: ProtocolRef,
    ) -> dict[str, Node]:
        """The nodes of ``tips`` from their index ``entries`` (``others``: the type and message of
        tips that are no commits), each with its result under ``ref``; the refs that are no node
        into :attr:`skipped`, named. A tip whose commit is its own node's (the common case) is built
        in one step; the others go through :func:`_node_of`, which says what is wrong."""
        nodes: dict[str, Node] = {}
        cut = len(REF_PREFIX)
        pid = ref.id
        same: dict[int, bool] = {}  # by protocol object: an index shares one among its results
        valid = _NAME_RE.match
        for refname, oid in tips:
            name = refname[cut:]
            entry = entries.get(oid)
            if (
                entry is not None
                and entry[0] == name
                and not entry[1]
                and valid(name)
                and not name.endswith(".lock")
            ):
                results = entry[8]
                node = Node(
                    name, oid, entry[4], entry[2], entry[3], entry[5], results, None, None,
                    entry[9], 0, entry[6],
                )  # fmt: skip
            else:
                if entry is not None:
                    node, problem = _node_of(name, oid, entry)
                    kind = "commit"
                else:
                    kind, msg = others[oid]
                    node, problem = _node_from(name, oid, kind, msg)
                if node is None:  # a foreign or malformed ref: named, then ignored
                    self.skipped[refname] = problem
                    if (str(self.path), refname, oid) not in _WARNED:
                        _WARNED.add((str(self.path), refname, oid))
                        log.warning(
                            "poise-git: ignoring %s: %s%s",
                            refname,
                            problem,
                            self._repair(refname, oid, kind),
                        )
                    continue
                results = node.results
            r = results.get(pid)
            if r is not None:
                p = r.protocol
                ok = same.get(id(p))
                if ok is None:
                    ok = same[id(p)] = ref.matches(p)
                if ok:
                    node.result = r
                else:
                    node.stale = r
            nodes[name] = node
        return nodes

    def _refs(self) -> list[tuple[str, str]]:
        """``(ref, object id)`` of every ref under refs/heads/poise/: one ``for-each-ref`` that opens
        no object (packed refs are read from ``packed-refs`` alone)."""
        # git allows no whitespace in a ref name: one split() parses the whole listing
        words = self.git.text(
            "for-each-ref", "--format=%(refname) %(objectname)", REF_PREFIX
        ).split()
        return list(zip(words[0::2], words[1::2]))

    def _index(self) -> LineageIndex:
        """This repository's lineage index (one per process and repository)."""
        if self._lineage_index is None:
            self._lineage_index = index_for(git_dir(self))
        return self._lineage_index

    def _parse_tips(
        self, oids: list[str]
    ) -> tuple[
        dict[str, tuple], list[tuple[str, str | None, str, float]], dict[str, tuple[str, str]]
    ]:
        """Read the commits ``oids`` from git: (their lineage index entries, their mechanism rows,
        (type, message) of those that are no commit: ``missing`` where the repository lacks them)."""
        entries: dict[str, tuple] = {}
        mechs: list[tuple[str, str | None, str, float]] = []
        others: dict[str, tuple[str, str]] = {}
        heads: dict[str, tuple] = {}
        for oid, obj in zip(oids, self.git.cat_objects(oids)):
            if obj is None:
                others[oid] = ("missing", "")
                continue
            kind, raw = obj[1], obj[2]
            msg = raw.split(b"\n\n", 1)[1] if kind in ("commit", "tag") and b"\n\n" in raw else b""
            if kind != "commit":
                others[oid] = (kind, msg.decode("utf-8", "replace"))
                continue
            heads[oid] = _head(msg.decode("utf-8", "replace"))
        wanted = [
            (oid, p)
            for oid, head in heads.items()
            if head[0] is not None and not head[1]
            for p in _paths_of(head[5])
        ]
        blobs = dict(zip(wanted, self.git.cat_blobs([f"{oid}:{p}" for oid, p in wanted])))
        for oid, head in heads.items():
            owner = head[0]
            if owner is None or head[1]:
                entries[oid] = _entry(head, ())
                continue
            files = _read_files(((p, blobs[(oid, p)]) for p in _paths_of(head[5])), owner)
            entries[oid] = _entry(head, files)
            mechs.append((oid, (head[5].get(MECHANISM_TRAILER) or [None])[-1], owner, head[3]))
        return entries, mechs, others

    def mechanism_twins(self, digest: str) -> list[str] | None:
        """Names of the nodes whose algorithm.py has the mechanism hash ``digest`` (oldest first),
        from the lineage index's mechanism rows: one indexed look-up, then one ``cat-file --batch``
        that keeps a node only where its branch still points to the commit found (a branch deleted
        or moved behind the engine's back is not reported). A node that arrived behind the engine's
        back (a push) is found once a lineage read has indexed it. None where the index cannot be
        read (then read the lineage)."""
        index = self._index()
        if not index.built():
            self.nodes()  # fills the index once
            if not index.built():
                return None
        rows = index.mechanism_rows(digest)
        if rows is None:
            return None
        unhashed = index.unhashed_rows()
        if unhashed:  # commits made before the trailer existed: hashed from their file, once
            blobs = self.git.cat_blobs([f"{oid}:{ALGORITHM}" for oid, _n, _c in unhashed])
            hashes = {
                oid: (mechanism_hash(b.decode("utf-8", "replace")) if b is not None else None) or ""
                for (oid, _n, _c), b in zip(unhashed, blobs)
            }
            index.set_hashes(hashes)
            rows = rows + [row for row in unhashed if hashes[row[0]] == digest]
        if not rows:
            return []
        names = sorted({name for _oid, name, _c in rows})
        now = dict(zip(names, self.git.cat_objects([REF_PREFIX + n for n in names])))
        live = {
            (name, created)
            for oid, name, created in rows
            if now.get(name) is not None and now[name][0] == oid
        }
        return [name for _created, name in sorted((c, n) for n, c in live)]

    def _remember(self, commit: str, msg: str, files: tuple | None) -> None:
        """Add the commit this process just wrote to the lineage index (``files``: its result files'
        part of the entry; None where it is not known without reading git: then the next lineage
        read adds it). A message the secret scrubber changed is left to that read too."""
        if files is None or secrets.scrub(msg) != msg:
            return
        head = _head(msg)
        owner = head[0]
        mech = [(commit, (head[5].get(MECHANISM_TRAILER) or [None])[-1], owner, head[3])]
        self._index().add({commit: _entry(head, files)}, mech if owner and not head[1] else ())

    def _repair(self, ref: str, oid: str, kind: str) -> str:
        """'; <how to repair>' for a ref :meth:`nodes` ignores, where there is a known way ('' else):
        remove a ref to a missing object, move a branch a user committed on back to its node's last
        commit, rename a renamed node branch back."""
        at = f"git -C {shlex.quote(str(self.path))}"
        name = ref[len(REF_PREFIX) :]
        if kind == "missing":
            return f"; remove the ref: {at} update-ref -d {shlex.quote(ref)}"
        if kind != "commit":
            return ""
        for i, (commit, owner) in enumerate(self._owners(oid, 50)):
            if owner is None:
                continue
            if i and owner == name:
                return (
                    f"; commits were added on top of node {name}'s last commit {commit}: move the "
                    f"branch back to it ({at} branch -f {shlex.quote('poise/' + name)} {commit}; "
                    "the added commits stay in git reflog) and spawn the change as a new node"
                )
            if not i and owner != name and not self.exists(owner):
                return (
                    f"; a node branch renamed: rename it back ({at} branch -m "
                    f"{shlex.quote('poise/' + name)} {shlex.quote('poise/' + owner)})"
                )
            return ""
        return ""

    def _branch_tips(self) -> list[tuple[str, str, str, str]]:
        """``(ref, object id, object type, message)`` of every ref under refs/heads/poise/, in one
        ``for-each-ref``. git refuses to read any of them where one points to an object the
        repository lacks; then the refs and their objects are read apart (one ``for-each-ref``
        that reads no object, one ``cat-file --batch``), the type of such a ref ``missing``."""
        fmt = "%(refname)%1f%(objectname)%1f%(objecttype)%1f%(contents)%1e"
        try:
            out = self.git.text("for-each-ref", f"--format={fmt}", REF_PREFIX)
        except GitError:
            out = None
        if out is not None:
            recs = (rec.lstrip("\n") for rec in out.split("\x1e"))
            return [tuple(rec.split("\x1f", 3)) for rec in recs if rec]  # type: ignore[misc]
        out = self.git.text("for-each-ref", "--format=%(refname)%1f%(objectname)", REF_PREFIX)
        refs = [line.split("\x1f", 1) for line in out.splitlines() if line]
        tips = []
        for (ref, oid), obj in zip(refs, self.git.cat_objects([oid for _, oid in refs])):
            if obj is None:
                tips.append((ref, oid, "missing", ""))
                continue
            kind, raw = obj[1], obj[2]
            msg = raw.split(b"\n\n", 1)[1] if kind in ("commit", "tag") and b"\n\n" in raw else b""
            tips.append((ref, oid, kind, msg.decode("utf-8", "replace")))
        return tips

    def protocol_ref(self, protocol: ProtocolRef | str | None = None) -> ProtocolRef:
        """The protocol ``protocol`` names (a :class:`ProtocolRef`, ``id`` or ``id@hash``), else the
        experiment's configured one: the protocol :meth:`nodes` compares results under."""
        return named_protocol(protocol) or configured_protocol(self.config())

    def node(self, name: str) -> Node:
        nodes = self.nodes()
        if name not in nodes:
            ref = REF_PREFIX + name
            if ref in self.skipped:  # its branch is there, edited into no node's: say so, and how
                oid = self.git.run("rev-parse", "-q", "--verify", ref, check=False).decode().strip()
                kind = (
                    self.git.run("cat-file", "-t", oid or "0", check=False).decode().strip()
                    or "missing"
                )
                raise ArchiveError(
                    f"unknown node {name!r}: its branch {ref} is ignored, "
                    f"{self.skipped[ref]}{self._repair(ref, oid, kind)}"
                )
            raise ArchiveError(f"unknown node {name!r}" + _did_you_mean(name, nodes))
        return nodes[name]

    def exists(self, name: str) -> bool:
        return self.git.ok("rev-parse", "--verify", "-q", REF_PREFIX + name)

    def tip(self, name: str) -> str:
        try:
            return self.git.text(
                "rev-parse", "--verify", "-q", REF_PREFIX + name + "^{commit}"
            ).strip()
        except GitError:
            raise ArchiveError(
                f"unknown node {name!r}" + _did_you_mean(name, self.nodes())
            ) from None

    def parents(self, name: str) -> list[str]:
        return list(self.node(name).parents)

    def children(self, name: str) -> list[str]:
        nodes = self.nodes()
        if name not in nodes:
            raise ArchiveError(f"unknown node {name!r}")
        return sorted(
            (n.name for n in nodes.values() if name in n.parents), key=lambda c: nodes[c].created
        )

    def descendants(self, name: str, nodes: dict[str, Node] | None = None) -> dict[str, int]:
        """``{descendant: generations below name}`` (shortest path), over an already-read lineage."""
        nodes = nodes if nodes is not None else self.nodes()
        kids: dict[str, list[str]] = {}
        for n in nodes.values():
            for p in n.parents:
                kids.setdefault(p, []).append(n.name)
        out: dict[str, int] = {}
        frontier, depth = [name], 0
        while frontier:
            depth += 1
            nxt = []
            for f in frontier:
                for c in kids.get(f, []):
                    if c not in out:
                        out[c] = depth
                        nxt.append(c)
            frontier = nxt
        return out

    def read_file(self, name: str, path: str, commit: str | None = None) -> str | None:
        """A file of the node's tip (or of ``commit``), or None when absent."""
        rev = commit or self.tip(name)
        blob = self.git.cat_blobs([f"{rev}:{path}"])[0]
        return None if blob is None else blob.decode("utf-8", "replace")

    def algorithm(self, name: str) -> str:
        src = self.read_file(name, ALGORITHM)
        if src is None:
            raise ArchiveError(f"node {name!r} has no {ALGORITHM}")
        return src

    def root(self) -> str:
        """The root node's name: the node whose commit is the archive's ``init`` (``grpo``, or the
        name ``poise-git init --root`` gave it; a later node named ``grpo`` is not the root; the
        oldest, where branches of another archive were fetched into this one), read
        from git alone (no :meth:`nodes`, which needs the root's configuration) and once per
        handle. ``grpo`` where no branch holds an init commit but that branch exists.

        :data:`ROOT_REF` names the init commit: where the branch of the node it names still holds
        it, that node is the root (one object read and one ancestry check, whatever the archive's
        size); else the roots of every branch's history are read (a walk of the whole lineage),
        and the init found is recorded there for the next handle."""
        if self._root is not None:
            return self._root
        name = self._root_from_ref()
        if name is not None:
            self._root = name
            return name
        # oldest first: archives fetched into this one bring their own inits
        args = ("log", "--reverse", "--max-parents=0", "--format=%H%x1f%B%x1e")
        try:
            out = self.git.text(*args, f"--glob={REF_PREFIX}*")
        except GitError:  # a ref to an object the repository lacks: from the readable commits
            tips = [oid for _ref, oid, kind, _msg in self._branch_tips() if kind == "commit"]
            out = self.git.text(*args, "--stdin", input="".join(t + "\n" for t in tips).encode())
        for rec in out.split("\x1e"):
            commit, _, msg = rec.strip("\n").partition("\x1f")
            tr = parse_trailers(msg)
            name = tr.get("Poise-Node", [None])[-1]
            if "init" in tr.get("Poise-Event", []) and name and self.exists(name):
                self._root = name
                if self.git.ok("merge-base", "--is-ancestor", commit, REF_PREFIX + name):
                    self.git.update_ref(ROOT_REF, commit, self._root_hint, "poise root")
                return name
        if self.exists(ROOT_NAME):
            return ROOT_NAME
        raise ArchiveError(f"{self.path}: no root node (no poise/* branch holds the init commit)")

    def _root_from_ref(self) -> str | None:
        """The node :data:`ROOT_REF` names where it is an init commit its node's branch still holds
        (else None: the root is looked for in the lineage)."""
        obj = self.git.cat_objects([ROOT_REF])[0]
        self._root_hint = None if obj is None else obj[0]  # what a repair compares and swaps
        if obj is None or obj[1] != "commit":
            return None
        head, _, msg = obj[2].partition(b"\n\n")
        if b"\nparent " in b"\n" + head:
            return None
        tr = parse_trailers(msg.decode("utf-8", "replace"))
        name = (tr.get("Poise-Node") or [None])[-1]
        if "init" not in tr.get("Poise-Event", []) or not name or not _NAME_RE.match(name):
            return None
        if not self.git.ok("merge-base", "--is-ancestor", obj[0], REF_PREFIX + name):
            return None
        return name

    def config_text(self, name: str | None = None) -> str:
        return self.read_file(name or self.root(), "poise.toml") or ""

    def config(self, name: str | None = None):
        text = self.config_text(name)
        if name is None:
            self._warn_edited_config(text)
        return parse_config(text)

    def _warn_edited_config(self, text: str) -> None:
        """Warn, once per archive and process, where the directory's ``poise.toml`` (a view of the
        root as created) was edited: the root node's file is the one read, so the edit does nothing."""
        if self.path in _WARNED_CONFIG:
            return
        _WARNED_CONFIG.add(self.path)
        try:
            here = (self.path / "poise.toml").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return
        if here != text:
            log.warning(
                "%s/poise.toml differs from the root node's poise.toml and is not read: the settings "
                "are the root's, fixed at init (command-line options override them per command; "
                "other settings need a new archive: poise-git init DIR --config FILE)",
                self.path,
            )

    def spawn_commit(self, name: str) -> str:
        """The commit that created the node (its first commit with Poise-Event: spawn/init)."""
        out = self.git.text("log", "--format=%H%x1f%B%x1e", REF_PREFIX + name)
        first = None
        for rec in out.split("\x1e"):
            rec = rec.strip("\n")
            if not rec:
                continue
            oid, msg = rec.split("\x1f", 1)
            tr = parse_trailers(msg)
            if tr.get("Poise-Node", [None])[-1] != name:
                break
            first = oid
        return first or self.tip(name)

    # -- writing -------------------------------------------------------------------------------
    def spawn(
        self,
        parent: str | Iterable[str],
        name: str,
        edit: str | None = None,
        *,
        algorithm: str | None = None,
        proposal: str | None = None,
        files: Mapping[str, str | bytes] | None = None,
        trailers: Mapping[str, str | list[str]] | None = None,
        status: str = "spawned",
        subject: str | None = None,
    ) -> Node:
        """Fork ``name`` off ``parent`` (a list for a crossover): apply ``edit`` (top-level definitions,
        LibCST) to the parent's algorithm.py, or take ``algorithm`` whole; commit it with plumbing and
        create the branch atomically. Writes nothing unless every check passes."""
        parents = [parent] if isinstance(parent, str) else list(parent)
        if not parents:
            raise ArchiveError("spawn needs a parent")
        check_name(name)
        if status not in STATUSES:
            raise ArchiveError(f"unknown status {status!r}")
        # One cat-file --batch resolves the parents, proves the name free and reads the parent's
        # root tree and algorithm.py (a spawn starts 2 git processes, commit-tree and update-ref,
        # and asks the handle's long-lived cat-file, hash-object and mktree).
        specs = [REF_PREFIX + p for p in parents] + [
            REF_PREFIX + name,
            REF_PREFIX + parents[0] + "^{tree}",
            REF_PREFIX + parents[0] + ":" + ALGORITHM,
        ]
        objs = self.git.cat_objects(specs)
        for p, obj in zip(parents, objs):
            if obj is None or obj[1] != "commit":
                raise ArchiveError(f"unknown parent node {p!r}")
        if objs[len(parents)] is not None:
            raise ArchiveError(f"a node named {name!r} already exists")
        parent_commits = [obj[0] for obj in objs[: len(parents)]]  # type: ignore[index]
        tree_obj, algo_obj = objs[-2], objs[-1]
        parent_src = algo_obj[2].decode("utf-8") if algo_obj is not None else ""
        if algorithm is not None:
            new_src = algorithm
        elif edit is not None:
            new_src = apply_edit(parent_src, edit)
        else:
            new_src = parent_src
        check_interface(parent_src, new_src)
        tree_files = parse_tree(tree_obj[2]) if tree_obj else {}
        for path in list(tree_files):
            if path in NODE_FILES or path + "/" in NODE_DIRS:
                del tree_files[path]
        nested = {p.split("/", 1)[0] for p in (files or {}) if "/" in _clean_path(p)}
        if nested & set(tree_files):  # adding into an inherited directory: expand the full listing
            tree_files = {
                p: v
                for p, v in self.git.ls_tree(parent_commits[0]).items()
                if p not in NODE_FILES and not p.startswith(NODE_DIRS)
            }
        new_files: dict[str, bytes] = {ALGORITHM: new_src.encode("utf-8")}
        if proposal is not None:
            new_files[PROPOSAL] = proposal.encode("utf-8")
        for path, data in (files or {}).items():
            new_files[_clean_path(path)] = data.encode("utf-8") if isinstance(data, str) else data
        self._write_files(tree_files, new_files)
        tree = self.git.write_tree(tree_files)
        extra = {k: ([v] if isinstance(v, str) else list(v)) for k, v in (trailers or {}).items()}
        extra.setdefault("Poise-Event", ["spawn"])
        _set_mechanism(extra, new_src)
        title = subject or f"poise: spawn {name} from {' + '.join(parents)}"
        body = _first_line(proposal) if proposal else ""
        created = time.time()
        msg = _message(title, body, name, parents, status, created, extra)
        commit = self.git.commit_tree(tree, parent_commits, msg)
        if not self.git.update_ref(REF_PREFIX + name, commit, None, f"poise spawn {name}"):
            raise ArchiveError(
                self._stale_lock(REF_PREFIX + name)
                or f"a node named {name!r} already exists (created concurrently)"
            )
        self._remember(commit, msg, None if _ids_of(parse_trailers(msg)) else ())
        log.info("spawned %s from %s (%s)", name, " + ".join(parents), commit[:12])
        # Built locally: a full lineage read here would cost ~0.3 s at 10k nodes.
        return Node(
            name=name,
            commit=commit,
            parents=tuple(parents),
            status=status,
            created=created,
            trailers=parse_trailers(msg),
            subject=title,
        )

    def commit_files(
        self,
        name: str,
        files: Mapping[str, str | bytes | None],
        *,
        subject: str,
        status: str | None = None,
        trailers: Mapping[str, str | list[str]] | None = None,
        retries: int = 50,
    ) -> str:
        """Add a record commit on the node's branch (None deletes a path); compare-and-swap, retried."""
        ref = REF_PREFIX + name
        for attempt in range(retries):
            tip = self.tip(name)
            msg_old = self.git.text("cat-file", "commit", tip).split("\n\n", 1)[-1]
            tr = parse_trailers(msg_old)
            tree_files = self.git.ls_tree(tip)
            adds: dict[str, bytes] = {}
            for path, data in files.items():
                path = _clean_path(path)
                if data is None:
                    for p in [
                        p for p in tree_files if p == path or p.startswith(path.rstrip("/") + "/")
                    ]:
                        del tree_files[p]
                else:
                    adds[path] = data.encode("utf-8") if isinstance(data, str) else data
            self._write_files(tree_files, adds)
            tree = self.git.write_tree(tree_files)
            extra = {
                k: v
                for k, v in tr.items()
                if k
                not in (
                    "Poise-Node",
                    "Poise-Parent",
                    "Poise-Status",
                    "Poise-Created",
                    "Poise-Event",
                )
            }
            for k, v in (trailers or {}).items():
                extra[k] = [v] if isinstance(v, str) else list(v)
            if isinstance(files.get(ALGORITHM), (str, bytes)):
                algo = files[ALGORITHM]
                _set_mechanism(extra, algo.decode("utf-8") if isinstance(algo, bytes) else algo)
            if "Poise-Event" not in (trailers or {}):
                extra["Poise-Event"] = ["record"]
            msg = _message(
                subject,
                "",
                name,
                tuple(tr.get("Poise-Parent", [])),
                status or (tr.get("Poise-Status") or ["spawned"])[-1],
                float((tr.get("Poise-Created") or [time.time()])[-1]),
                extra,
            )
            commit = self.git.commit_tree(tree, [tip], msg)
            if self.git.update_ref(ref, commit, tip, f"poise record {name}"):
                self._remember(commit, msg, self._files_after(tip, msg, tree_files, adds))
                log.debug("%s: %s (%s)", name, subject, commit[:12])
                return commit
            time.sleep(min(0.005 * (attempt + 1), 0.1))
        raise ArchiveError(
            self._stale_lock(ref)
            or f"could not record on {name!r}: the branch kept moving (lost {retries} compare-and-swaps)"
        )

    def _files_after(
        self, tip: str, msg: str, tree: Mapping[str, tuple[str, str]], adds: Mapping[str, bytes]
    ) -> tuple | None:
        """The result files part of the lineage index entry of a record commit over ``tip`` with the
        message ``msg``, the files ``tree`` and the new contents ``adds``: files it wrote are parsed,
        files it kept come from ``tip``'s entry; None where that entry is not in this process's
        memory (the next lineage read reads it from git)."""
        old = self._index().memo.get(tip)
        owner = (parse_trailers(msg).get("Poise-Node") or [""])[-1]
        kept = {p: f for f in (old[7] if old is not None else ()) for p in (f[0],)}
        out = []
        for p in _paths_of(parse_trailers(msg)):
            if p not in tree:
                continue
            if p in adds:
                out += _read_files([(p, secrets.scrub_bytes(adds[p]))], owner)
            elif old is not None and p in kept:
                out.append(kept[p])
            else:
                return None
        return tuple(out)

    def _stale_lock(self, ref: str) -> str:
        """Why writing ``ref`` keeps failing when git's lock file for it is left behind (a writer
        killed in the middle of an update), else ``""``."""
        lock = Path(git_dir(self)) / f"{ref}.lock"  # refs live in the common directory
        if not lock.exists():
            return ""
        return (
            f"cannot write {ref}: git's lock file {lock} exists (a git process writing it was killed, "
            "or is still running); when no poise-git or git process is running on this archive, "
            "remove that file"
        )

    def record_result(
        self, name: str, result: EvaluationResult, *, status: str | None = None
    ) -> str:
        """The one writer of results: ``results/<protocol id>.json`` on the node's branch (replacing
        an earlier result under the same protocol), status ``evaluated`` | ``failed``.

        An ``evaluated`` result must contain the experiment's utility metric (``[experiment].objective``
        in poise.toml): a result the selection could not rank is refused here, not dropped later."""
        if not isinstance(result, EvaluationResult):
            raise ArchiveError("record_result takes an EvaluationResult")
        objective = self.config().experiment.objective
        if result.ok and objective not in result.metrics:
            raise ArchiveError(
                f"the result has no {objective!r}, the experiment's utility "
                f"(metrics: {', '.join(sorted(result.metrics)) or 'none'}); "
                "record it with that metric, or change [experiment].objective"
            )
        status = status or ("evaluated" if result.ok else "failed")
        if status not in STATUSES:
            raise ArchiveError(f"unknown status {status!r}")
        node = self.node(name)
        ids = set(_result_ids(node)) | {result.protocol.id}
        extra: dict[str, str | list[str]] = {
            "Poise-Results": ",".join(sorted(ids)),
            "Poise-Event": "results",
        }
        old = node.results.get(result.protocol.id)
        if not result.ok:
            extra["Poise-Reason"] = _reason(result)
        elif old is not None and not old.ok and node.trailer("Poise-Reason") == _reason(old):
            extra["Poise-Reason"] = []  # the failure this success replaces: its reason goes too
        return self.commit_files(
            name,
            {result.protocol.path: result.to_json()},
            subject=f"poise: results for {name} ({result.protocol.id})",
            status=status,
            trailers=extra,
        )

    def drop_result(self, name: str, protocol_id: str, why: str) -> str | None:
        """Remove the node's result under ``protocol_id`` in one record commit saying ``why``, its
        status kept (None when it holds none): for a result a later one supersedes under another id
        (a verl training failure once a later training's checkpoint is scored). The node's
        ``Poise-Reason`` goes with it when it is that result's reason."""
        node = self.node(name)
        ids = _result_ids(node)
        old = node.results.get(protocol_id)
        if protocol_id not in ids or old is None:
            return None
        rest = sorted(i for i in ids if i != protocol_id)
        trailers: dict[str, str | list[str]] = {
            "Poise-Results": ",".join(rest) if rest else [],
            "Poise-Event": "results",
        }
        if old.reason and node.trailer("Poise-Reason") == _reason(old):
            trailers["Poise-Reason"] = []
        return self.commit_files(
            name,
            {f"{RESULTS_DIR}/{protocol_id}.json": None},
            subject=f"poise: result of {name} under {protocol_id} removed: {why}",
            trailers=trailers,
        )

    def record_reflection(self, name: str, text: str) -> str:
        return self.commit_files(
            name,
            {REFLECTION: text},
            subject=f"poise: reflection on {name}",
            trailers={"Poise-Event": "reflection"},
        )

    def set_status(
        self,
        name: str,
        status: str,
        reason: str | None = None,
        files: Mapping[str, str | bytes | None] | None = None,
    ) -> str:
        if status not in STATUSES:
            raise ArchiveError(f"unknown status {status!r}")
        tr: dict[str, str] = {"Poise-Event": status}
        if reason:
            tr["Poise-Reason"] = " ".join(reason.split())[:300]
        return self.commit_files(
            name, dict(files or {}), subject=f"poise: {name} {status}", status=status, trailers=tr
        )

    def diff(
        self,
        a: str,
        b: str,
        paths: list[str] | None = None,
        stat: bool = False,
        written_only: bool = False,
    ) -> str:
        """``git diff`` of the two nodes' tips; ``written_only``: the files ``b`` adds or changes
        (what a spawn wrote), not those of ``a`` it lacks (a parent's records it never inherits)."""
        args = ["diff", "--no-color"]
        if stat:
            args.append("--stat")
        if written_only:
            args += ["--no-renames", "--diff-filter=d"]
        args += [self.tip(a), self.tip(b)]
        if paths:
            args += ["--", *paths]
        return self.git.text(*args)

    def _owners(self, rev: str, limit: int | None = None) -> list[tuple[str, str | None]]:
        """(commit, the node its ``Poise-Node`` trailer names, or None) of ``rev``'s history, newest
        first, at most ``limit`` commits; [] where git cannot read it."""
        args = ["log", *(["-n", str(limit)] if limit else []), "--format=%H%x00%B%x01", rev, "--"]
        out = self.git.run(*args, check=False).decode("utf-8", "replace")
        return [
            (commit, (parse_trailers(msg).get("Poise-Node") or [None])[-1])
            for commit, _, msg in (e.strip().partition("\x00") for e in out.split("\x01"))
            if commit
        ]

    def parent_diff(self, name: str, paths: list[str] | None = None) -> tuple[str, str]:
        """(the diff of ``name`` against its first parent, what it was taken against): the parent's
        branch where it is a node; where that branch was deleted or edited into no node's, the
        parent's last commit in ``name``'s own history (the state it was forked from)."""
        nodes = self.nodes()
        node = nodes.get(name) or self.node(name)
        parent = node.parent
        if parent is None:
            raise ArchiveError(f"node {name!r} has no parent")
        if parent in nodes:
            base, against = nodes[parent].commit, parent
        else:
            base = next((c for c, owner in self._owners(node.commit) if owner == parent), None)
            if base is None:
                raise ArchiveError(
                    f"node {name!r}'s parent {parent!r} has no branch and is not in its history"
                )
            branch = "is no node's (edited by hand)" if self.exists(parent) else "is gone"
            against = f"{parent} as {name} was forked from it ({base[:12]}; its branch {branch})"
        args = ["diff", "--no-color", base, node.commit] + (["--", *paths] if paths else [])
        return self.git.text(*args), against

    def maintain(self) -> None:
        """Pack refs and let git gc decide (plumbing writes never trigger auto-gc): keeps reads fast."""
        self.git.run("pack-refs", "--all")
        self.git.run("gc", "--auto", "--quiet", check=False)

    def fsck(self) -> bool:
        return self.git.ok("fsck", "--no-progress", "--strict")

    def _write_files(
        self, tree_files: dict[str, tuple[str, str]], new_files: Mapping[str, bytes]
    ) -> None:
        names = list(new_files)
        for n, oid in zip(names, self.git.write_blobs([new_files[n] for n in names])):
            tree_files[n] = ("100644", oid)


def _detach_checkout(git: Git, commit: str) -> None:
    """Check ``commit`` out detached (HEAD, index and work tree): records move the node branches with
    plumbing and never this checkout, so the work tree stays clean."""
    git.run("update-ref", "--no-deref", "HEAD", commit)
    git.run("read-tree", "-u", "--reset", commit)


def _set_mechanism(extra: dict[str, list[str]], source: str) -> dict[str, list[str]]:
    """Record the mechanism hash of ``source`` (the trailer ``Poise-Mechanism``) in ``extra``."""
    h = mechanism_hash(source)
    extra[MECHANISM_TRAILER] = [h] if h else []
    return extra


def _result_ids(node: Node) -> list[str]:
    """Protocol ids the node's ``Poise-Results`` trailer lists (``yes``: a schema-1 results.json)."""
    return _ids_of(node.trailers)


def _ids_of(trailers: Mapping[str, list[str]]) -> list[str]:
    value = (trailers.get("Poise-Results") or [""])[-1]
    return [v.strip() for v in value.split(",") if v.strip()]


def _paths_of(trailers: Mapping[str, list[str]]) -> list[str]:
    """The result files a commit's trailers list, a legacy results.json first (a typed result under
    the same protocol, read after it, replaces it)."""
    ids = _ids_of(trailers)
    return [LEGACY_FILE] * ("yes" in ids) + [f"{RESULTS_DIR}/{i}.json" for i in ids if i != "yes"]


def check_name(name: str) -> None:
    """Refuse names outside ``[A-Za-z0-9._-]`` and git's ref rules (stricter than check-ref-format)."""
    if (
        not isinstance(name, str)
        or not _NAME_RE.match(name)
        or name.endswith((".lock", "."))
        or ".." in name
    ):
        raise ArchiveError(
            f"invalid node name {name!r}: use letters, digits, '.', '_' and '-' (git refuses this name)"
        )


def _clean_path(path: str) -> str:
    p = path.replace("\\", "/").strip("/")
    if not p or any(part in ("", ".", "..", ".git") for part in p.split("/")):
        raise ArchiveError(f"bad file path {path!r} for a node")
    return p


def _first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        line = line.strip().lstrip("#").strip()
        if line:
            return line[:200]
    return ""


def _message(
    title: str,
    body: str,
    name: str,
    parents: Iterable[str],
    status: str,
    created: float,
    extra: Mapping[str, list[str]],
) -> str:
    lines = [title.strip().splitlines()[0] if title.strip() else f"poise: {name}", ""]
    if body:
        lines += [body.replace("Poise-", "Poise "), ""]
    lines.append(f"Poise-Node: {name}")
    lines += [f"Poise-Parent: {p}" for p in parents]
    lines.append(f"Poise-Status: {status}")
    lines.append(f"Poise-Created: {created:.6f}")
    for key, values in extra.items():
        for v in values:
            lines.append(f"{key}: {' '.join(str(v).split())}")
    return "\n".join(lines) + "\n"


def _parent_cycles(nodes: dict[str, Node]) -> dict[str, list[str]]:
    """``{node: the cycle through it}`` for every node on a cycle of parent links (a pushed branch
    naming itself or a descendant as its parent): such nodes have no root, no depth, no lineage."""
    # grounded: every parent grounded or no node (Kahn's order over parent links, one pass)
    kids: dict[str, list[str]] = {}
    waiting: dict[str, int] = {}
    ready = []
    for name, n in nodes.items():
        inside = {p for p in n.parents if p in nodes}
        for p in inside:
            kids.setdefault(p, []).append(name)
        if inside:
            waiting[name] = len(inside)
        else:
            ready.append(name)
    grounded: set[str] = set()
    while ready:
        name = ready.pop()
        grounded.add(name)
        for c in kids.get(name, ()):
            waiting[c] -= 1
            if not waiting[c]:
                ready.append(c)
    out: dict[str, list[str]] = {}
    for start in (n for n in nodes if n not in grounded):
        path, stack, seen = {start: [start]}, [start], {start}
        while stack and start not in out:  # a path from start back to itself, over parents
            cur = stack.pop()
            for p in nodes[cur].parents:
                if p == start:
                    out[start] = path[cur] + [start]
                    break
                if p in nodes and p not in grounded and p not in seen:
                    seen.add(p)
                    path[p] = path[cur] + [p]
                    stack.append(p)
    return out


Lineage = tuple[dict[str, tuple[tuple[str, ...], int]], frozenset[str]]
"""The depths of one lineage (node name -> (its parents, its depth)) and the parent names its
nodes list that are no node of it: what :func:`_depths` starts the next read from."""


def _depths(nodes: dict[str, Node], base: Lineage | None) -> Lineage | None:
    """Each node's ``depth`` (as :func:`_assign_depths` assigns it), and the lineage to start the
    next read from (None where it has a cycle). From ``base`` where it still holds: no node of it
    gone, none with other parents, no node added under a name its nodes list as a parent; then
    only the added nodes' depths are computed (each one more than its shallowest parent's), the
    others taken as they were. Else one pass over all."""
    if base is not None:
        known, dangling = base
        added: list[Node] = []
        get = known.get
        for name, n in nodes.items():
            was = get(name)
            if was is None:
                added.append(n)
            elif was[0] is n.parents or was[0] == n.parents:
                n.depth = was[1]
            else:
                break
        else:
            if len(nodes) - len(added) == len(known) and not any(n.name in dangling for n in added):
                if not added:
                    return base
                grown = _add_depths(nodes, added, base)
                if grown is not None:
                    return grown
    if not _assign_depths(nodes):
        return None
    known = {name: (n.parents, n.depth) for name, n in nodes.items()}
    return known, frozenset(p for n in nodes.values() for p in n.parents if p not in nodes)


def _add_depths(nodes: dict[str, Node], added: list[Node], base: Lineage) -> Lineage | None:
    """The depths of ``added``, nodes new to the lineage ``base`` (whose nodes' depths they cannot
    change): parents before children among them (Kahn's order); None where they form a cycle."""
    known, dangling = base
    new = {n.name for n in added}
    kids: dict[str, list[Node]] = {}
    waiting: dict[str, int] = {}
    ready: list[Node] = []
    for n in added:
        k = 0
        for p in set(n.parents):
            if p in new:
                k += 1
                kids.setdefault(p, []).append(n)
        if k:
            waiting[n.name] = k
        else:
            ready.append(n)
    done = 0
    grown = dict(known)
    while ready:
        n = ready.pop()
        done += 1
        if n.parents:
            n.depth = 1 + min([grown[p][1] if p in grown else 0 for p in n.parents])
        else:
            n.depth = 0
        grown[n.name] = (n.parents, n.depth)
        for c in kids.get(n.name, ()):
            waiting[c.name] -= 1
            if not waiting[c.name]:
                ready.append(c)
    if done < len(added):
        return None
    more = {p for n in added for p in n.parents if p not in nodes}
    return grown, (dangling | more) if more else dangling


def _assign_depths(nodes: dict[str, Node]) -> bool:
    """Each node's ``depth``: 0 without parents, else one more than its shallowest parent's (a
    parent that is no node counts 0). Parents before children in one pass (Kahn's order); a lineage
    with a cycle (branches edited by hand) goes to :func:`_assign_depths_cyclic`. Whether there
    was none."""
    kids: dict[str, list[str]] = {}
    waiting: dict[str, int] = {}
    ready: list[str] = []
    for name, n in nodes.items():
        k = 0
        for p in set(n.parents):
            if p in nodes:
                k += 1
                if p in kids:
                    kids[p].append(name)
                else:
                    kids[p] = [name]
        if k:
            waiting[name] = k
        else:
            ready.append(name)
    depth: dict[str, int] = {}
    get = depth.get
    while ready:
        name = ready.pop()
        parents = nodes[name].parents
        if not parents:
            depth[name] = 0
        elif len(parents) == 1:
            depth[name] = 1 + get(parents[0], 0)
        else:
            depth[name] = 1 + min([get(p, 0) for p in parents])
        for c in kids.get(name, ()):
            waiting[c] -= 1
            if not waiting[c]:
                ready.append(c)
    if len(depth) < len(nodes):
        _assign_depths_cyclic(nodes)
        return False
    for name, n in nodes.items():
        n.depth = depth[name]
    return True


def _assign_depths_cyclic(nodes: dict[str, Node]) -> None:
    memo: dict[str, int] = {}

    def depth(name: str, seen: frozenset = frozenset()) -> int:
        if name in memo:
            return memo[name]
        n = nodes.get(name)
        if n is None or not n.parents or name in seen:
            memo[name] = 0
            return 0
        d = 1 + min(depth(p, seen | {name}) for p in n.parents)
        memo[name] = d
        return d

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))
    for name in nodes:
        nodes[name].depth = depth(name)


def _did_you_mean(name: str, nodes: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(nodes), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _reason(result: EvaluationResult) -> str:
    """A failed result's reason as its node's ``Poise-Reason`` trailer holds it."""
    return " ".join(result.reason.split())[:300]
