"""Reflection (operator A): a diagnosis of a node from its trajectory and metrics against its parent's.

Computed diagnostics (always): entropy collapse, KL spikes, reward plateau, length drift, valid-rate
change, gradient-norm spikes, which metrics moved beyond their 95% intervals, and what the training
trajectory did differently from the parent's (more or less entropy, KL, length, validity, reward,
clipping over the last third of training). With an LLM client, a
mechanism-level narrative is added. Committed as ``REFLECTION.md``; logged to the node's MLflow runs.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine import secrets
from engine.archive.results import EvaluationResult, comparable, configured_protocol
from engine.archive.tracking import TrackingUnavailable, mlflow_client, unreachable
from engine.errors import PoiseError
from engine.stats import paired_interval, tail_mean
from engine.untrusted import UNTRUSTED_NOTE, fence, one_line

log = logging.getLogger(__name__)


def _list(traj: dict[str, Any], key: str) -> list:
    """A recorded series as a list ([] for a value that is none: a results file edited by hand)."""
    vals = traj.get(key)
    return list(vals) if isinstance(vals, (list, tuple)) else []


def _series(traj: dict[str, Any], key: str) -> list[float]:
    vals = _list(traj, key)
    return [float(v) for v in vals if isinstance(v, (int, float)) and math.isfinite(float(v))]


def _step_of(traj: dict[str, Any], key: str, k: int) -> float:
    """The training step of the ``k``-th number of :func:`_series` (traj, key): the step recorded at
    its own index (a missing entry before it does not shift it), or that index without steps."""
    raw = _list(traj, key)
    i = [j for j, v in enumerate(raw) if isinstance(v, (int, float)) and math.isfinite(float(v))][k]
    steps = _list(traj, "step")
    step = steps[i] if len(steps) >= len(raw) else i
    return float(step) if isinstance(step, (int, float)) else float(i)


def _thirds(x: list[float]) -> tuple[float, float, float]:
    """The means of the first, middle and last thirds of ``x`` (at least one value each; the middle
    is the whole series where nothing is left between the ends)."""
    k = max(1, len(x) // 3)
    mid = x[k:-k] or x
    return statistics.fmean(x[:k]), statistics.fmean(mid), statistics.fmean(x[-k:])


def trajectory_diagnostics(traj: dict[str, Any]) -> list[str]:
    """One line per finding in a results.json trajectory (empty when nothing stands out)."""
    out: list[str] = []
    ent = _series(traj, "train/entropy")
    if len(ent) >= 3 and ent[0] > 0:
        # the last third's mean, not its lowest step: one dip between steps near the start is no
        # collapse (on the recorded discovery archives the two rules agree on 304 of 306 nodes,
        # and on every node of the default loop's three searches)
        tail = statistics.fmean(ent[len(ent) * 2 // 3 :])
        if tail < 0.3 * ent[0]:
            out.append(
                f"entropy collapse: policy entropy fell from {ent[0]:.3g} to {tail:.3g} "
                f"({tail / ent[0]:.0%} of its start)"
            )
    kl = _series(traj, "train/kl")
    if len(kl) >= 4:
        med = statistics.median(abs(x) for x in kl)
        peak_i = max(range(len(kl)), key=lambda i: abs(kl[i]))
        if abs(kl[peak_i]) > max(5 * med, 1e-3):
            out.append(
                f"KL spike: {kl[peak_i]:.3g} at step {_step_of(traj, 'train/kl', peak_i):.0f} "
                f"(median {med:.3g})"
            )
    # the series below are compared by the means of their first, middle and last thirds, not by
    # single steps: one noisy last step is no drift, and a fall followed by a flat stretch is a
    # decline, not a plateau
    rew = _series(traj, "train/reward_mean")
    if len(rew) >= 6:
        head, mid, tail = _thirds(rew)
        total, late = tail - head, tail - mid
        if total < -0.01:
            out.append(
                f"reward decline: reward_mean fell {head:.3g} -> {tail:.3g} (first to last third)"
            )
        elif abs(late) < max(0.01, 0.1 * abs(total)):
            out.append(
                f"reward plateau: reward_mean moved {late:+.3g} from the middle to the last third "
                f"of training (total {total:+.3g}, {head:.3g} -> {tail:.3g})"
            )
    ln = _series(traj, "train/response_length")
    if len(ln) >= 3:
        head, _, tail = _thirds(ln)
        ratio = tail / head if head > 0 else 1.0
        if ratio > 1.3 or ratio < 0.7:
            out.append(
                f"length drift: mean response length {head:.4g} -> {tail:.4g} tokens (x{ratio:.2f}, "
                "first to last third)"
            )
    vr = _series(traj, "train/valid_rate")
    if len(vr) >= 3:
        head, _, tail = _thirds(vr)
        if abs(tail - head) >= 0.05:
            out.append(
                f"valid-rate change during training: {head:.3g} -> {tail:.3g} (first to last third)"
            )
    gn = _series(traj, "train/grad_norm")
    if len(gn) >= 4:
        med = statistics.median(gn)
        if med > 0 and max(gn) > 10 * med:
            out.append(f"grad-norm spike: max {max(gn):.3g} vs median {med:.3g}")
    cf = _series(traj, "train/clipfrac")
    if cf and statistics.fmean(cf) > 0.3:
        out.append(f"heavy clipping: mean clip fraction {statistics.fmean(cf):.2f}")
    return out


TRAJECTORY_VS_PARENT: tuple[tuple[str, str, str, float, tuple[str, str]], ...] = (
    ("train/entropy", "policy entropy", "ratio", 1.2, ("kept more entropy", "lost more entropy")),
    (
        "train/kl",
        "KL to the reference",
        "ratio",
        2.0,
        ("drifted further from the reference", "stayed closer to the reference"),
    ),
    ("train/response_length", "response length", "ratio", 1.2, ("longer", "shorter")),
    ("train/valid_rate", "valid rate", "diff", 0.02, ("more valid", "fewer valid")),
    ("train/reward_mean", "reward", "diff", 0.02, ("higher reward", "lower reward")),
    ("train/clipfrac", "clip fraction", "diff", 0.05, ("clipped more", "clipped less")),
)
"""the trajectory series the reflection compares with the parent's: (key, label, how: the node's
over the parent's value or their difference, the change a finding needs, its words up and down)"""
TAIL = "the last third of training"
SLIGHT = 0.25
"""the share of a finding's size (of its logarithm for ratios: x1.047 of x1.2) a change beyond its
paired interval needs to be listed as slight but consistent"""


def seed_tails(result: EvaluationResult | None) -> dict[int, dict[str, float]]:
    """seed -> each training series' mean over :data:`TAIL` at that seed, from a result's evaluated
    per-seed rows ({} for results recorded without them)."""
    out: dict[int, dict[str, float]] = {}
    for row in result.per_seed if result is not None else ():
        tail = row.get("trajectory_tail")
        if isinstance(tail, dict) and row.get("status", "evaluated") == "evaluated":
            out[int(row["seed"])] = {
                k: float(v) for k, v in tail.items() if isinstance(v, (int, float))
            }
    return out


def _paired_tails(
    key: str, tails: dict[int, dict[str, float]], parent_tails: dict[int, dict[str, float]]
) -> tuple[float, float, tuple[float, float], int] | None:
    """(node mean, parent mean, 95% interval of the paired difference, seeds) of one series' tail
    means over the seeds both have it at; None for fewer than 2 such seeds."""
    mine = {s: t[key] for s, t in tails.items() if key in t}
    theirs = {s: t[key] for s, t in parent_tails.items() if key in t}
    d = paired_interval(mine, theirs)
    if d is None or d[1] is None:
        return None
    shared = sorted(set(mine) & set(theirs))
    a = statistics.fmean(mine[s] for s in shared)
    b = statistics.fmean(theirs[s] for s in shared)
    return a, b, (d[1][0], d[1][1]), d[2]


TrajectoryRow = tuple[str, float, float, str, tuple[float, float] | None, int]
"""one row of the trajectory comparison: (series, node, parent, change, 95% interval of the paired
difference or None, paired seeds behind the interval)"""


SERIES_VERDICTS = ("up", "down", "alike", "unclear")
"""what one series did against the parent's, judged on its paired interval: up or down (a finding or
a slight change in that direction, beyond the interval), alike (the interval lies within a finding's
size either way) or unclear (neither, or no interval: the mean trajectories' reading is no verdict)"""

READINGS = ("finding", "slight", "like its parent", "unclear")
"""what a child's training did against its parent's, strongest first
(:attr:`TrajectoryComparison.reading`)"""


@dataclass(frozen=True)
class TrajectoryComparison:
    """A node's training trajectory against its parent's (:func:`compare_trajectories`)."""

    rows: tuple[TrajectoryRow, ...]
    large: tuple[tuple[str, str], ...]
    """(words, detail) per change a finding's size (and beyond its interval, where there is one)"""
    slight: tuple[tuple[str, str], ...]
    """(series and change, paired difference) per change beyond its interval, below a finding's
    size and at least SLIGHT of it"""
    alike: bool
    """paired, nothing large or slight, and every interval within a finding's size either way"""
    seeds: int
    """paired seeds behind the intervals (0: the mean trajectories read, no interval)"""
    series: tuple[tuple[str, str], ...] = ()
    """(series key, verdict) per series compared, by :data:`SERIES_VERDICTS`"""

    def verdict(self, key: str) -> str | None:
        """What one training series (``train/entropy``, ...) did against the parent's: a verdict of
        :data:`SERIES_VERDICTS`, None where the series was not compared."""
        return dict(self.series).get(key)

    @property
    def reading(self) -> str:
        """'finding', 'slight', 'like its parent' or 'unclear': the strongest of the readings."""
        if self.large:
            return "finding"
        if self.slight:
            return "slight"
        return "like its parent" if self.alike else "unclear"

    def findings(self) -> list[str]:
        out = [f"vs parent: {words} ({detail})" for words, detail in self.large]
        if self.slight:
            out.append(
                "vs parent: changed training slightly but consistently, below a finding's size "
                f"({'; '.join(f'{what}, {paired}' for what, paired in self.slight)}; over "
                f"{self.seeds} paired seeds)"
            )
        elif self.alike:
            out.append(
                "vs parent: trained like its parent (each series' paired difference lies, with "
                f"its 95% interval, within a finding's size, over {self.seeds} paired seeds): a "
                "metric's difference is the training noise of two runs unless beyond that "
                "metric's interval"
            )
        return out

    def summary(self) -> str:
        """One short line: what the child's training did differently ('' when nothing was read)."""
        if not self.rows:
            return ""
        parts = [words for words, _ in self.large]
        if self.slight:
            parts.append("slightly: " + ", ".join(what for what, _ in self.slight))
        if not parts:
            parts = [
                "like its parent"
                if self.alike
                else "no clear change"
                if self.seeds
                else "no change a finding's size"
            ]
        return "; ".join(parts) + ("" if self.seeds else " (a reading, no interval)")


def compare_trajectories(
    traj: dict[str, Any],
    parent_traj: dict[str, Any],
    tails: dict[int, dict[str, float]] | None = None,
    parent_tails: dict[int, dict[str, float]] | None = None,
) -> TrajectoryComparison:
    """A node's training trajectory against its parent's over :data:`TAIL`. Absolute findings such
    as an entropy collapse fire on a parent and its child alike; this says what the child's
    mechanism changed. With per-seed ``tails`` for both (:func:`seed_tails`) on at least 2 shared
    seeds, each series is compared seed by seed: the means are over those seeds, and a change is
    large only if it is as large as :data:`TRAJECTORY_VS_PARENT` asks *and* its paired difference's
    95% interval excludes zero. Changes beyond their interval but below that size (and at least
    :data:`SLIGHT` of it) are slight; where there is neither and every series' interval lies
    within a finding's size either way, the child trained like its parent (an equivalence, not
    merely no finding). Without per-seed tails (results recorded before them, or one seed) the two
    mean trajectories are compared: a reading, with no interval, and the size alone counts."""
    rows: list[TrajectoryRow] = []
    large: list[tuple[str, str]] = []
    slight: list[tuple[str, str]] = []
    series: list[tuple[str, str]] = []
    alike = True  # every interval within a finding's size either way
    for key, label, how, needs, (up, down) in TRAJECTORY_VS_PARENT:
        paired = _paired_tails(key, tails or {}, parent_tails or {})
        if paired is not None:
            a, b, iv, n = paired
        else:
            a, b = tail_mean(_series(traj, key)), tail_mean(_series(parent_traj, key))
            iv, n = None, 0
        if a is None or b is None:
            continue
        if how == "ratio":
            if b <= 1e-9 or a < 0:  # a ratio to or of a negative estimate (k1's KL) says nothing
                continue
            r = a / b
            change, big = f"x{r:.2f}", r >= needs or r <= 1 / needs
            material = abs(math.log(r)) >= SLIGHT * math.log(needs) if r > 0 else True
            words = up if r > 1 else down
            lo, hi = b / needs - b, b * needs - b
        else:
            d = a - b
            change, big = f"{d:+.3g}", abs(d) >= needs
            material = abs(d) >= SLIGHT * needs
            words = up if d > 0 else down
            lo, hi = -needs, needs
        rows.append((label, a, b, change, iv, n))
        beyond = iv is not None and (iv[0] > 0 or iv[1] < 0)
        within = iv is not None and lo < iv[0] and iv[1] < hi
        alike = alike and within
        paired_text = f"paired difference {a - b:+.3g} [{iv[0]:+.3g}, {iv[1]:+.3g}]" if iv else ""
        way = "up" if a > b else "down"
        if big and (beyond or iv is None):
            detail = f"{label} {change} over {TAIL}: {b:.3g} -> {a:.3g}"
            large.append((words, detail + (f"; {paired_text} over {n} seeds" if iv else "")))
            series.append((key, way if iv else "unclear"))
        elif beyond and material:
            slight.append((f"{label} {change}", paired_text))
            series.append((key, way))
        else:
            series.append((key, "alike" if within else "unclear"))
    seeds = max((r[5] for r in rows), default=0)
    return TrajectoryComparison(
        tuple(rows),
        tuple(large),
        tuple(slight),
        bool(seeds) and alike and not large and not slight,
        seeds,
        tuple(series),
    )


def compare_with_parent(
    result: EvaluationResult | None, parent_res: EvaluationResult | None
) -> TrajectoryComparison | None:
    """:func:`compare_trajectories` of two recorded results, with their per-seed tails; None unless
    both are there under the same protocol (:func:`comparable_parent`)."""
    if result is None or not comparable_parent(result, parent_res):
        return None
    return compare_trajectories(
        dict(result.trajectory),
        dict(parent_res.trajectory),
        seed_tails(result),
        seed_tails(parent_res),
    )


def training_vs_parent(result: EvaluationResult | None, parent_res: EvaluationResult | None) -> str:
    """One short line on what a node's training did differently from its parent's (the report's
    column): '' unless both have results under the same protocol."""
    c = compare_with_parent(result, parent_res)
    return c.summary() if c is not None else ""


def comparable_parent(node_res: EvaluationResult, parent_res: EvaluationResult | None) -> bool:
    """Both results are successful and the parent's is under the node's protocol: the only one
    compared with (a failed evaluation has no metrics to compare, and its unit lookups would say
    that two results of one protocol are of two)."""
    return (
        node_res.ok
        and parent_res is not None
        and parent_res.ok
        and comparable(node_res, parent_res)
    )


def metric_diagnostics(
    node_res: EvaluationResult, parent_res: EvaluationResult | None
) -> tuple[list[str], list[tuple]]:
    """(findings, table rows ``(metric, node, parent, delta, significant)``) of node vs parent metrics;
    the parent is compared only when its result is under the same protocol. A failed ``node_res``
    is its failure, with no rows."""
    nm = dict(node_res.metrics)
    if not node_res.ok:
        return [f"evaluation under {node_res.protocol.key} failed: {node_res.reason}"], []
    if not comparable_parent(node_res, parent_res):
        if parent_res is None:
            why = "no evaluated parent to compare with"
        elif not parent_res.ok:
            why = (
                f"the parent's evaluation under {parent_res.protocol.key} failed "
                f"({parent_res.reason}): not compared"
            )
        else:
            why = (
                f"the parent was evaluated under {parent_res.protocol.key}, not "
                f"{node_res.protocol.key}: not compared"
            )
        return [why], [(k, v, None, None, False) for k, v in sorted(nm.items())]
    pm = dict(parent_res.metrics)
    ni, pi = dict(node_res.intervals), dict(parent_res.intervals)
    rows, moved = [], []
    for k in sorted(set(nm) & set(pm)):
        a, b = float(nm[k]), float(pm[k])
        sig = False
        if k in ni and k in pi:
            sig = ni[k][0] > pi[k][1] or ni[k][1] < pi[k][0]
        elif k in ni:
            sig = not ni[k][0] <= b <= ni[k][1]
        elif k in pi:
            sig = not pi[k][0] <= a <= pi[k][1]
        rows.append((k, a, b, a - b, sig))
        if sig:
            moved.append(f"{k} {b:.4g} -> {a:.4g} ({a - b:+.4g}), beyond its 95% interval")
    out = moved or [
        "no metric moved beyond its 95% interval"
        if (ni or pi)
        else "no intervals recorded: changes are unqualified"
    ]
    if (
        "valid_rate" in nm
        and "valid_rate" in pm
        and abs(float(nm["valid_rate"]) - float(pm["valid_rate"])) >= 0.02
    ):
        out.append(f"valid rate {float(pm['valid_rate']):.3g} -> {float(nm['valid_rate']):.3g}")
    if "mean_length" in nm and "mean_length" in pm and float(pm["mean_length"]) > 0:
        r = float(nm["mean_length"]) / float(pm["mean_length"])
        if abs(r - 1) >= 0.1:
            out.append(
                f"mean length x{r:.2f} vs parent ({float(pm['mean_length']):.4g} -> {float(nm['mean_length']):.4g})"
            )
    return out, rows


def _fmt(v) -> str:
    return "—" if v is None else f"{v:.4g}"


def render_reflection(
    name: str,
    parent: str | None,
    findings: Sequence[str],
    traj_findings: Sequence[str],
    rows,
    narrative: str = "",
    traj_rows: Sequence[TrajectoryRow] = (),
    relative: Sequence[str] = (),
) -> str:
    """REFLECTION.md: the metrics and the training trajectory against the parent's, then the
    diagnostics (metric findings, trajectory findings, ``relative`` ones against the parent's
    trajectory) and the narrative."""
    lines = [f"# Reflection on {name}", ""]
    if rows:
        lines += [
            f"## Metrics vs parent {parent or '—'}",
            "",
            "| metric | node | parent | delta | beyond interval |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {k} | {_fmt(a)} | {_fmt(b)} | {_fmt(d)} | {'yes' if s else ''} |"
            for k, a, b, d, s in rows
        ]
        lines.append("")
    if traj_rows:
        n = max(r[5] for r in traj_rows)
        how = (
            f"at each of {n} paired seeds, with the 95% interval of the paired difference; a "
            "change is a finding when it is large enough and beyond that interval"
            if n
            else "averaged over the seeds; one trajectory each, so a reading, not a test"
        )
        lines += [
            f"## Training trajectory vs parent {parent or '—'}",
            "",
            f"Each series' mean over {TAIL}, {how}.",
            "",
            "| series | node | parent | change | paired difference [95% interval] |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {k} | {_fmt(a)} | {_fmt(b)} | {c} | "
            + (f"{a - b:+.3g} [{iv[0]:+.3g}, {iv[1]:+.3g}]" if iv else "—")
            + " |"
            for k, a, b, c, iv, _n in traj_rows
        ]
        lines.append("")
    quiet = (
        "trajectory: no entropy collapse, KL spike, plateau or length drift detected (or no "
        "trajectory recorded)"
    )
    diagnosed = list(findings) + (list(traj_findings) or [quiet]) + list(relative)
    lines += ["## Diagnostics", ""] + [f"- {f}" for f in diagnosed] + [""]
    if narrative:
        lines += ["## Mechanism-level analysis", "", narrative.strip(), ""]
    return "\n".join(lines)


def reflect_node(archive, name: str, cfg, llm=None) -> str:
    """Diagnose ``name`` against its parent, commit REFLECTION.md, log it to MLflow; returns the text."""
    ref = configured_protocol(cfg)
    nodes = archive.nodes(ref)
    if name not in nodes:
        archive.node(name)  # the one clear "unknown node" error
    node = nodes[name]
    result = node.result or (
        max(node.results.values(), key=lambda r: r.recorded_at) if node.results else None
    )
    if result is None:
        if node.status == "rejected":
            text = (
                f"# Reflection on {name}\n\n## Diagnostics\n\n- rejected before evaluation: "
                f"{node.trailer('Poise-Reason') or 'no reason recorded'}\n"
            )
            archive.record_reflection(name, text)
            return text
        raise PoiseError(
            f"node {name!r} has no result yet; evaluate it first (`poise-git evaluate {name}`)"
        )
    parent = node.parent
    parent_node = nodes.get(parent) if parent else None
    parent_res = None
    if parent_node is not None and parent_node.results:
        # the parent's result under the node's protocol; else its latest, which the diagnostics
        # name as another protocol's and do not compare with
        parent_res = parent_node.results.get(result.protocol.id) or max(
            parent_node.results.values(), key=lambda r: r.recorded_at
        )
    findings, rows = metric_diagnostics(result, parent_res)
    traj = trajectory_diagnostics(dict(result.trajectory))
    vs_parent = compare_with_parent(result, parent_res)
    relative = vs_parent.findings() if vs_parent is not None else []
    traj_rows = list(vs_parent.rows) if vs_parent is not None else []
    narrative = ""
    if llm is not None:
        diff = archive.parent_diff(name, ["algorithm.py"])[0] if parent else archive.algorithm(name)
        # the proposal, the code and the metric names in the findings are archive text: fenced
        prompt = (
            f"Node `{one_line(name, 120)}` (parent `{one_line(parent or '', 120)}`).\n\nProposal:\n"
            + fence(f"PROPOSAL.md of {name}", archive.read_file(name, "PROPOSAL.md") or "(none)")
            + "\n\nMechanism diff vs parent:\n"
            + fence(f"algorithm.py diff of {name}", diff, limit=6000)
            + "\n\nComputed diagnostics:\n"
            + fence("diagnostics", "\n".join(f"- {f}" for f in findings + traj + relative))
            + "\n\nWrite a short mechanism-level analysis (<= 200 words): which part of the mechanism most likely "
            "caused each finding, and one concrete next step. Plain Markdown, no headings."
        )
        narrative = llm.chat(
            [
                {
                    "role": "system",
                    "content": "You analyse RL-for-LLM training runs precisely and briefly. "
                    + UNTRUSTED_NOTE,
                },
                {"role": "user", "content": prompt},
            ],
            node=name,
            purpose="reflect",
        ).text
    text = render_reflection(name, parent, findings, traj, rows, narrative, traj_rows, relative)
    archive.record_reflection(name, text)
    _log_mlflow(archive, result, text)
    return text


def _log_mlflow(archive, result: EvaluationResult, text: str) -> None:
    run_ids = list(result.mlflow_run_ids)
    if not run_ids:
        return

    try:
        client = mlflow_client(archive.path)
    except TrackingUnavailable as exc:  # the reflection is committed; the server only mirrors it
        log.warning("the reflection is not attached to MLflow: %s", exc)
        return
    for rid in run_ids:
        try:
            # as git holds it: an LLM narrative may quote what its endpoint echoed, a key included
            client.log_text(rid, secrets.scrub(text), "REFLECTION.md")
            client.set_tag(rid, "poise.reflected", "yes")
        except Exception as exc:  # noqa: BLE001 - a missing run must not lose the committed reflection
            problem = unreachable(archive.path, fresh=True)  # the server died after the probe?
            if problem:  # said once; the other runs are not tried (each try costs MLflow's retries)
                log.warning("the reflection is not attached to MLflow: %s", problem)
                return
            log.warning("could not attach the reflection to MLflow run %s: %s", rid, exc)
