"""A held-out confirmation: a comparison the search made, measured again on seeds it never saw.

The search picks its best node on the seeds it evaluated every node at, so the paired difference it
reads there leans optimistic (the winner's curse: among many noisy candidates the luckiest wins). A
confirmation trains and scores the node and the node it is compared with (the root, by default) on
fresh seeds, disjoint from every seed the search used under that protocol, and keeps the paired
difference they show there. It lives beside the node's results, as ``confirmations/<protocol
id>.json`` on the node's branch, and nothing that selects or ranks reads it: seeds the selection
never saw stay unseen by it.

Every number in it is measured on the trusted side (``engine.operators.evaluate.measure_node``); the
type refuses a record whose held-out seeds overlap the search's, and one whose paired difference does
not follow from its own per-seed values.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.archive.results import Protocol, ProtocolRef, is_finite_number, now
from engine.errors import ArchiveError
from engine.stats import paired_interval

CONFIRMATION_SCHEMA = "poise.confirmation/1"
CONFIRMATIONS_DIR = "confirmations"
CONFIRMED, NOT_CONFIRMED, REVERSED, UNRESOLVED, FAILED = (
    "confirmed",
    "not confirmed",
    "reversed",
    "no interval",
    "failed",
)
VERDICTS = (CONFIRMED, NOT_CONFIRMED, REVERSED, UNRESOLVED, FAILED)
_TOL = 1e-9


def verdict_of(mean: float, interval: tuple[float, float] | None) -> str:
    """``confirmed`` when the held-out interval lies wholly above zero, ``reversed`` when wholly below,
    ``not confirmed`` when it holds zero, ``no interval`` from a single seed."""
    if interval is None:
        return UNRESOLVED
    if interval[0] > 0:
        return CONFIRMED
    if interval[1] < 0:
        return REVERSED
    return NOT_CONFIRMED


@dataclass(frozen=True)
class Confirmation:
    """``node`` against ``against`` under ``protocol``, at held-out ``seeds``.

    values / reference: seed -> the objective's value (U) of ``node`` / ``against`` at that seed.
    search_seeds:       every seed the search evaluated under the protocol (the held-out seeds avoid
                        them all); search_difference: (mean, 95% interval or None, seeds) of the
                        paired difference the search itself read, for comparison.
    """

    protocol: Protocol
    node: str
    against: str
    node_commit: str
    against_commit: str
    objective: str
    seeds: tuple[int, ...]
    search_seeds: tuple[int, ...]
    values: Mapping[int, float] = field(default_factory=dict)
    reference: Mapping[int, float] = field(default_factory=dict)
    difference: float | None = None
    interval: tuple[float, float] | None = None
    verdict: str = UNRESOLVED
    search_difference: tuple[float, tuple[float, float] | None, int] | None = None
    reason: str = ""
    mlflow_run_ids: tuple[str, ...] = ()
    wall_time_s: float = 0.0
    recorded_at: float = 0.0

    def __post_init__(self) -> None:
        def check(ok: bool, msg: str) -> None:
            if not ok:
                raise ArchiveError(f"confirmation of {self.node} vs {self.against}: {msg}")

        check(self.node != self.against, "a node cannot be confirmed against itself")
        check(bool(self.seeds), "it needs held-out seeds")
        check(
            all(isinstance(s, int) and s >= 0 for s in (*self.seeds, *self.search_seeds)),
            f"bad seeds {self.seeds!r} / {self.search_seeds!r}",
        )
        shared = sorted(set(self.seeds) & set(self.search_seeds))
        check(not shared, f"seeds {shared} were seen by the search: they are not held out")
        check(self.verdict in VERDICTS, f"unknown verdict {self.verdict!r}")
        for what, vals in (("values", self.values), ("reference", self.reference)):
            for s, v in vals.items():
                check(s in self.seeds, f"{what} at seed {s}, which is not a held-out seed")
                check(is_finite_number(v), f"{what} at seed {s} must be a finite number, got {v!r}")
        sd = self.search_difference
        check(
            sd is None
            or (
                len(sd) == 3
                and is_finite_number(sd[0])
                and (sd[1] is None or (len(sd[1]) == 2 and all(is_finite_number(x) for x in sd[1])))
                and isinstance(sd[2], int)
                and not isinstance(sd[2], bool)
                and sd[2] >= 0
            ),
            f"search_difference must be (mean, [low, high] or None, seeds), got {sd!r}"[:300],
        )
        if self.verdict == FAILED:
            check(bool(self.reason), "a failed confirmation must say why (reason)")
            return
        d = paired_interval(dict(self.values), dict(self.reference))
        check(d is not None and d[2] == len(self.seeds), "every held-out seed needs both values")
        mean, iv, _ = d
        check(
            self.difference is not None and abs(self.difference - mean) <= _TOL,
            f"difference {self.difference!r} is not the per-seed values' ({mean!r})",
        )
        got = None if self.interval is None else tuple(float(x) for x in self.interval)
        check(
            (got is None) == (iv is None)
            and (got is None or all(abs(a - b) <= _TOL for a, b in zip(got, iv))),
            f"interval {got!r} is not the per-seed values' ({iv!r})",
        )
        check(
            self.verdict == verdict_of(mean, got),
            f"verdict {self.verdict!r} does not follow from {mean:+.4f} {got}",
        )

    @classmethod
    def measured(
        cls,
        *,
        values: Mapping[int, float],
        reference: Mapping[int, float],
        **kw: Any,
    ) -> Confirmation:
        """The record of two measurements: difference, interval and verdict follow from the values."""
        mean, iv, _ = paired_interval(dict(values), dict(reference)) or (None, None, 0)
        interval = tuple(iv) if iv else None
        return cls(
            values=dict(values),
            reference=dict(reference),
            difference=mean,
            interval=interval,
            verdict=verdict_of(mean, interval) if mean is not None else UNRESOLVED,
            recorded_at=now(),
            **kw,
        )

    @property
    def path(self) -> str:
        return f"{CONFIRMATIONS_DIR}/{self.protocol.id}.json"

    def describe(self, with_protocol: bool = False) -> str:
        """One line: the verdict, the held-out difference with its interval, and the search's; with
        ``with_protocol``, the protocol the seeds were measured under (where no heading names it)."""
        head = f"{self.node} vs {self.against} on {len(self.seeds)} held-out seed(s) {list(self.seeds)}"
        if with_protocol:
            head += f" under {self.protocol.key}"
        if self.verdict == FAILED:
            return f"{head}: failed ({self.reason})"
        iv = f" [{self.interval[0]:+.4f}, {self.interval[1]:+.4f}]" if self.interval else ""
        line = f"{head}: {self.verdict}, {self.difference:+.4f}{iv}"
        if self.search_difference is not None:
            m, siv, n = self.search_difference
            s_iv = f" [{siv[0]:+.4f}, {siv[1]:+.4f}]" if siv else ""
            line += f" (the search read {m:+.4f}{s_iv} over its {n} seed(s))"
        return line

    # -- (de)serialization ---------------------------------------------------------------------
    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["schema"] = CONFIRMATION_SCHEMA
        d["values"] = {str(k): v for k, v in self.values.items()}
        d["reference"] = {str(k): v for k, v in self.reference.items()}
        try:
            return json.dumps(d, indent=2, sort_keys=True, allow_nan=False) + "\n"
        except ValueError as exc:
            raise ArchiveError(f"confirmation of {self.node}: {exc}") from None

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "") -> Confirmation:
        try:
            d = json.loads(text)
            if not isinstance(d, dict) or d.get("schema") != CONFIRMATION_SCHEMA:
                raise ArchiveError(f"not a {CONFIRMATION_SCHEMA} record")
            p = d["protocol"]
            known = {f.name for f in dataclasses.fields(cls)}
            kw = {k: v for k, v in d.items() if k in known}
            kw["protocol"] = Protocol.from_dict(p)
            kw["seeds"] = tuple(kw["seeds"])
            kw["search_seeds"] = tuple(kw["search_seeds"])
            kw["mlflow_run_ids"] = tuple(kw.get("mlflow_run_ids") or ())
            for k in ("values", "reference"):
                kw[k] = {int(s): v for s, v in (kw.get(k) or {}).items()}
            if kw.get("interval") is not None:
                kw["interval"] = tuple(kw["interval"])
            sd = kw.get("search_difference")
            if sd is not None:
                kw["search_difference"] = (sd[0], tuple(sd[1]) if sd[1] else None, sd[2])
            return cls(**kw)
        except (KeyError, TypeError, ValueError, IndexError, RecursionError) as exc:
            raise ArchiveError(
                f"unreadable confirmation{' ' + where if where else ''}: {exc}"
            ) from None


def record_confirmation(archive, conf: Confirmation) -> str:
    """Commit ``conf`` on its node's branch (replacing an earlier one under the same protocol); the
    node's status and results stay as they were."""
    return archive.commit_files(
        conf.node,
        {conf.path: conf.to_json()},
        subject=f"poise: held-out confirmation of {conf.node} vs {conf.against} ({conf.verdict})",
        trailers={"Poise-Event": "confirmation"},
    )


def other_protocol_version(conf: Confirmation, ref: ProtocolRef, result=None) -> str:
    """'' when ``conf`` was measured under the version of its protocol that is compared: the hash
    ``ref`` names, else that of ``result`` (the node's own result under the protocol id, the search's
    comparison the confirmation re-measures); '' too when neither names a version. Otherwise the
    compared version's key (``id@hash12``): the confirmation measured another version of the protocol
    (it was confirmed before the protocol changed, say), and its numbers are not the compared ones."""
    current = ref.hash
    if not current and result is not None and result.protocol.id == conf.protocol.id:
        current = result.protocol.hash
    compared = ProtocolRef(conf.protocol.id, current)
    return "" if not current or compared.matches(conf.protocol) else compared.key


def read_confirmation(archive, name: str, protocol_id: str) -> Confirmation | None:
    """The node's confirmation under ``protocol_id``, or None when it has none (a record naming
    another node, which a child spawned before children stopped inheriting ``confirmations/`` holds
    from its parent, is not its own)."""
    text = archive.read_file(name, f"{CONFIRMATIONS_DIR}/{protocol_id}.json")
    if text is None:
        return None
    conf = Confirmation.from_json(text, f"{name}:{CONFIRMATIONS_DIR}/{protocol_id}.json")
    return conf if conf.node == name else None  # a parent's, inherited before spawns left it out


def read_confirmations(archive, nodes, protocol_id: str) -> dict[str, Confirmation]:
    """Every node's confirmation under ``protocol_id`` (one batched read); unreadable ones are left out
    (``poise-git show NODE`` says why), and so is one naming another node (:func:`read_confirmation`)."""
    names = list(nodes)
    path = f"{CONFIRMATIONS_DIR}/{protocol_id}.json"
    blobs = archive.git.cat_blobs([f"{nodes[k].commit}:{path}" for k in names])
    out = {}
    for name, blob in zip(names, blobs):
        if blob is None:
            continue
        try:
            conf = Confirmation.from_json(blob)
        except ArchiveError:
            continue
        if conf.node == name:  # not a parent's, inherited before spawns left it out
            out[name] = conf
    return out
