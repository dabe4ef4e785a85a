"""One typed evaluation result: what was measured, under which protocol, on what scale, with which seeds.

A node holds at most one result per protocol, as ``results/<protocol id>.json`` on its branch (a verl
smoke run never overwrites the proxy result it sits beside). :meth:`Archive.record_result` is the one
writer, :func:`parse_result` the one reader (``Archive.nodes`` uses it); everything that ranks,
compares or shows results reads :class:`EvaluationResult` objects and nothing else.

Comparability: two results may be ranked together only under the same protocol id *and* hash, with the
utility metric on the same unit (proxy Overall is a fraction in [0, 1]; the six-benchmark Overall is in
percentage points). :func:`comparable` is the check and :class:`Incomparable` the refusal.

Why a frozen dataclass and not pydantic: the type is small, stdlib-only and cheap to import (``poise-git
log`` reads every node's results), and its validation is a few explicit checks with messages that name
the offending field.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import pickle
import re
import reprlib
import time
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ArchiveError

SCHEMA = "poise.result/2"
RESULTS_DIR = "results"
LEGACY_FILE = "results.json"
"""schema 1: one untyped results.json per node (archives made before results were typed)"""
RESULT_STATUSES = ("evaluated", "failed")
UNITS = {
    "fraction": (0.0, 1.0),
    "percent": (0.0, 100.0),
    "tokens": (0.0, math.inf),
    "words": (0.0, math.inf),
    "nats": (0.0, math.inf),
    "seconds": (0.0, math.inf),
    "count": (0.0, math.inf),
    "value": (-math.inf, math.inf),
}
"""unit -> the range its values must lie in (``value``: a number of unknown scale)"""
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*(/[A-Za-z0-9][A-Za-z0-9._+-]*)?$")
_TOL = 1e-9


class Incomparable(ArchiveError):
    """Results of different protocols (or units) were asked to be ranked or compared together."""


@dataclass(frozen=True)
class Protocol:
    """The identity of an evaluation protocol.

    id:       ``family/preset`` (``proxy/default``, ``proxy/smoke``, ``math6/paper``, ``verl-smoke``,
              ``external``...): what a user names with ``--protocol``.
    hash:     the hash of every setting that defines it (for the proxy, the warm-start content too);
              '' when unknown (an external record).
    backend:  what produced it (``proxy``, ``suite``, ``verl``, ``record``).
    preset:   the preset name within the family.
    settings: the settings the hash covers, for display.
    """

    id: str
    hash: str = ""
    backend: str = ""
    preset: str = ""
    settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _ID_RE.match(self.id):
            raise ArchiveError(
                f"bad protocol id {self.id!r}: use letters, digits, '.', '_', '+', '-' and at most one '/'"
            )

    @property
    def key(self) -> str:
        """``id@hash12`` (or ``id`` when the hash is unknown): the unit of comparability."""
        return f"{self.id}@{short_hash(self.hash)}" if self.hash else self.id

    @property
    def path(self) -> str:
        return f"{RESULTS_DIR}/{self.id}.json"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Protocol:
        """From its JSON form; keys it does not know (written by a later version) are left out."""
        return cls(**{k: v for k, v in d.items() if k in {f.name for f in dataclasses.fields(cls)}})


SEEDS_INTERVAL = "95% Student-t over seeds"
"""the interval kind of a proxy result: a node's mean over its own seeds (a difference between two
nodes at the same seeds is the paired one)"""
_RENAMED_KINDS = {"95% Student-t over paired seeds": SEEDS_INTERVAL}
"""interval kinds recorded under an earlier name: the same interval, read under its current name"""


@dataclass(frozen=True)
class EvaluationResult:
    """One evaluation of one node under one protocol.

    metrics:   name -> value (the mean over seeds where there are seeds).
    units:     name -> unit for every metric (a key of :data:`UNITS`).
    intervals: name -> (low, high), the 95% interval; ``interval_kind`` says over what.
    utility:   the metric the experiment ranks by when this was recorded (``overall`` by default);
               an ``evaluated`` result must contain it.
    """

    protocol: Protocol
    status: str
    metrics: Mapping[str, float] = field(default_factory=dict)
    units: Mapping[str, str] = field(default_factory=dict)
    intervals: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    interval_kind: str = ""
    seeds: tuple[int, ...] = ()
    utility: str = "overall"
    reason: str = ""
    per_seed: tuple[Mapping[str, Any], ...] = ()
    trajectory: Mapping[str, list] = field(default_factory=dict)
    mlflow_run_ids: tuple[str, ...] = ()
    wall_time_s: float = 0.0
    node_commit: str = ""
    source: str = "evaluate"
    """evaluate | record | loop (a failure the loop recorded for a lost worker)"""
    recorded_at: float = 0.0
    details: Mapping[str, Any] = field(default_factory=dict)
    """backend-specific provenance: versions, timings, generation settings, grader counts..."""
    legacy: bool = False
    """read from a schema-1 results.json (units and protocol inferred)"""

    def __post_init__(self) -> None:
        check = _Checker(self.protocol.id)
        check(
            self.status in RESULT_STATUSES,
            f"status must be one of {RESULT_STATUSES}, got {self.status!r}",
        )
        for k, v in self.metrics.items():
            check(isinstance(k, str) and k != "", f"bad metric name {k!r}")
            check(
                is_finite_number(v),
                f"metric {k!r} must be a finite number, got {_brief.repr(v)}",
            )
            unit = self.units.get(k)
            check(
                unit in UNITS, f"metric {k!r} has no unit (one of {', '.join(UNITS)}), got {unit!r}"
            )
            lo, hi = UNITS[unit]
            check(
                lo - _TOL <= float(v) <= hi + _TOL,
                f"metric {k!r} = {v!r} lies outside its unit's range ({unit}: {lo:g}..{hi:g})",
            )
        for k, iv in self.intervals.items():
            check(k in self.metrics, f"interval for {k!r}, which is not a metric")
            check(
                len(iv) == 2 and all(math.isfinite(float(x)) for x in iv) and iv[0] <= iv[1] + _TOL,
                f"interval of {k!r} must be [low, high], got {iv!r}",
            )
        check(
            all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in self.seeds),
            f"bad seeds {self.seeds!r}",
        )
        check(
            len(set(self.seeds)) == len(self.seeds), f"seeds must be distinct, got {self.seeds!r}"
        )
        if self.per_seed:
            self._check_per_seed(check)
        if self.status == "evaluated":
            check(
                self.utility in self.metrics,
                f"an evaluated result must contain the utility metric {self.utility!r} "
                f"(it has: {', '.join(sorted(self.metrics)) or 'no metrics'})",
            )
        else:
            check(bool(self.reason), "a failed result must say why (reason)")

    def _check_per_seed(self, check: _Checker) -> None:
        """Per-seed rows are what a paired comparison reads, the recorded metrics what a ranking
        reads: one row per seed of ``seeds``, and every metric the mean of the rows' values of it
        (as an evaluation computes it, failed seeds with values included), so both read the same."""
        seen: list[int] = []
        sums: dict[str, list[float]] = {}
        for row in self.per_seed:
            check(
                isinstance(row, Mapping),
                f"a per-seed row must be an object, got {_brief.repr(row)}",
            )
            s = row.get("seed")
            check(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0,
                f"a per-seed row's seed must be a non-negative integer, got {_brief.repr(s)}",
            )
            seen.append(s)
            values = row.get("metrics") or {}
            check(isinstance(values, Mapping), f"the metrics of seed {s} must be an object")
            for k in self.metrics:
                if k in values:
                    v = values[k]
                    check(
                        is_finite_number(v),
                        f"metric {k!r} at seed {s} must be a finite number, got {_brief.repr(v)}",
                    )
                    sums.setdefault(k, []).append(float(v))
        check(
            sorted(seen) == sorted(self.seeds),
            f"per-seed rows at seeds {_brief.repr(seen)} are not one per seed of {_brief.repr(list(self.seeds))}",
        )
        for k, vals in sums.items():
            mean, got = sum(vals) / len(vals), float(self.metrics[k])
            check(
                abs(mean - got) <= _TOL * max(1.0, abs(mean)),
                f"metric {k!r} = {got!r} is not the mean of its per-seed values ({mean!r})",
            )

    # -- reading -------------------------------------------------------------------------------
    @property
    def ok(self) -> bool:
        return self.status == "evaluated"

    @property
    def value(self) -> float | None:
        """The utility metric's value (None for a failed result)."""
        v = self.metrics.get(self.utility) if self.ok else None
        return None if v is None else float(v)

    def interval(self, metric: str) -> tuple[float, float] | None:
        iv = self.intervals.get(metric)
        return None if iv is None else (float(iv[0]), float(iv[1]))

    def unit(self, metric: str) -> str:
        return self.units.get(metric, "value")

    def describe(self) -> str:
        """One line: protocol, seeds and the utility with its interval."""
        if not self.ok:
            return f"{self.protocol.key}: failed ({self.reason})"
        u, iv = self.utility, self.interval(self.utility)
        span = f" [{iv[0]:.4g}, {iv[1]:.4g}]" if iv else ""
        seeds = f", {len(self.seeds)} seed(s)" if self.seeds else ""
        return f"{self.protocol.key}: {u} {self.value:.4g}{span} ({self.unit(u)}{seeds})"

    # -- (de)serialization ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("legacy")
        d["schema"] = SCHEMA
        d["intervals"] = {k: [float(a), float(b)] for k, (a, b) in self.intervals.items()}
        return d

    def to_json(self) -> str:
        try:
            return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"
        except ValueError as exc:
            raise ArchiveError(
                f"result for {self.protocol.id}: {exc} (NaN/inf in a detail)"
            ) from None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvaluationResult:
        if not isinstance(d, Mapping):
            raise ArchiveError("a result must be a JSON object")
        if d.get("schema") != SCHEMA:
            raise ArchiveError(f"not a {SCHEMA} result (schema {d.get('schema')!r})")
        p = d.get("protocol")
        if not isinstance(p, Mapping):
            raise ArchiveError("a result needs its protocol")
        known = {f.name for f in dataclasses.fields(cls)} - {"legacy"}
        kw = {k: v for k, v in d.items() if k in known}
        kw["protocol"] = Protocol.from_dict(p)
        kind = kw.get("interval_kind")
        if isinstance(kind, str):
            kw["interval_kind"] = _RENAMED_KINDS.get(kind, kind)
        for k in ("seeds", "per_seed", "mlflow_run_ids"):
            kw[k] = tuple(kw.get(k) or ())
        kw["intervals"] = {
            k: (float(v[0]), float(v[1])) for k, v in (kw.get("intervals") or {}).items()
        }
        return cls(**kw)


# -- the lineage index's form ----------------------------------------------------------------
DEFERRED = tuple(
    f.name for f in dataclasses.fields(EvaluationResult) if f.name not in ("protocol", "status")
)
"""the fields a result read from the lineage index decodes on first access: all but its protocol
(which a lineage read compares) and its status, so that reading 100k nodes builds three objects
per result"""
HEAD_FIELDS = ("metrics", "units", "utility", "seeds")
"""the deferred fields a selection reads of every node: in the index's snapshot beside the protocol
(:func:`packed_head`), decoded together"""
TAIL_FIELDS = tuple(k for k in DEFERRED if k not in HEAD_FIELDS)
"""the other deferred fields (intervals, per-seed rows, trajectory, details...), which the views of
one node read: kept out of the snapshot, in a row per commit read on first access"""
_HEAD_SET = frozenset(HEAD_FIELDS)


class _Deferred:
    """The class attribute of a field in :data:`DEFERRED`: a result built as usual holds the field in
    its ``__dict__``, which Python reads before this descriptor; a result from the lineage index
    holds its fields in an index form instead, decoded into its ``__dict__`` here once: all of them
    packed in one string (``_packed``: :func:`from_packed`), or (a snapshot's result) :data:`HEAD_FIELDS`
    in ``_head`` (:func:`packed_head`) and :data:`TAIL_FIELDS` behind ``_tail``: (a one-element tuple
    holding what reads them, ``.tail(commit id, path)``; the commit id; the result file's path)."""

    def __init__(self, name: str, default: Any):
        self.name, self.default = name, default

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self.default
        d = obj.__dict__
        packed = d.get("_packed")
        if packed is not None:
            values = _PlainUnpickler(io.BytesIO(packed)).load()
            if not isinstance(values, dict) or set(values) != set(DEFERRED):
                raise ArchiveError("a lineage index entry's result fields are malformed")
            for k in DEFERRED:
                d.setdefault(k, values[k])
            d.pop("_packed", None)
        elif self.name in _HEAD_SET and "_head" in d:
            for k, v in zip(HEAD_FIELDS, _unpack_head(d["_head"])):
                d.setdefault(k, v)
            d.pop("_head", None)
        elif self.name not in _HEAD_SET and "_tail" in d:
            try:
                source, oid, path = d["_tail"]
                read = source[0].tail
            except (TypeError, ValueError, AttributeError, IndexError, KeyError):
                raise ArchiveError("a lineage index entry's result is malformed") from None
            values = read(oid, path)
            if not isinstance(values, dict) or set(values) != set(TAIL_FIELDS):
                raise ArchiveError("a lineage index entry's result fields are malformed")
            for k in TAIL_FIELDS:
                d.setdefault(k, values[k])
            d.pop("_tail", None)
        else:
            raise AttributeError(self.name)
        return d[self.name]


class _PlainUnpickler(pickle.Unpickler):
    """Plain values only (dicts, lists, tuples, strings, numbers): nothing is looked up or called."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} in a result's packed fields")


for _f in dataclasses.fields(EvaluationResult):
    if _f.name in DEFERRED:
        setattr(EvaluationResult, _f.name, _Deferred(_f.name, _f.default))


def _result_getstate(self: EvaluationResult) -> dict[str, Any]:
    """The fields, decoded (a result in the index's form refers to the index: a copy or a pickle of
    it sent elsewhere holds its values instead)."""
    d = self.__dict__
    if "_packed" in d or "_head" in d or "_tail" in d:
        for k in DEFERRED:
            getattr(self, k)
    return {k: v for k, v in d.items() if k[:1] != "_"}


EvaluationResult.__getstate__ = _result_getstate  # type: ignore[method-assign]


def _fields(r: EvaluationResult, names: tuple[str, ...]) -> dict[str, Any]:
    return {k: getattr(r, k) for k in names}


def packed_state(r: EvaluationResult) -> tuple[dict[str, Any], bytes]:
    """(the fields but :data:`DEFERRED`, those packed in one string): a result in the index's form."""
    d = r.__dict__
    packed = d.get("_packed")
    if packed is None:
        packed = pickle.dumps(_fields(r, DEFERRED), pickle.HIGHEST_PROTOCOL)
    return {"protocol": d["protocol"], "status": d["status"]}, packed


def from_packed(state: dict[str, Any], packed: bytes) -> EvaluationResult:
    """The result :func:`packed_state` describes, its deferred fields decoded when first read. Built
    without ``__init__``: it was checked when its file was read, before it was indexed."""
    if not isinstance(state, dict) or not isinstance(packed, bytes):
        raise ArchiveError("a lineage index entry's result is malformed")
    r = object.__new__(EvaluationResult)
    r.__dict__.update(state)
    r.__dict__["_packed"] = packed
    return r


def packed_head(r: EvaluationResult) -> tuple | bytes:
    """:data:`HEAD_FIELDS` in the snapshot's form: (metric names, their values as packed doubles, the
    units' items, the utility, the seeds), where every value is a float, else pickled."""
    d = r.__dict__
    if "_head" in d:
        return d["_head"]
    metrics, units = r.metrics, r.units
    if (
        type(metrics) is dict
        and type(units) is dict
        and type(r.utility) is str
        and type(r.seeds) is tuple
        and all(type(v) is float for v in metrics.values())
    ):
        values = array("d", metrics.values()).tobytes()
        return tuple(metrics), values, tuple(units.items()), r.utility, r.seeds
    return pickle.dumps(_fields(r, HEAD_FIELDS), pickle.HIGHEST_PROTOCOL)


def packed_tail(r: EvaluationResult) -> bytes:
    """:data:`TAIL_FIELDS`, pickled: the row a snapshot's result reads them from."""
    return pickle.dumps(_fields(r, TAIL_FIELDS), pickle.HIGHEST_PROTOCOL)


def _unpack_head(head: Any) -> tuple:
    """(metrics, units, utility, seeds) of :func:`packed_head`'s form."""
    if isinstance(head, bytes):
        values = _PlainUnpickler(io.BytesIO(head)).load()
        if not isinstance(values, dict) or set(values) != _HEAD_SET:
            raise ArchiveError("a lineage index entry's result fields are malformed")
        return tuple(values[k] for k in HEAD_FIELDS)
    try:
        keys, packed, units, utility, seeds = head
        values = array("d")
        values.frombytes(packed)
        if len(values) != len(keys) or type(seeds) is not tuple or type(utility) is not str:
            raise ValueError
        return dict(zip(keys, values)), dict(units), utility, seeds
    except (TypeError, ValueError):
        raise ArchiveError("a lineage index entry's result fields are malformed") from None


class _Checker:
    def __init__(self, what: str):
        self.what = what

    def __call__(self, ok: bool, msg: str) -> None:
        if not ok:
            raise ArchiveError(f"invalid result ({self.what}): {msg}")


def short_hash(h: str) -> str:
    return h.split(":", 1)[-1][:12]


def parse_result(text: str | bytes, where: str = "") -> EvaluationResult:
    """The one reader: a result file's JSON (schema 2, or a legacy schema-1 results.json)."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArchiveError(f"{where or 'result'} is not valid JSON: {exc}") from None
    try:
        if isinstance(data, Mapping) and data.get("schema") == SCHEMA:
            return EvaluationResult.from_dict(data)
        return from_legacy(data)
    except OverflowError:  # float() of an integer beyond the float range (an interval, a seed...)
        raise ArchiveError(f"{where or 'result'} holds a number beyond the float range") from None


# -- schema 1 --------------------------------------------------------------------------------
def _legacy_unit(key: str, family: str) -> str:
    if key.endswith("mean_length"):
        return "words" if family == "suite" else "tokens"
    if family == "proxy":
        return "fraction"
    if family == "suite":
        return "fraction" if key.endswith("valid_rate") else "percent"
    return "value"


def from_legacy(d: Any) -> EvaluationResult:
    """A schema-1 ``results.json`` read as a typed result, its protocol and units inferred from the
    backend that wrote it (``legacy`` is set so the CLI can say so)."""
    if not isinstance(d, Mapping):
        raise ArchiveError("results.json must be a JSON object")
    metrics = d.get("metrics") if isinstance(d.get("metrics"), Mapping) else {}
    backend = str(d.get("backend") or ("record" if d.get("source") == "record" else ""))
    if "suite" in d:
        proto_d = d.get("protocol") if isinstance(d.get("protocol"), Mapping) else {}
        preset = str(proto_d.get("preset") or "paper")
        protocol = Protocol(
            f"{d['suite']}/{preset}", str(d.get("protocol_hash") or ""), "suite", preset
        )
        family = "suite"
    elif backend == "proxy":
        preset = str(d.get("preset") or "default")
        settings = d.get("protocol") if isinstance(d.get("protocol"), Mapping) else {}
        protocol = Protocol(
            f"proxy/{preset}", str(d.get("protocol_hash") or ""), "proxy", preset, settings
        )
        family = "proxy"
    elif backend == "verl":
        protocol, family = Protocol("verl/paper", "", "verl", "paper"), "suite"
    else:
        protocol, family = Protocol("external", "", "record"), "external"
    status = "failed" if d.get("status") == "failed" else "evaluated"
    reason = str(
        d.get("reason") or ("" if status == "evaluated" else "failed (no reason recorded)")
    )
    utility = (
        "overall" if "overall" in metrics or status == "failed" else next(iter(metrics), "overall")
    )
    ivs = d.get("intervals") if isinstance(d.get("intervals"), Mapping) else {}
    return EvaluationResult(
        protocol=protocol,
        status=status,
        metrics={k: float(v) for k, v in metrics.items()},
        units={k: _legacy_unit(k, family) for k in metrics},
        intervals={k: (float(v[0]), float(v[1])) for k, v in ivs.items() if k in metrics and v},
        interval_kind={"proxy": "t95 over seeds", "suite": "bootstrap over problems"}.get(
            family, ""
        ),
        seeds=tuple(int(s) for s in (d.get("seeds") or ()) if isinstance(s, int)),
        utility=utility,
        reason=reason,
        per_seed=tuple(d.get("per_seed") or ()),
        trajectory=dict(d.get("trajectory") or {}),
        mlflow_run_ids=tuple(d.get("mlflow_run_ids") or ()),
        wall_time_s=float(d.get("wall_time_s") or 0.0),
        node_commit=str(d.get("node_commit") or ""),
        source="record"
        if family == "external"
        else ("loop" if d.get("source") == "loop" else "evaluate"),
        details={
            k: d[k] for k in ("versions", "counts", "grader", "generation", "model") if k in d
        },
        legacy=True,
    )


# -- comparability ---------------------------------------------------------------------------
def comparable(a: EvaluationResult, b: EvaluationResult, metric: str | None = None) -> bool:
    """Same protocol id and hash, and the metric (default: a's utility) on the same unit."""
    m = metric or a.utility
    return (
        a.protocol.id == b.protocol.id
        and a.protocol.hash == b.protocol.hash
        and a.unit(m) == b.unit(m)
    )


def _comparable_groups(
    results: Mapping[str, EvaluationResult], metric: str | None
) -> dict[tuple[str, str], list[str]]:
    """(protocol key, unit of ``metric``, default each result's utility) -> the names whose results
    share them: what can be ranked together."""
    groups: dict[tuple[str, str], list[str]] = {}
    for name, r in results.items():
        groups.setdefault((r.protocol.key, r.unit(metric or r.utility)), []).append(name)
    return groups


def require_comparable(results: Mapping[str, EvaluationResult], metric: str | None = None) -> None:
    """Raise :class:`Incomparable` (naming the groups) unless every result can be ranked together."""
    groups = _comparable_groups(results, metric)
    if len(groups) > 1:
        parts = [
            f"{key} ({unit}): {', '.join(sorted(names)[:4])}{'…' if len(names) > 4 else ''}"
            for (key, unit), names in sorted(groups.items())
        ]
        raise Incomparable(
            "results of different protocols or units cannot be ranked together: "
            + "; ".join(parts)
            + " (choose one with --protocol)"
        )


def rankable(
    results: Mapping[str, EvaluationResult], metric: str | None = None, prefer: str | None = None
) -> tuple[set[str], dict[str, str]]:
    """Split ``results`` for a view that ranks what it can (a report): the names whose results can
    be ranked together, the group of ``prefer`` (the root) where it has a result, else the largest;
    and each other name with the protocol and unit that keep it out (``lab/v1@aaaa (percent)``)."""
    groups = _comparable_groups(results, metric)
    if not groups:
        return set(), {}
    keep = next((g for g in groups.values() if prefer in g), None)
    if keep is None:
        keep = max(groups.values(), key=lambda g: (len(g), sorted(g)))
    out = {
        name: f"{key} ({unit})"
        for (key, unit), names in groups.items()
        if names is not keep
        for name in names
    }
    return set(keep), out


def protocol_ids(results: Iterable[EvaluationResult]) -> list[str]:
    return sorted({r.protocol.id for r in results})


def now() -> float:
    return round(time.time(), 3)


@dataclass(frozen=True)
class ProtocolRef:
    """The protocol a ranking or comparison is made under: an id and, when known, a hash (a result
    under the same id with another hash comes from an older protocol version and is not compared)."""

    id: str
    hash: str = ""

    @classmethod
    def parse(cls, text: str) -> ProtocolRef:
        pid, _, h = text.strip().partition("@")
        Protocol(pid)  # validates the id
        return cls(pid, h)

    def matches(self, p: Protocol) -> bool:
        if p.id != self.id:
            return False
        return not self.hash or short_hash(p.hash).startswith(short_hash(self.hash))

    @property
    def key(self) -> str:
        return f"{self.id}@{short_hash(self.hash)}" if self.hash else self.id


def named_protocol(protocol: ProtocolRef | str | None) -> ProtocolRef | None:
    """``protocol`` as a :class:`ProtocolRef` (given as one, or as ``id`` / ``id@hash``); None when it
    names none, where the experiment's :func:`configured_protocol` applies."""
    if isinstance(protocol, ProtocolRef):
        return protocol
    return ProtocolRef.parse(protocol) if protocol else None


def configured_protocol(cfg) -> ProtocolRef:
    """The protocol the experiment ranks under: ``[evaluation].protocol`` when set, else the one its
    backend and preset define: ``proxy/<preset>`` with the proxy protocol's current hash; on verl,
    the suite protocol its checkpoints are scored under (``math6/paper`` at the scoring's hash),
    where its failed trainings are recorded too."""
    explicit = getattr(cfg.evaluation, "protocol", "")
    if explicit:
        return ProtocolRef.parse(explicit)
    if cfg.evaluation.backend == "proxy":
        # lazy: keeps `poise-git --help` fast
        from trainer_template.proxy.protocol import PRESETS, get_protocol

        preset = cfg.proxy.preset
        return ProtocolRef(
            f"proxy/{preset}", get_protocol(preset).hash() if preset in PRESETS else ""
        )
    if cfg.evaluation.backend == "verl":
        from engine.archive.scoring import verl_ranking_id  # lazy: imports the evaluators

        return ProtocolRef(*verl_ranking_id())
    return ProtocolRef(f"{cfg.evaluation.backend}/paper")


RECORD_MAX_BYTES = 1_000_000
"""the largest results file ``poise-git record`` reads (a suite's metrics, units, intervals and seeds
take a few kilobytes)"""
RECORD_MAX_METRICS = 2000
"""the most metrics one recorded result may hold (a suite's result holds tens)"""
_RECORD_ENGINE_FAMILIES = ("proxy", "verl-smoke", "math6", "verl")
_brief = reprlib.Repr()
_brief.maxlevel, _brief.maxstring, _brief.maxother, _brief.maxlist, _brief.maxdict = 2, 40, 40, 4, 4


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_finite_number(v: Any) -> bool:
    """A finite int or float (not a bool): what a recorded number must be. An int beyond the float
    range (JSON integers have no bound) is not one."""
    try:
        return _is_number(v) and math.isfinite(v)
    except OverflowError:
        return False


def _record_seed(s: Any) -> int:
    if is_finite_number(s) and s >= 0 and s == int(s):
        return int(s)
    raise ArchiveError(
        f"results: seeds must be a list of non-negative integers, got {_brief.repr(s)} in it"
    )


def from_record(
    payload: Mapping[str, Any],
    *,
    protocol: str | None = None,
    unit: str | None = None,
    utility: str = "overall",
) -> EvaluationResult:
    """A result a user records from elsewhere (``poise-git record``): a flat ``{metric: number}``
    object, or ``{"metrics": {...}, "units": {...}, "intervals": {...}, "seeds": [...],
    "protocol": id}``. Metrics without a unit get ``unit`` (default ``value``); the protocol is the
    file's or ``protocol`` (default ``external``), which must agree when both are given, and never one
    the engine measures itself, so a record cannot pass for a proxy or benchmark evaluation. Anything
    malformed is an :class:`ArchiveError` naming the field."""
    if not isinstance(payload, Mapping) or not payload:
        raise ArchiveError("results must be a non-empty JSON object of metric name -> number")
    unit = "value" if unit is None else unit
    if unit not in UNITS:
        raise ArchiveError(f"unknown unit {unit!r}; use one of {', '.join(UNITS)}")
    nested = isinstance(payload.get("metrics"), Mapping)
    meta = payload if nested else {}
    pid = _record_protocol(meta.get("protocol"), protocol)
    raw = payload["metrics"] if nested else payload
    if len(raw) > RECORD_MAX_METRICS:
        raise ArchiveError(
            f"results hold {len(raw)} metrics; a recorded result may hold at most "
            f"{RECORD_MAX_METRICS}"
        )
    metrics: dict[str, float] = {}
    for k, v in raw.items():
        if isinstance(v, bool):
            continue
        if not is_finite_number(v):
            hint = "" if nested else ' (put units, intervals and seeds beside a "metrics" object)'
            raise ArchiveError(
                f"results: metric {k!r} must be a finite number, got {_brief.repr(v)}{hint}"
            )
        metrics[str(k)] = float(v)
    if not metrics:
        raise ArchiveError("results must hold at least one metric name -> number")
    units = _record_mapping(meta, "units", "metric name -> unit")
    for k, u in units.items():
        if k not in metrics:
            raise ArchiveError(f"results: units name {k!r}, which is not a metric")
        if not isinstance(u, str) or u not in UNITS:
            raise ArchiveError(
                f"results: the unit of {k!r} must be one of {', '.join(UNITS)}, got {_brief.repr(u)}"
            )
    intervals = {
        k: _record_interval(k, iv, metrics)
        for k, iv in _record_mapping(meta, "intervals", "metric name -> [low, high]").items()
    }
    seeds_raw = meta.get("seeds")
    if seeds_raw is not None and not isinstance(seeds_raw, list):
        raise ArchiveError(
            f"results: seeds must be a list of non-negative integers, got {_brief.repr(seeds_raw)}"
        )
    seeds = tuple(_record_seed(s) for s in seeds_raw or ())
    if len(set(seeds)) != len(seeds):
        raise ArchiveError(f"results: seeds must be distinct, got {list(seeds)}")
    strings = {}
    for key in ("protocol_hash", "interval_kind"):
        v = meta.get(key)
        if v is not None and not isinstance(v, str):
            raise ArchiveError(f"results: {key} must be a string, got {_brief.repr(v)}")
        strings[key] = v or ""
    return EvaluationResult(
        protocol=Protocol(pid, strings["protocol_hash"], "record"),
        status="evaluated",
        metrics=metrics,
        units={k: units.get(k, unit) for k in metrics},
        intervals=intervals,
        interval_kind=strings["interval_kind"] or ("as recorded" if intervals else ""),
        seeds=seeds,
        utility=utility,
        source="record",
        recorded_at=now(),
    )


def _record_protocol(in_file: Any, given: str | None) -> str:
    """The protocol id of a record: the file's ``protocol`` or ``--protocol``, refused when both are
    given and differ, or when it is one the engine measures itself."""
    if in_file is not None and not isinstance(in_file, str):
        raise ArchiveError(f"results: protocol must be a protocol id, got {_brief.repr(in_file)}")
    if in_file and given is not None and in_file != given:
        raise ArchiveError(
            f"the results file says protocol {in_file!r} but --protocol says {given!r}: "
            "drop one, or make them agree"
        )
    pid = in_file or given or "external"
    if pid.split("/", 1)[0] in _RECORD_ENGINE_FAMILIES:
        raise ArchiveError(
            f"protocol {pid!r} is measured by poise-git itself; record external results under "
            "another id (e.g. --protocol lab-eval/v1)"
        )
    return pid


def _record_mapping(meta: Mapping[str, Any], key: str, what: str) -> Mapping[str, Any]:
    v = meta.get(key)
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ArchiveError(f"results: {key} must be an object of {what}, got {_brief.repr(v)}")
    return v


def _record_interval(k: str, iv: Any, metrics: Mapping[str, float]) -> tuple[float, float]:
    if k not in metrics:
        raise ArchiveError(f"results: intervals name {k!r}, which is not a metric")
    if not (isinstance(iv, list) and len(iv) == 2 and all(is_finite_number(x) for x in iv)):
        raise ArchiveError(
            f"results: the interval of {k!r} must be [low, high], two finite numbers, "
            f"got {_brief.repr(iv)}"
        )
    lo, hi, v = float(iv[0]), float(iv[1]), metrics[k]
    if not lo - _TOL <= v <= hi + _TOL:
        raise ArchiveError(
            f"results: the interval of {k!r}, [{lo:g}, {hi:g}], does not contain its value {v:g}"
        )
    return lo, hi


def protocols_with_results(nodes: Mapping[str, Any], *, besides=None) -> dict[str, int]:
    """Every protocol id some node has a successful result under, with how many nodes have one
    (for pointing a user at ``--protocol`` when the compared protocol has none; a node
    without ``results``, as synthetic ones in selection, has none); ``besides``: a
    predicate on a result's Protocol, whose results are left out (those already compared)."""
    counts: dict[str, int] = {}
    for node in nodes.values():
        for pid, result in (getattr(node, "results", None) or {}).items():
            if result.ok and not (besides is not None and besides(result.protocol)):
                counts[pid] = counts.get(pid, 0) + 1
    return dict(sorted(counts.items()))


def describe_counts(counts: Mapping[str, int]) -> str:
    """``proxy/smoke (1 node), lab/v1 (3 nodes)``: :func:`protocols_with_results` for a reader."""
    return ", ".join(f"{pid} ({n} node{'s' * (n != 1)})" for pid, n in counts.items())


def describe_elsewhere(counts: Mapping[str, int], compared_id: str | None) -> str:
    """Where the results left out of a comparison under ``compared_id`` are, for a reader: results
    under that same id are another version of it (another hash), the rest other protocols, e.g.
    ``another version of proxy/default (3 nodes); other protocols: proxy/smoke (1 node)``."""
    same = {p: n for p, n in counts.items() if p == compared_id}
    other = {p: n for p, n in counts.items() if p != compared_id}
    parts = []
    if same:
        n = same[compared_id]
        parts.append(f"another version of {compared_id} ({n} node{'s' * (n != 1)})")
    if other:
        parts.append(f"other protocols: {describe_counts(other)}")
    return "; ".join(parts)


def seeds_phrase(seeds) -> str:
    """``seeds 0, 1`` (``no seeds`` for none): how ``poise-git show`` heads a result and the
    re-evaluation line names one."""
    return f"seeds {', '.join(map(str, seeds))}" if seeds else "no seeds"
