"""The experiment's objective as the loop and the report use it: utility, its interval, noise-aware
promotion, the Pareto front, and the ``--objective`` syntax.

U(y) = y[objective] - length_penalty * y[mean_length] (``engine.config.utility``). Its 95% interval is the
objective's interval shifted by the same length term (the length is treated as known).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

from engine.archive.results import comparable
from engine.config import ExperimentConfig, metric_direction, utility
from engine.errors import ConfigError
from engine.select.pareto import parse_objectives
from engine.stats import paired_interval

_METRIC = r"[A-Za-z_][A-Za-z0-9_@/.:-]*"
_PENALIZED = re.compile(rf"^\s*({_METRIC})\s*-\s*([0-9.eE+-]+)\s*\*\s*mean_length\s*$")
_PARETO = re.compile(r"^\s*pareto\s*\((.*)\)\s*$")

BETTER, WORSE, WITHIN, UNRESOLVED, NOT_EVALUATED = (
    "better",
    "worse",
    "within noise",
    "no interval",
    "not evaluated",
)


def parse_objective(text: str) -> dict[str, Any]:
    """``overall`` | ``overall - 0.002*mean_length`` | ``pareto(overall, -mean_length)`` -> the
    ExperimentConfig fields it sets (``objective``, ``length_penalty``, ``pareto_objectives``)."""
    text = (text or "").strip()
    if not text:
        raise ConfigError("--objective is empty")
    m = _PARETO.match(text)
    if m:
        metrics = tuple(p.strip() for p in m.group(1).split(",") if p.strip())
        if len(metrics) < 2 or not all(re.fullmatch(rf"-?{_METRIC}", p) for p in metrics):
            raise ConfigError(
                f"--objective {text!r}: pareto(...) needs two or more metric names, e.g. pareto(overall, -mean_length)"
            )
        first = (
            next(p for p in metrics if not p.startswith("-"))
            if any(not p.startswith("-") for p in metrics)
            else "overall"
        )
        return {"objective": first, "pareto_objectives": metrics}
    m = _PENALIZED.match(text)
    if m:
        try:
            lam = float(m.group(2))
        except ValueError:
            raise ConfigError(f"--objective {text!r}: bad length penalty {m.group(2)!r}") from None
        if lam < 0:
            raise ConfigError(f"--objective {text!r}: the length penalty must be >= 0")
        return {"objective": m.group(1), "length_penalty": lam}
    if re.fullmatch(_METRIC, text):
        return {"objective": text}
    raise ConfigError(
        f"--objective {text!r} not understood; use METRIC, 'METRIC - L*mean_length' or 'pareto(M1, -M2)'"
    )


def with_objective(
    exp: ExperimentConfig, text: str | None = None, directive: str | None = None
) -> ExperimentConfig:
    changes: dict[str, Any] = parse_objective(text) if text else {}
    if directive is not None:
        changes["directive"] = directive
    return dataclasses.replace(exp, **changes) if changes else exp


def describe_objective(exp: ExperimentConfig) -> str:
    """A one-line statement of the objective, e.g. ``maximize overall - 0.002*mean_length``."""
    verb = "minimize" if metric_direction(exp.objective, exp)[0] == "min" else "maximize"
    s = f"{verb} {exp.objective}" + (
        f" - {exp.length_penalty:g}*mean_length" if exp.length_penalty else ""
    )
    if exp.pareto_objectives:
        s += f"; Pareto over ({', '.join(exp.pareto_objectives)})"
    return s


def utility_label(exp: ExperimentConfig) -> str:
    """What U measures, as a column or key names it: ``overall``, ``overall - 0.002*mean_length``,
    ``-mean_length`` (a minimized objective: U is always higher-is-better)."""
    # U's own sign rule (engine.config.utility): a minimized objective enters U negated
    minimized = utility({exp.objective: 1.0}, dataclasses.replace(exp, length_penalty=0.0)) < 0
    return (
        ("-" if minimized else "")
        + exp.objective
        + (f" - {exp.length_penalty:g}*mean_length" if exp.length_penalty else "")
    )


def has_length_objective(exp: ExperimentConfig) -> bool:
    return bool(exp.length_penalty) or any(
        p.lstrip("-") == "mean_length" for p in exp.pareto_objectives
    )


def node_utility(node: Any, exp: ExperimentConfig) -> float | None:
    if node is None or not node.evaluated:
        return None
    return utility(node.metrics, exp)


def utility_interval(node: Any, exp: ExperimentConfig) -> tuple[float, float] | None:
    """The 95% interval of U, from the objective's recorded interval; None when unknown."""
    if node is None or node.result is None:
        return None
    iv = node.result.interval(exp.objective)
    if iv is None:
        return None
    shift = 0.0
    if exp.length_penalty and "mean_length" in node.metrics:
        shift = exp.length_penalty * float(node.metrics["mean_length"])
    return float(iv[0]) - shift, float(iv[1]) - shift


def promotion(child: Any, parent: Any, exp: ExperimentConfig) -> str:
    """Noise-aware comparison: ``better`` only when the child's interval lies wholly above the parent's,
    ``worse`` when wholly below, else ``within noise``; ``no interval`` when either lacks one."""
    if node_utility(child, exp) is None or node_utility(parent, exp) is None:
        return NOT_EVALUATED
    a, b = utility_interval(child, exp), utility_interval(parent, exp)
    if a is None or b is None:
        return UNRESOLVED
    if a[0] > b[1]:
        return BETTER
    if a[1] < b[0]:
        return WORSE
    return WITHIN


def promotion_phrase(verdict: str, other: str) -> str:
    """A :func:`promotion` verdict against ``other`` as words: ``better than the root``, ``worse
    than the root``, ``within noise of the root``, ``no interval to compare with the root``; another
    verdict as ``VERDICT vs OTHER``."""
    phrases = {
        BETTER: f"better than {other}",
        WORSE: f"worse than {other}",
        WITHIN: f"within noise of {other}",
        UNRESOLVED: f"no interval to compare with {other}",
    }
    return phrases.get(verdict, f"{verdict} vs {other}")


def paired_difference(
    child: Any, parent: Any, exp: ExperimentConfig
) -> tuple[float, tuple[float, float] | None, int] | None:
    """U(child) - U(parent) over the paired seeds both were evaluated at: (mean difference, its 95%
    Student-t interval or None below two seeds, number of seeds); None when nothing is shared
    (:func:`engine.stats.paired_interval`; compare :func:`promotion`, which uses the two nodes' own
    intervals)."""

    def per_seed(node) -> dict[int, float]:
        if node is None or node.result is None or not node.evaluated:
            return {}
        return seed_utilities(node.result, exp)

    a, b = per_seed(child), per_seed(parent)
    if a and b and not comparable(child.result, parent.result, exp.objective):
        return None  # two versions of a protocol named without a hash, or two units: never paired
    d = paired_interval(a, b)
    if d is None:
        return None
    mean, iv, n = d
    return mean, (tuple(iv) if iv else None), n


def seed_utilities(result: Any, exp: ExperimentConfig) -> dict[int, float]:
    """seed -> U at that seed, over a result's evaluated per-seed rows that measured the objective."""
    out = {}
    for row in result.per_seed:
        m = row.get("metrics") or {}
        if exp.objective in m and row.get("status", "evaluated") == "evaluated":
            out[int(row["seed"])] = utility(m, exp)
    return {k: v for k, v in out.items() if v is not None}


def ranked(nodes: Mapping[str, Any], exp: ExperimentConfig) -> list[tuple[str, float]]:
    """Evaluated nodes by utility, best first."""
    rows = [(name, node_utility(n, exp)) for name, n in nodes.items()]
    return sorted(((k, u) for k, u in rows if u is not None), key=lambda kv: -kv[1])


def best_node(nodes: Mapping[str, Any], exp: ExperimentConfig) -> str | None:
    r = ranked(nodes, exp)
    return r[0][0] if r else None


def pareto_front(points: Mapping[str, Iterable[float]]) -> set[str]:
    """Names of the non-dominated points (every coordinate maximized)."""
    pts = {k: tuple(v) for k, v in points.items()}
    front = set()
    for k, p in pts.items():
        dominated = any(
            all(x >= y for x, y in zip(q, p)) and any(x > y for x, y in zip(q, p))
            for j, q in pts.items()
            if j != k
        )
        if not dominated:
            front.add(k)
    return front


def objective_vector(node: Any, exp: ExperimentConfig) -> tuple[float, ...] | None:
    """The node's metric vector under ``pareto_objectives`` (signs flipped so that larger is better)."""
    names = exp.pareto_objectives or (exp.objective,)
    m = node.metrics if node is not None and node.evaluated else {}
    out = []
    for key, sign in parse_objectives(names, exp):
        if key not in m:
            return None
        out.append(sign * float(m[key]))
    return tuple(out)
