"""``poise-git report``: one self-contained HTML page (figures inline as SVG) and a table of every node.

Written to ``<archive>/.poise/report/`` by default (git-ignored: it is derived from the archive, which
stays the single source). Figures: the lineage coloured by utility; frontier vs depth (cumulative best,
top-3 mean per depth); training dynamics (reward, entropy, length) of the root and the best nodes;
accuracy vs length when the objective involves length. Each figure names what its numbers measured:
the protocol version and seeds of the ranked results, U's definition and the metrics' units. The
table gives each node's utility with its 95% interval, deltas vs the root and the parent, and the
noise-aware verdict vs its parent.
"""

from __future__ import annotations

import dataclasses
import html
import time
from pathlib import Path
from typing import Any

from engine.archive.confirmation import other_protocol_version, read_confirmations
from engine.archive.results import (
    configured_protocol,
    describe_elsewhere,
    protocols_with_results,
    rankable,
)
from engine.archive.store import ALGORITHM, Archive, earliest_root
from engine.config import REMEDY_MOVES, ExperimentConfig
from engine.loop.state import load_run
from engine.operators.proposers.offline import archive_remedy_trials
from engine.operators.proposers.remedies import REMEDIES, spent_remedies
from engine.operators.reflect import training_vs_parent
from engine.report import figures
from engine.report.write import write_whole
from engine.select import objective as obj
from engine.untrusted import visible

REPORT_DIR = Path(".poise") / "report"


def _h(value: object) -> str:
    """Archive text (names, reasons, code, diffs, metric names) for the page: control characters
    and bidi overrides shown as escapes (:func:`engine.untrusted.visible`), then HTML-escaped."""
    return html.escape(visible(str(value)))


def report_experiment(archive: Archive) -> ExperimentConfig:
    """The objective of the last run (it may override poise.toml), else poise.toml's."""
    exp = archive.config().experiment
    rec = load_run(archive)
    if rec is not None and isinstance(rec.get("experiment"), dict):
        fields = {f.name for f in dataclasses.fields(ExperimentConfig)}
        vals = {
            k: (tuple(v) if isinstance(v, list) else v)
            for k, v in rec.get("experiment").items()
            if k in fields
        }
        exp = dataclasses.replace(exp, **vals)
    return exp


def report_protocol(archive: Archive):
    """The protocol the last run ranked under (its plan may override poise.toml's backend and preset),
    else the one poise.toml defines."""
    cfg = archive.config()
    rec = load_run(archive)
    plan = rec.get("plan") if rec is not None else None
    plan = plan if isinstance(plan, dict) else {}
    if plan.get("backend") or plan.get("preset"):
        cfg = dataclasses.replace(
            cfg,
            evaluation=dataclasses.replace(
                cfg.evaluation, backend=plan.get("backend") or cfg.evaluation.backend
            ),
            proxy=dataclasses.replace(cfg.proxy, preset=plan.get("preset") or cfg.proxy.preset),
        )
    return configured_protocol(cfg)


def _f(v: Any, nd: int = 4) -> str:
    return "—" if v is None else f"{v:.{nd}g}" if isinstance(v, float) else _h(str(v))


def _delta(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "—"
    d = a - b
    cls = "pos" if d > 0 else "neg" if d < 0 else ""
    return f'<span class="{cls}">{d:+.4f}</span>'


def node_rows(nodes, exp: ExperimentConfig) -> list[dict[str, Any]]:
    root = nodes.get(earliest_root(nodes) or "")
    u_root = obj.node_utility(root, exp)
    rows = []
    for n in sorted(nodes.values(), key=lambda n: (n.depth, n.created)):
        u = obj.node_utility(n, exp)
        parent = nodes.get(n.parent) if n.parent else None
        rows.append(
            {
                "node": n.name,
                "depth": n.depth,
                "parents": list(n.parents),
                "status": n.status,
                "round": n.trailer("Poise-Round"),
                "proposer": n.trailer("Poise-Proposer"),
                "utility": u,
                "interval": obj.utility_interval(n, exp) if u is not None else None,
                "objective": n.metrics.get(exp.objective),
                "mean_length": n.metrics.get("mean_length"),
                "delta_root": None if u is None or u_root is None else u - u_root,
                "delta_parent": None
                if u is None or obj.node_utility(parent, exp) is None
                else u - obj.node_utility(parent, exp),
                "vs_parent": obj.promotion(n, parent, exp) if parent is not None else "",
                # what its training did differently from the parent's (the reflection's reading)
                "training": training_vs_parent(
                    n.result, parent.result if parent is not None else None
                ),
                "vs_root": obj.promotion(n, root, exp)
                if root is not None and n is not root
                else "",
                "reason": n.trailer("Poise-Reason")
                or (n.result.reason if n.result is not None else "")
                or "",
            }
        )
    return rows


_CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{margin-bottom:0}.sub{color:#666;margin-top:4px}figure{margin:18px 0}.fig{overflow-x:auto;border:1px solid #eee}
.fig svg{height:auto;max-width:none}.legend{font-size:12px}
table{border-collapse:collapse;font-size:13px}td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left}
th{background:#f4f6f8}.pos{color:#08753a}.neg{color:#b00020}.better{font-weight:bold;color:#08753a}
.worse{color:#b00020}pre{background:#f7f7f7;padding:10px;overflow-x:auto;font-size:12px}
.kv td{border:none;padding:2px 10px 2px 0}"""


def render_report(
    archive: Archive,
    out_dir: str | Path | None = None,
    experiment: ExperimentConfig | None = None,
    top: int = 3,
) -> Path:
    """Write ``index.html`` (one file, figures inline, nothing fetched); returns the page's path."""
    out = Path(out_dir) if out_dir else archive.path / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    for stem in ("lineage", "frontier", "dynamics", "accuracy_length"):  # figures of older versions
        for ext in ("svg", "png"):
            (out / f"{stem}.{ext}").unlink(missing_ok=True)
    exp = experiment or report_experiment(archive)
    ref = report_protocol(archive)
    nodes = archive.nodes(ref)
    searched = {k: n.result for k, n in nodes.items()}  # what a confirmation re-measured
    root = earliest_root(nodes)
    # one ranking: results of another protocol version or unit (possible under an id without a
    # hash, e.g. a recorded lab/v1) are shown apart, never ranked with the rest
    keep, apart = rankable(
        {k: n.result for k, n in nodes.items() if n.evaluated}, exp.objective, prefer=root
    )
    nodes = {k: dataclasses.replace(n, result=None) if k in apart else n for k, n in nodes.items()}
    ranked = obj.ranked(nodes, exp)
    best = ranked[0][0] if ranked else None
    about, units = _measured(nodes, keep)
    under = f" Measured under {about}." if about else ""
    figs: list[tuple[str, str | None, str]] = [
        (
            "Lineage",
            figures.lineage(nodes, exp, about=about, units=units),
            "Every node at its depth, coloured by utility (its mean over its seeds; the interval is "
            f"in the table); dashed edges are crossover parents.{under}",
        ),
        (
            "Frontier vs depth",
            figures.frontier(nodes, exp, about=about, units=units),
            "Cumulative best utility up to each depth and the mean of the top 3 at that depth."
            + under,
        ),
        (
            "Training dynamics",
            figures.dynamics(
                nodes, [k for k in [root] + [k for k, _ in ranked[:top]] if k], about=about
            ),
            "Reward, entropy and response length along RL training (results.json trajectories)."
            + under,
        ),
    ]
    if obj.has_length_objective(exp):
        figs.append(
            (
                "Accuracy vs length",
                figures.accuracy_length(nodes, exp, about=about, units=units),
                f"{exp.objective} against mean response length; the Pareto front in red.{under}",
            )
        )
    rows = node_rows(nodes, exp)
    rec = load_run(archive)
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>poise-git report: {_h(exp.name)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>poise-git report — {_h(exp.name)}</h1>",
        f"<p class='sub'>{_h(str(archive.path))} · generated {time.strftime('%Y-%m-%d %H:%M:%S')}</p>",
        "<table class='kv'>",
        _kv("objective", obj.describe_objective(exp)),
        _kv("protocol", _protocol_line(ref, nodes, keep)),
    ]
    if apart:
        parts.append(
            _kv(
                "not ranked here",
                "; ".join(f"{k}: {why}" for k, why in sorted(apart.items()))
                + " (another protocol version or unit than the ranked results)",
            )
        )
    if exp.directive:
        parts.append(_kv("directive", exp.directive))
    counts = {
        s: sum(1 for n in nodes.values() if n.status == s)
        for s in ("evaluated", "failed", "rejected", "verified", "spawned")
    }
    parts.append(
        _kv("nodes", f"{len(nodes)} ({', '.join(f'{v} {k}' for k, v in counts.items() if v)})")
    )
    if best:
        u_root = obj.node_utility(nodes.get(root or ""), exp)
        vs_root = ""
        if u_root is not None and best != root:
            verdict = obj.promotion(nodes[best], nodes[root], exp)
            vs_root = f" (root {u_root:.4f}; {obj.promotion_phrase(verdict, 'the root')})"
        parts.append(_kv("best", f"{best}: U {ranked[0][1]:.4f}{vs_root}"))
    if rec is not None:
        plan = rec.get("plan") if isinstance(rec.get("plan"), dict) else {}
        first, rounds = plan.get("start_round", 1), plan.get("rounds", 1)
        last = first + rounds - 1 if all(type(v) is int for v in (first, rounds)) else "?"
        parts.append(
            _kv(
                "last run",
                f"{rec.get('id')}: rounds {first}–{last}, "
                f"{plan.get('parents')} parents × {plan.get('population')} candidates, {plan.get('seeds')} seed(s), "
                f"{rec.get('status')}: {rec.get('stop_reason') or ''}",
            )
        )
    parts.append("</table>")
    for title, svg, caption in figs:
        if svg:
            parts.append(
                f"<figure><h2>{_h(title)}</h2><div class='fig'>{svg}</div>"
                f"<figcaption>{_h(caption)}</figcaption></figure>"
            )
            if title == "Lineage" and len(nodes) > figures.NAMED_LINEAGE:
                parts.append(_legend(nodes, exp))
        else:
            parts.append(f"<h2>{_h(title)}</h2><p class='sub'>no data yet</p>")
    parts.append(_rounds(nodes, rows))
    parts.append(
        "<h2>Nodes</h2><p class='sub'>U with its 95% interval; a child is <b>better</b> than its parent only when its "
        "interval lies wholly above the parent's (<i>within noise</i> otherwise; <i>no interval</i> with one seed). "
        "<i>Training vs parent</i>: what its training did differently from its parent's over the last third "
        "of training, seed by seed (the reflection's reading; <i>like its parent</i>: every series within "
        "a finding's size, interval and all).</p>"
    )
    parts.append(_table(rows, exp))
    parts.append(_remedies(archive, nodes))
    confirmations = read_confirmations(archive, nodes, ref.id)
    if confirmations:
        apart = {
            k: other_protocol_version(c, ref, searched.get(k)) for k, c in confirmations.items()
        }
        parts.append(_confirmations(confirmations, apart))
    shown = best if best != root else next((k for k, _ in ranked if k != root), None)
    if shown and root:
        what = "the best node" if shown == best else "the best candidate (the root remains best)"
        diff = archive.diff(root, shown, [ALGORITHM])
        parts.append(
            f"<h2>Mechanism of {what}: {_h(shown)} vs the root</h2>"
            f"<pre>{_h(diff or '(no change)')}</pre>"
        )
    parts.append("</body></html>")
    page = out / "index.html"
    write_whole(page, "\n".join(parts))  # never a half-written page, however the command ends
    return page


def _remedies(archive: Archive, nodes) -> str:
    """The diagnosis's remedies: each one's trials in this archive (the children that applied it
    against a parent's finding, judged on the series it is meant to move) and whether the offline
    proposer still directs mutations to it; '' for another proposer, with the direction off, or
    before any trial."""
    p = archive.config().propose
    if p.proposer != "offline" or p.directed <= 0:
        return ""
    trials = archive_remedy_trials(archive, nodes)
    if not trials:
        return ""
    spent = spent_remedies(trials, tuple(REMEDIES), p.remedy_trials)
    out = [
        "<h2>Remedies of the diagnosis</h2><p class='sub'>Each child that applied a remedy of its "
        "parent's entropy collapse, judged on the policy's entropy against its parent's, seed by "
        "seed: <i>up</i> or <i>down</i> (beyond the paired 95% interval), <i>alike</i> (the "
        "interval within a finding's size either way) or <i>unclear</i>. The offline proposer "
        f"stops directing mutations to a remedy after {p.remedy_trials} trials judged alike or "
        "down and none up (<code>[propose].remedy_trials</code>; 0: never).</p>",
        "<table><tr><th>remedy</th><th>up</th><th>alike</th><th>down</th><th>unclear</th>"
        "<th>trials</th><th>directed to</th></tr>",
    ]
    for move in REMEDY_MOVES:
        mine = [t for t in trials if move in t.moves]
        counts = "".join(
            f"<td>{sum(t.verdict == v for t in mine)}</td>"
            for v in ("up", "alike", "down", "unclear")
        )
        state = (
            "no: not in [propose].remedies"
            if move not in p.remedies
            else f"no, spent: {spent[move]}"
            if move in spent
            else "yes"
        )
        names = ", ".join(t.node for t in mine) or "—"
        out.append(f"<tr><td>{move}</td>{counts}<td>{_h(names)}</td><td>{_h(state)}</td></tr>")
    out.append("</table>")
    return "".join(out)


def _confirmations(confs: dict[str, Any], apart: dict[str, str]) -> str:
    """Held-out confirmations: each node against its reference at seeds the search never used, with
    the protocol version it measured; one of another version than the page's (``apart``: node -> the
    page's version's key) is marked so, and listed after the others."""

    def span(mean, iv) -> str:
        return (
            f"{mean:+.4f}" + (f" [{iv[0]:+.4f}, {iv[1]:+.4f}]" if iv else "")
            if mean is not None
            else "—"
        )

    out = [
        "<h2>Held-out confirmations</h2><p class='sub'>Each node and its reference trained and scored "
        "again at seeds the search never used (<code>poise-git confirm</code>): the paired difference "
        "of U there with its 95% interval, beside the one the search read, and the protocol version "
        "both were measured under. One measured under another version of the protocol than this "
        "page's results is marked so: its numbers are not comparable with them. The selection never "
        "reads these.</p>",
        "<table><tr><th>node</th><th>against</th><th>protocol</th><th>held-out seeds</th>"
        "<th>held-out difference</th><th>verdict</th><th>the search's difference (seeds)</th></tr>",
    ]
    for name, c in sorted(confs.items(), key=lambda kv: (bool(apart.get(kv[0])), kv[0])):
        sd = c.search_difference
        search = f"{span(sd[0], sd[1])} ({_h(str(sd[2]))})" if sd else "—"
        verdict = c.verdict + (f": {c.reason}" if c.reason else "")
        protocol = _h(c.protocol.key)
        if apart.get(name):
            protocol += (
                f" <span class='worse'>(another version than this page's {_h(apart[name])})</span>"
            )
        out.append(
            f"<tr><td>{_h(name)}</td><td>{_h(c.against)}</td>"
            f"<td>{protocol}</td><td>{', '.join(map(str, c.seeds))}</td>"
            f"<td>{span(c.difference, c.interval)}</td>"
            f"<td>{_h(verdict)}</td><td>{search}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def _legend(nodes, exp: ExperimentConfig) -> str:
    """The lineage figure's ids: id, node, depth, status, U (the figure labels nodes by id)."""
    ids = figures.lineage_ids(nodes)
    out = [
        "<details open><summary>Lineage legend (figure ids)</summary><table class='legend'>"
        "<tr><th>id</th><th>node</th><th>depth</th><th>status</th><th>U</th></tr>"
    ]
    for name, i in sorted(ids.items(), key=lambda kv: kv[1]):
        n = nodes[name]
        out.append(
            f"<tr><td>{i}</td><td>{_h(name)}</td><td>{n.depth}</td>"
            f"<td>{_h(n.status)}</td><td>{_f(obj.node_utility(n, exp))}</td></tr>"
        )
    out.append("</table></details>")
    return "\n".join(out)


def _measured(nodes, keep: set[str]) -> tuple[str, dict[str, str]]:
    """What the figures' numbers measured: the protocol key(s) and seed counts of the ranked results
    (``proxy/default@1a2b3c4d5e6f, 3 seeds each``; '' when none is ranked), and each metric's unit
    as they record it."""
    results = [nodes[k].result for k in sorted(keep) if nodes[k].result is not None]
    if not results:
        return "", {}
    counts = sorted({len(r.seeds) for r in results})
    seeds = (
        f"{counts[0]} seed{'s' if counts[0] != 1 else ''} each"
        if len(counts) == 1
        else f"{counts[0]}-{counts[-1]} seeds per node"
    )
    units: dict[str, str] = {}
    for r in results:
        for metric, unit in r.units.items():
            units.setdefault(metric, unit)
    return f"{', '.join(_ranked_keys(nodes, keep))}, {seeds}", units


def _ranked_keys(nodes, keep: set[str]) -> list[str]:
    """The protocol keys (``id@hash``) of the ranked nodes' results."""
    return sorted({nodes[k].result.protocol.key for k in keep if nodes[k].result is not None})


def _protocol_line(ref, nodes, keep: set[str]) -> str:
    """What the report ranks under: the protocol (with the hash of its ranked results where the
    reference names none) and the other protocols nodes have results under."""
    keys = _ranked_keys(nodes, keep)
    text = ", ".join(keys) if keys else f"{ref.key} (no node has a result under it)"
    others = protocols_with_results(nodes, besides=ref.matches)
    if others:
        text += "; also results under " + describe_elsewhere(others, ref.id)
    return text


def _kv(k: str, v: str) -> str:
    return f"<tr><td><b>{_h(k)}</b></td><td>{_h(v)}</td></tr>"


def _table(rows: list[dict[str, Any]], exp: ExperimentConfig) -> str:
    head = [
        "node",
        "depth",
        "parent(s)",
        "round",
        "status",
        "U",
        "95% interval",
        exp.objective,
        "mean length",
        "Δ vs root",
        "Δ vs parent",
        "vs parent",
        "training vs parent",
        "reason",
    ]
    out = ["<table><tr>" + "".join(f"<th>{_h(h)}</th>" for h in head) + "</tr>"]
    for r in rows:
        iv = r["interval"]
        verdict = r["vs_parent"]
        cls = "better" if verdict == obj.BETTER else "worse" if verdict == obj.WORSE else ""
        cells = [
            _h(r["node"]),
            str(r["depth"]),
            _h(", ".join(r["parents"]) or "—"),
            _f(r["round"]),
            _h(r["status"]),
            _f(r["utility"]),
            f"[{iv[0]:.4f}, {iv[1]:.4f}]" if iv else "—",
            _f(r["objective"]),
            _f(r["mean_length"]),
            _delta(
                r["utility"], None if r["delta_root"] is None else r["utility"] - r["delta_root"]
            ),
            _delta(
                r["utility"],
                None if r["delta_parent"] is None else r["utility"] - r["delta_parent"],
            ),
            f"<span class='{cls}'>{_h(verdict)}</span>",
            _h(r["training"] or "—"),
            _h(r["reason"][:160]),
        ]
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _rounds(nodes, rows: list[dict[str, Any]]) -> str:
    """Per loop round: the parents (selection rank and score), the children's outcome, the best child."""
    by_round: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        try:
            by_round.setdefault(int(r["round"]), []).append(r)
        except (TypeError, ValueError):
            continue
    if not by_round:
        return ""
    out = [
        "<h2>Rounds</h2><table><tr><th>round</th><th>parents (rank: selection score)</th><th>children</th>"
        "<th>best child (U)</th><th>better than parent</th></tr>"
    ]
    for rnd in sorted(by_round):
        kids = by_round[rnd]
        parents = {}
        for k in kids:
            n = nodes[k["node"]]
            if n.parent:
                parents[n.parent] = (
                    n.trailer("Poise-Selection-Rank") or "?",
                    n.trailer("Poise-Selection-Score") or "—",
                )

        def by_rank(kv) -> tuple:  # ranks are numbers ("10" after "2"); unranked ("?") last
            rank = kv[1][0]
            return (0, int(rank), kv[0]) if rank.isdigit() else (1, 0, kv[0])

        ptxt = ", ".join(
            f"{_h(p)} ({_h(rk)}: {_h(sc)})" for p, (rk, sc) in sorted(parents.items(), key=by_rank)
        )
        status = {}
        for k in kids:
            status[k["status"]] = status.get(k["status"], 0) + 1
        scored = [k for k in kids if k["utility"] is not None]
        best = max(scored, key=lambda k: k["utility"]) if scored else None
        best_txt = f"{_h(best['node'])} ({best['utility']:.4f})" if best else "—"
        better = [k["node"] for k in kids if k["vs_parent"] == obj.BETTER]
        counts = ", ".join(f"{v} {st}" for st, v in sorted(status.items()))
        out.append(
            f"<tr><td>{rnd}</td><td>{ptxt}</td><td>{_h(counts)}</td><td>{best_txt}</td>"
            f"<td>{_h(', '.join(better)) or '—'}</td></tr>"
        )
    out.append("</table>")
    return "\n".join(out)
