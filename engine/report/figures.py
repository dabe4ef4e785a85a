"""The report's figures (matplotlib, Agg): each function draws one figure from archived nodes and
returns it as inline SVG text (text kept as text, so node names stay searchable and copyable), or
None when there is no data. Nothing is written to disk: the page embeds them (one self-contained file).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from engine.select import objective as obj
from engine.untrusted import visible

DYNAMICS = (
    ("train/reward_mean", "reward (mean)"),
    ("train/entropy", "entropy"),
    ("train/response_length", "response length"),
)
NAMED_LINEAGE = 12
"""a lineage of at most this many nodes is labelled with names; larger ones with ids and a legend"""


def _plt():
    import matplotlib  # lazy: matplotlib is heavy (only this path needs it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib is heavy (only this path needs it)

    return plt


def _save(fig, stem: str) -> str:
    """The figure as an ``<svg>`` element; ids are salted with ``stem`` so that several figures can
    share one page without clashing clip paths."""
    import matplotlib  # lazy: matplotlib is heavy (only this path needs it)

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"poise-{stem}"}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    _plt().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _plain(text: str) -> str:
    """``text`` drawn as written: a ``$`` would start math mode (a metric named ``a$\\frac$`` fails
    to draw)."""
    return text.replace("$", r"\$")


def _unit(units: Mapping[str, str] | None, metric: str) -> str:
    """`` (unit)`` of ``metric`` as its results record it, or '' when they name none."""
    unit = (units or {}).get(metric)
    return f" ({unit})" if unit else ""


def _utility_axis(exp, units: Mapping[str, str] | None) -> str:
    """What U is, in the objective's unit: ``U = overall (fraction)``, ``U = overall -
    0.002*mean_length (fraction)``."""
    return _plain(f"U = {obj.utility_label(exp)}{_unit(units, exp.objective)}")


def _titled(title: str, about: str) -> str:
    """The figure's title over what its numbers measured (protocol, seeds)."""
    return _plain(f"{title}\n{about}" if about else title)


def _layout(nodes: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """x: leaves in depth-first order, a parent centred over its children; y: -depth."""
    kids: dict[str, list[str]] = {}
    roots = []
    for n in sorted(nodes.values(), key=lambda n: n.created):
        if n.parents and n.parents[0] in nodes:
            kids.setdefault(n.parents[0], []).append(n.name)
        else:
            roots.append(n.name)
    pos: dict[str, tuple[float, float]] = {}
    nxt = [0.0]

    def place(name: str) -> float:
        cs = kids.get(name, [])
        if not cs:
            x = nxt[0]
            nxt[0] += 1.0
        else:
            xs = [place(c) for c in cs]
            x = sum(xs) / len(xs)
        pos[name] = (x, -float(nodes[name].depth))
        return x

    for r in roots:
        place(r)
    return pos


def lineage_ids(nodes: Mapping[str, Any]) -> dict[str, int]:
    """Figure ids of a large lineage: 1, 2, ... in creation order (the page's legend lists them)."""
    order = sorted(nodes.values(), key=lambda n: (n.created, n.name))
    return {n.name: i for i, n in enumerate(order, 1)}


def lineage(
    nodes: Mapping[str, Any], exp, *, about: str = "", units: Mapping[str, str] | None = None
) -> str | None:
    """Every node at its depth, coloured by utility. Up to NAMED_LINEAGE nodes carry their names;
    beyond, each carries its id (``lineage_ids``) so labels stay short enough not to overlap.
    ``about``: what the utilities measured (protocol, seeds), under the title; ``units``: each
    metric's unit, on the colour bar."""
    if not nodes:
        return None
    plt = _plt()
    pos = _layout(nodes)
    leaves = max(x for x, _ in pos.values()) + 1
    named = len(nodes) <= NAMED_LINEAGE
    longest = max(len(k) for k in nodes) if named else len(str(len(nodes)))
    per_leaf = max(0.45, 0.075 * longest + 0.15)  # inches: a label's width at 7 pt
    width = max(6.0, per_leaf * leaves + 1.5)
    depth = max(n.depth for n in nodes.values())
    fig, ax = plt.subplots(figsize=(width, 1.6 + 1.1 * (depth + 1)))
    for n in nodes.values():
        for i, p in enumerate(n.parents):
            if p in pos:
                (x0, y0), (x1, y1) = pos[p], pos[n.name]
                ax.plot(
                    [x0, x1], [y0, y1], color="#999", lw=1, ls="-" if i == 0 else "--", zorder=1
                )
    scored = {k: obj.node_utility(n, exp) for k, n in nodes.items()}
    vals = [u for u in scored.values() if u is not None]
    if vals:
        names = [k for k, u in scored.items() if u is not None]
        sc = ax.scatter(
            [pos[k][0] for k in names],
            [pos[k][1] for k in names],
            c=[scored[k] for k in names],
            cmap="viridis",
            s=160,
            edgecolors="black",
            zorder=3,
            vmin=min(vals),
            vmax=max(vals) if max(vals) > min(vals) else min(vals) + 1e-9,
        )
        fig.colorbar(
            sc,
            ax=ax,
            label=_utility_axis(exp, units),
            shrink=0.8,
        )
    other = [k for k, u in scored.items() if u is None]
    if other:
        ax.scatter(
            [pos[k][0] for k in other],
            [pos[k][1] for k in other],
            marker="X",
            s=110,
            color="#bbb",
            edgecolors="#555",
            zorder=3,
            label="failed / rejected / not evaluated",
        )
        ax.legend(loc="lower right", fontsize=8)
    ids = None if named else lineage_ids(nodes)
    for k, (x, y) in pos.items():
        ax.annotate(
            visible(k) if ids is None else str(ids[k]),
            (x, y),
            xytext=(0, 9),
            textcoords="offset points",
            ha="center",
            fontsize=7,
        )
    ax.set_yticks([-d for d in range(depth + 1)], [str(d) for d in range(depth + 1)])
    ax.set_ylabel("depth")
    ax.set_xticks([])
    ax.set_title(
        _titled(
            "Lineage (colour: utility)" + ("" if named else "; labels are ids, see the legend"),
            about,
        )
    )
    ax.margins(x=0.5 / max(leaves, 1) + 0.02, y=0.2)
    return _save(fig, "lineage")


def frontier(
    nodes: Mapping[str, Any], exp, *, about: str = "", units: Mapping[str, str] | None = None
) -> str | None:
    """Cumulative best U up to each depth and the mean of the top 3 at it (``about``, ``units``: as
    :func:`lineage`)."""
    by_depth: dict[int, list[float]] = {}
    for n in nodes.values():
        u = obj.node_utility(n, exp)
        if u is not None:
            by_depth.setdefault(n.depth, []).append(u)
    if not by_depth:
        return None
    plt = _plt()
    depths = list(range(max(by_depth) + 1))
    best, top3, run = [], [], float("-inf")
    for d in depths:
        us = sorted(by_depth.get(d, []), reverse=True)
        run = max([run] + us)
        best.append(run)
        top3.append(sum(us[:3]) / len(us[:3]) if us else float("nan"))
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for d, us in by_depth.items():
        ax.scatter([d] * len(us), us, color="#cfd8e3", s=25, zorder=1)
    ax.plot(depths, best, "o-", color="#1f77b4", label="cumulative best", zorder=3)
    ax.plot(depths, top3, "s--", color="#ff7f0e", label="top-3 mean at depth", zorder=3)
    ax.set_xlabel("depth")
    ax.set_ylabel(_utility_axis(exp, units))
    ax.set_xticks(depths)
    ax.set_title(_titled("Frontier vs depth", about))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, "frontier")


def dynamics(nodes: Mapping[str, Any], names: list[str], *, about: str = "") -> str | None:
    """Reward, entropy and response length along RL training of ``names`` (``about``: the protocol
    the trajectories were recorded under)."""
    series = {
        k: dict(nodes[k].result.trajectory) if nodes[k].result is not None else {}
        for k in names
        if k in nodes
    }
    series = {
        k: t for k, t in series.items() if t.get("step") and any(t.get(key) for key, _ in DYNAMICS)
    }
    if not series:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(DYNAMICS), figsize=(13, 3.6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, label) in zip(axes, DYNAMICS):
        for i, (k, t) in enumerate(series.items()):
            ys = [float(y) for y in (t.get(key) or [])]
            if ys:
                steps = t["step"][: len(ys)]
                ys = ys[: len(steps)]
                c = colors[i % len(colors)]
                ax.plot(steps, ys, color=c, lw=0.8, alpha=0.25)
                ax.plot(steps, _smooth(ys), color=c, lw=1.8, label=visible(k))
        ax.set_title(label)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        _titled(
            "Training dynamics: the root and the best nodes (faint: per step; solid: moving mean)",
            about,
        )
    )
    return _save(fig, "dynamics")


def _smooth(ys: list[float]) -> list[float]:
    """Trailing moving mean over ~1/10 of the series (at least 1 point)."""
    w = max(1, len(ys) // 10)
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= w:
            acc -= ys[i - w]
        out.append(acc / min(i + 1, w))
    return out


def accuracy_length(
    nodes: Mapping[str, Any], exp, *, about: str = "", units: Mapping[str, str] | None = None
) -> str | None:
    """The objective against mean response length, with the Pareto front (``about``, ``units``: as
    :func:`lineage`)."""
    pts = {
        k: (float(n.metrics[exp.objective]), float(n.metrics["mean_length"]))
        for k, n in nodes.items()
        if n.evaluated and exp.objective in n.metrics and "mean_length" in n.metrics
    }
    if not pts:
        return None
    plt = _plt()
    front = obj.pareto_front({k: (a, -ln) for k, (a, ln) in pts.items()})
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.scatter(
        [ln for _, ln in pts.values()],
        [a for a, _ in pts.values()],
        color="#9aa9bb",
        s=30,
        label="nodes",
    )
    fr = sorted((pts[k] for k in front), key=lambda p: p[1])
    ax.plot([ln for _, ln in fr], [a for a, _ in fr], "o-", color="#d62728", label="Pareto front")
    for k in front:
        ax.annotate(
            k, (pts[k][1], pts[k][0]), xytext=(4, 4), textcoords="offset points", fontsize=7
        )
    roots = [k for k, n in nodes.items() if not n.parents and k in pts]
    for k in roots:
        ax.scatter(
            [pts[k][1]],
            [pts[k][0]],
            marker="*",
            s=220,
            color="gold",
            edgecolors="black",
            zorder=4,
            label=f"root ({k})",
        )
    ax.set_xlabel(_plain(f"mean response length{_unit(units, 'mean_length')}"))
    ax.set_ylabel(_plain(exp.objective + _unit(units, exp.objective)))
    ax.set_title(_titled("Accuracy vs length", about))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, "accuracy_length")
