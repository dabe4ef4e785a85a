"""What a run has done, read back from git — the only place it lives (besides MLflow).

- Node state is the nodes' own trailers: ``Poise-Status``, ``Poise-Round``, ``Poise-Run``. The pending
  work after a crash is derived from it: ``spawned`` -> verify; ``verified``/``evaluating`` without
  results -> evaluate; ``evaluated`` without REFLECTION.md -> reflect.
- The run's plan (rounds, parents, population, objective, budgets), each round's selection, the parents
  whose proposals are done, and the usage so far are a small JSON record committed on the ref
  ``refs/poise/run`` (one commit per update, compare-and-swap; ``git log refs/poise/run`` is the run's
  history). It holds no node state, so it cannot disagree with the nodes.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from engine.archive.locks import git_dir, held
from engine.archive.store import REFLECTION, Archive, Node
from engine.errors import PoiseError
from engine.operators.verify import is_template

RUN_REF = "refs/poise/run"
RUN_FILE = "run.json"
RUN_LOCK = "poise-run.lock"
"""the file in the archive's git directory whose lock a running ``poise-git run`` holds"""


class RunStateError(PoiseError):
    """The run record cannot be read or was changed by another process."""


@dataclass
class RunRecord:
    data: dict[str, Any]
    commit: str | None = None

    @property
    def id(self) -> str:
        return self.data["id"]

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


def load_run(archive: Archive) -> RunRecord | None:
    """The latest run record, or None when no run ever started in this archive."""
    if not archive.git.ok("rev-parse", "--verify", "-q", RUN_REF):
        return None
    commit = archive.git.text("rev-parse", "--verify", RUN_REF).strip()
    blob = archive.git.cat_blobs([f"{commit}:{RUN_FILE}"])[0]
    if blob is None:
        raise RunStateError(f"{RUN_REF} has no {RUN_FILE}; the run record is damaged")
    try:
        data = json.loads(blob)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise RunStateError(f"{RUN_REF}:{RUN_FILE} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("id"), str):
        raise RunStateError(f"{RUN_REF}:{RUN_FILE} is not a run record (an object with an id)")
    return RunRecord(data, commit)


def save_run(archive: Archive, rec: RunRecord, subject: str) -> RunRecord:
    """Commit the record on ``refs/poise/run`` (compare-and-swap against the commit it was read from)."""
    text = json.dumps(rec.data, indent=2, sort_keys=True) + "\n"
    oid = archive.git.write_blobs([text.encode()])[0]
    tree = archive.git.write_tree({RUN_FILE: ("100644", oid)})
    msg = f"{subject}\n\nPoise-Run: {rec.id}\nPoise-Event: run\n"
    commit = archive.git.commit_tree(tree, [rec.commit] if rec.commit else [], msg)
    if not archive.git.update_ref(RUN_REF, commit, rec.commit, f"poise run {rec.id}"):
        raise RunStateError(
            "another `poise-git run` is writing this archive (the run record moved); stop it first"
        )
    rec.commit = commit
    return rec


def run_lock(archive: Archive) -> AbstractContextManager[bool]:
    """Held for as long as a ``poise-git run`` runs in ``archive``, so that a second one (``--resume``
    included) is refused at once instead of taking the run record over from the first. The kernel
    releases the lock when the process ends, however it ends: a killed run never leaves it held."""
    return held(
        os.path.join(git_dir(archive), RUN_LOCK),
        lambda holder: RunStateError(
            f"another `poise-git run` is running in this archive ({holder}); wait for it to "
            "finish, or stop it (Ctrl-C) and continue with `poise-git run --resume`"
        ),
    )


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def node_round(node: Node) -> int | None:
    v = node.trailer("Poise-Round")
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def last_round(nodes: dict[str, Node]) -> int:
    """The highest ``Poise-Round`` in the archive (0 when no loop ever spawned a child)."""
    return max((r for r in (node_round(n) for n in nodes.values()) if r is not None), default=0)


def run_nodes(nodes: dict[str, Node], run_id: str) -> dict[str, Node]:
    return {k: n for k, n in nodes.items() if n.trailer("Poise-Run") == run_id}


@dataclass
class Pending:
    """Work a crash left behind, by the stage that finishes it."""

    verify: list[str] = field(default_factory=list)
    evaluate: list[str] = field(default_factory=list)
    reflect: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.verify or self.evaluate or self.reflect)

    def count(self) -> int:
        return len(self.verify) + len(self.evaluate) + len(self.reflect)


def pending_work(archive: Archive, nodes: dict[str, Node]) -> Pending:
    """Unfinished loop nodes (those with a ``Poise-Round``) and the root (verified first unless it is
    the shipped template or a published mechanism): a node needs evaluation when
    ``nodes`` (read under the run's protocol) holds no result for it, even if it was evaluated under
    another protocol or preset."""
    out = Pending()
    ours = [
        n
        for n in nodes.values()
        if node_round(n) is not None or not n.parents  # the root, whatever its name
    ]
    ours.sort(key=lambda n: (n.depth, n.created))
    evaluated = []
    for n in ours:
        if n.status == "spawned":
            if n.parents or not is_template(archive.algorithm(n.name)):
                out.verify.append(n.name)  # a root of your own code (`init --root`) is verified too
            else:
                out.evaluate.append(n.name)  # the root is the template: nothing to verify
        elif n.status in ("verified", "evaluating", "evaluated") and n.result is None:
            out.evaluate.append(n.name)  # no result under the run's protocol (e.g. another preset)
        elif n.status == "evaluated" and n.parents:
            evaluated.append(n)
    if evaluated:
        blobs = archive.git.cat_blobs([f"{n.commit}:{REFLECTION}" for n in evaluated])
        out.reflect = [n.name for n, b in zip(evaluated, blobs) if b is None]
    return out
