"""Moves the archive's evidence favours: the offline proposer's learned direction.

A *move* is one change the offline search can make to a parent's component spec: switch a component
to an option, switch the loss aggregation, or push one loss knob up or down (the KL anchor's weight,
the entropy bonus, the upper and lower clip bounds). Every evaluated node that changed its own parent
is one observation of the moves it made: its utility change over that parent, explained as a linear
model over *features* of the change, an indicator per option it introduced and, per knob, how far it
moved (in decades for the two coefficients, in tenths for the clip bounds). The fit is Bayesian
linear regression with a Gaussian prior on every effect (:data:`EFFECT_SD`), so an effect seen once
is shrunk and carries its uncertainty. Each observation is weighted by its own measurement noise: the
spread of its paired seeds' differences to its parent (:data:`SEED_SD` is that spread's prior), plus
what a linear model of the effects misses (:data:`MODEL_SD`); a collapse is thus one observation
of its cause, and does not widen the uncertainty of every other effect.

:func:`learned_move` makes a move only where the evidence favours it with confidence: among the moves
whose features the archive has observed, those whose posterior probability of a gain reaches
:data:`CONFIDENCE` (and, with ``[propose].min_gain``, whose expected gain reaches it) are eligible,
and one draw from the posterior (Thompson sampling) picks among them.
A knob whose effect is near zero is left where it is, in either direction. With ``explore`` and no
confident move, it tries a move the archive has never observed instead: the untried move whose gain
the prior is least sure of (the widest prior spread: a coefficient pushed :data:`STEP` decades before
an option switch, before a clip bound nudged), ties drawn at random; a move a pending node is
already trying counts as tried. Confidence alone only exploits
what a uniform mutation happened to try; this reaches the moves nobody tried. Nothing here names a
remedy: which moves help is what the archive has measured, and which to try first is what its prior
is least sure of.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

from engine.errors import PoiseError
from engine.operators.proposers.codegen import CONTINUOUS, OPTIONS, normalize, owns
from engine.stats import paired_differences
from trainer_template.interface import LOSS_AGG_MODES

KNOBS: dict[str, float | None] = {
    "kl_coef": None,
    "entropy_coef": None,
    "clip_ratio_high": 0.1,
    "clip_ratio_low": 0.1,
}
"""the loss knobs a move pushes, and the unit of their feature: None for decades (a log-scale
coefficient; 0 counts as the range's lower end), a number for a linear step of that size"""
EFFECT_SD = 0.01
"""the prior standard deviation of every effect (utility per option switched, per decade of a
coefficient, per tenth of a clip bound): the published mechanisms' effects on the default protocol lie
within about twice this (calibration.md). A collapse lies far outside it and is shrunk toward it (a
-0.26 collapse measured at +-0.03 is charged -0.025), yet it stays the archive's most confidently
negative effect, which is what the direction and the ranking read"""
SEED_SD = (0.02, 4)
"""the prior of one seed's paired difference spread (utility units; the default protocol's paired
differences spread about this much per seed), worth this many seeds, pooled with the observed spread"""
MODEL_SD = 0.005
"""added to every observation's noise: what a linear, additive model of the effects cannot explain
(interactions between the moves a lineage stacks), so that many seeds never make one observation
certain"""
CONFIDENCE = 0.8
"""the posterior probability of a gain a move needs before the learned direction makes it"""
STEP = 1.5
"""decades a coefficient move is expected to travel (:data:`STRONGER`: one to two)"""
STRONGER = (10.0, 100.0)
"""a strengthened coefficient is drawn log-uniformly between these multiples of the parent's value
(at least the range's lower end), capped at the range's upper end: one to two orders of magnitude"""


def stronger(value: float, name: str, rng: random.Random) -> float:
    """``value`` strengthened by one to two orders of magnitude (:data:`STRONGER`) inside the range
    of the continuous hyperparameter ``name``."""
    lo, hi = CONTINUOUS[name][:2]
    start = max(value, lo)
    a, b = min(STRONGER[0] * start, hi), min(STRONGER[1] * start, hi)
    v = math.exp(rng.uniform(math.log(a), math.log(b))) if b > a else b
    return round(v, 4 if v >= 0.01 else 6)


def set_option(spec: dict, hp: dict, knob: str, option: str, sample) -> None:
    """Set the component ``knob`` of ``spec`` to ``option`` and sample the continuous
    hyperparameters the option's code reads into ``hp``."""
    spec[knob] = option
    for name, (_lo, _hi, _log, _d, owner) in CONTINUOUS.items():
        if owner is not None and owner[0] == knob and owns(owner, spec):
            hp[name] = sample(name)


def _level(knob: str, v: float) -> float:
    lo, hi = CONTINUOUS[knob][:2]
    unit = KNOBS[knob]
    if unit is None:
        return math.log10(min(max(v, lo), hi))
    return v / unit


def features(spec: dict[str, Any], base: dict[str, Any]) -> dict[tuple[str, str], float]:
    """The features of the change from ``base`` to ``spec`` (both normalized component specs)."""
    out: dict[tuple[str, str], float] = {}
    for k in OPTIONS:
        if spec[k] != base[k]:
            out[(k, spec[k])] = 1.0
    a, b = spec["hp"], base["hp"]
    mode = a.get("loss_agg_mode", "token-mean")
    if mode != b.get("loss_agg_mode", "token-mean"):
        out[("loss_agg_mode", mode)] = 1.0
    for knob in KNOBS:
        d = CONTINUOUS[knob][3]
        delta = _level(knob, a.get(knob, d)) - _level(knob, b.get(knob, d))
        if abs(delta) > 1e-9:
            out[("knob", knob)] = round(delta, 6)
    return out


@dataclass(frozen=True)
class MoveFit:
    """The posterior over the features' effects on utility."""

    names: tuple[tuple[str, str], ...]
    mean: tuple[float, ...]
    cov: tuple[tuple[float, ...], ...]
    """the posterior covariance"""
    seen: dict[tuple[str, str], int]
    """how many observations each feature appears in"""

    @cached_property
    def index(self) -> dict[tuple[str, str], int]:
        return {n: i for i, n in enumerate(self.names)}

    def effect(self, feats: dict[tuple[str, str], float]) -> float:
        """The posterior mean of a change's effect (unobserved features count 0)."""
        return sum(self.mean[self.index[f]] * x for f, x in feats.items() if f in self.index)

    def gain(self, feats: dict[tuple[str, str], float]) -> tuple[float, float] | None:
        """(posterior mean, posterior standard deviation) of a change's effect; None when the change
        has a feature the archive never observed."""
        if not all(f in self.index for f in feats):
            return None
        ix = [(self.index[f], x) for f, x in feats.items()]
        mean = sum(self.mean[i] * x for i, x in ix)
        var = sum(self.cov[i][j] * x * y for i, x in ix for j, y in ix)
        return mean, math.sqrt(max(var, 0.0))

    def probability(self, feats: dict[tuple[str, str], float]) -> float | None:
        """The posterior probability that a change gains utility; None as :meth:`gain`."""
        g = self.gain(feats)
        return None if g is None else _above_zero(*g)


def _above_zero(mean: float, sd: float) -> float:
    """P(X > 0) for X ~ Normal(mean, sd**2)."""
    if sd == 0.0:
        return 1.0 if mean > 0 else 0.0
    return 0.5 * (1.0 + math.erf(mean / (sd * math.sqrt(2.0))))


def code_spec(components: dict | None, hp: dict | None) -> dict[str, Any]:
    """The spec a node's code realises: its normalized ``components`` (None: the default spec) with
    the hyperparameters ``hp`` its ``algorithm.py`` sets; raises PoiseError as ``normalize``."""
    spec = normalize(components)
    spec["hp"].update({k: v for k, v in (hp or {}).items() if k in spec["hp"]})
    return spec


def readable_spec(components, hp: dict | None = None) -> dict[str, Any] | None:
    """:func:`code_spec`, None when unreadable."""
    try:
        return code_spec(components, hp)
    except PoiseError:
        return None


def observation_sd(child: dict[int, float] | None, parent: dict[int, float] | None) -> float:
    """The noise standard deviation of one observation: the standard error of the mean paired
    difference over the seeds child and parent share (their spread pooled with :data:`SEED_SD`; one
    seed's worth when they share fewer than two), with :data:`MODEL_SD` added in quadrature."""
    d = paired_differences(child or {}, parent or {})
    n = len(d)
    s0, k = SEED_SD
    if n < 2:
        return math.sqrt(s0**2 + MODEL_SD**2)
    m = sum(d) / n
    ss = sum((v - m) ** 2 for v in d)
    per_seed = (ss + k * s0**2) / (n - 1 + k)
    return math.sqrt(per_seed / n + MODEL_SD**2)


def design(rows: list[tuple[dict[Any, float], float]]):
    """(names, X, y) of a linear fit over ``rows`` of (features, outcome): the sorted feature names,
    the design matrix (one row per observation, a feature's value in its name's column, 0 where
    absent) and the outcomes; the learned direction's move fit and the offline search's component
    effects both read an archive's changes this way."""
    import numpy as np  # lazy: only this path needs it (optuna brings it)

    names = sorted({f for feats, _ in rows for f in feats})
    col = {f: i for i, f in enumerate(names)}
    x = np.zeros((len(rows), len(names)))
    y = np.array([d for _, d in rows])
    for r, (feats, _) in enumerate(rows):
        for f, v in feats.items():
            x[r, col[f]] = v
    return names, x, y


def change_features(ev, par) -> dict[tuple[str, str], float]:
    """The :func:`features` of the change an evidence record ``ev`` made from its parent's ``par``
    (a record without recorded components counts as the default spec, its code's hyperparameters
    over it); {} when nothing says what it changed or either spec is unreadable."""
    if ev.components is None and ev.hp is None:  # nothing says what it changed
        return {}
    mine, theirs = readable_spec(ev.components, ev.hp), readable_spec(par.components, par.hp)
    return {} if mine is None or theirs is None else features(mine, theirs)


def fit_moves(evidence: dict) -> MoveFit | None:
    """The posterior over the features' effects, from every evaluated node with a readable spec whose
    (first) parent is evaluated (a node without recorded components counts as the default spec;
    either way the hyperparameters its code sets, where the evidence read them, override the
    recorded ones); None when the archive has no such node. Each observation is weighted by
    :func:`observation_sd` of its recorded per-seed utilities."""
    rows: list[tuple[dict[tuple[str, str], float], float, float]] = []
    for ev in evidence.values():
        par = evidence.get(ev.parent) if ev.parent else None
        if ev.utility is None or par is None or par.utility is None:
            continue
        feats = change_features(ev, par)
        if feats:
            rows.append((feats, ev.utility - par.utility, observation_sd(ev.seeds, par.seeds)))
    if not rows:
        return None
    import numpy as np  # lazy: only this path needs it (optuna brings it)

    names, x, y = design([(feats, d) for feats, d, _ in rows])
    sd = np.array([s for _, _, s in rows])
    xw = x / sd[:, None] ** 2
    cov = np.linalg.inv(xw.T @ x + np.eye(len(names)) / EFFECT_SD**2)
    w = cov @ xw.T @ y
    seen = {f: sum(1 for feats, _, _ in rows if f in feats) for f in names}
    return MoveFit(
        tuple(names),
        tuple(float(v) for v in w),
        tuple(tuple(float(v) for v in row) for row in cov),
        seen,
    )


def candidate_moves(base: dict[str, Any]) -> list[tuple[str, str]]:
    """Every move the search can make from ``base``: (component, option), ("loss_agg_mode", mode),
    (knob, "up" | "down") where the knob's range leaves room."""
    out = [(k, o) for k in OPTIONS for o in OPTIONS[k] if o != base[k]]
    mode = base["hp"].get("loss_agg_mode", "token-mean")
    out += [("loss_agg_mode", m) for m in LOSS_AGG_MODES if m != mode]
    for knob in KNOBS:
        lo, hi, _log, d, _o = CONTINUOUS[knob]
        v = base["hp"].get(knob, d)
        if v < hi:
            out.append((knob, "up"))
        if v > lo:
            out.append((knob, "down"))
    return out


def move_features(move: tuple[str, str], base: dict[str, Any]) -> dict[tuple[str, str], float]:
    """The features a move is expected to have (a knob travels :data:`STEP` decades or half its
    room)."""
    what, how = move
    if what not in KNOBS:
        return {move: 1.0}
    lo, hi, _log, d, _o = CONTINUOUS[what]
    v = base["hp"].get(what, d)
    now = _level(what, v)
    if KNOBS[what] is None:
        end = now + STEP if how == "up" else now - STEP
        end = min(max(end, _level(what, lo)), _level(what, hi))
    else:
        end = (now + _level(what, hi if how == "up" else lo)) / 2
    return {("knob", what): end - now}


class Favoured(NamedTuple):
    """A move the learned direction makes, and why."""

    move: tuple[str, str]
    gain: float
    """its posterior mean gain (an untried move: the part its observed features explain, else 0)"""
    spread: float
    """its posterior standard deviation (an untried move: its unobserved features at the prior)"""
    probability: float
    """its posterior probability of a gain"""
    explored: bool = False
    """an untried move (``explore``), made for what the archive would learn, not for its gain"""


def prior_gain(fit: MoveFit | None, feats: dict[tuple[str, str], float]) -> tuple[float, float]:
    """(mean, standard deviation) of a change's gain with every feature ``fit`` never observed at its
    prior (mean 0, :data:`EFFECT_SD` per unit), independent of the observed ones."""
    seen = {f: x for f, x in feats.items() if fit is not None and f in fit.index}
    mean, sd = fit.gain(seen) if seen else (0.0, 0.0)
    unseen = sum((EFFECT_SD * x) ** 2 for f, x in feats.items() if f not in seen)
    return mean, math.sqrt(sd**2 + unseen)


def features_in_flight(evidence: dict) -> set[tuple[str, str]]:
    """The features the pending nodes (verified or under evaluation, no result yet) change relative to
    their own parents: what the archive is already trying, so ``explore`` does not try it twice
    before the first result is in (a loop round expands its parents one after another)."""
    out: set[tuple[str, str]] = set()
    for ev in evidence.values():
        par = evidence.get(ev.parent) if ev.parent else None
        if ev.pending and par is not None:
            out.update(change_features(ev, par))
    return out


def learned_move(
    fit: MoveFit | None,
    base: dict[str, Any],
    rng: random.Random,
    explore: bool = False,
    min_gain: float = 0.0,
    in_flight: set[tuple[str, str]] | frozenset = frozenset(),
) -> Favoured | None:
    """The move with the largest gain under one draw from the posterior, among the moves whose
    features the archive has observed, whose probability of a gain reaches :data:`CONFIDENCE` and
    whose expected gain reaches ``min_gain``. With none such: None, or with ``explore`` the untried
    move (a feature the archive never observed and no pending node in ``in_flight`` is trying) with
    the widest :func:`prior_gain` spread, ties drawn at random (None when every move was tried)."""
    moves = [(move, move_features(move, base)) for move in candidate_moves(base)]
    best = None
    if fit is not None:
        import numpy as np  # lazy: only this path needs it (optuna brings it)

        w = np.random.default_rng(rng.randrange(2**32)).multivariate_normal(
            np.array(fit.mean), np.array(fit.cov), method="eigh"
        )
        for move, feats in moves:
            g = fit.gain(feats)
            if g is None or (p := _above_zero(*g)) < CONFIDENCE or g[0] < min_gain:
                continue
            drawn = float(sum(w[fit.index[f]] * x for f, x in feats.items()))
            if best is None or drawn > best[0]:
                best = (drawn, Favoured(move, g[0], g[1], p))
    if best is not None or not explore:
        return None if best is None else best[1]
    known = set(fit.index if fit is not None else ()) | set(in_flight)
    untried = [
        (move, *prior_gain(fit, feats))
        for move, feats in moves
        if not all(f in known for f in feats)
    ]
    if not untried:
        return None
    widest = max(sd for _, _, sd in untried)
    move, mean, sd = rng.choice([u for u in untried if u[2] >= widest - 1e-12])
    return Favoured(move, mean, sd, _above_zero(mean, sd), explored=True)


def apply_move(base: dict[str, Any], move: tuple[str, str], rng: random.Random, sample) -> dict:
    """``base`` with ``move`` made: an option switched (its hyperparameters sampled), the loss
    aggregation switched, or a knob pushed: a coefficient one to two decades up (``stronger``) or
    down (off below the range), a clip bound into the upper or lower part of its remaining range."""
    spec = {k: v for k, v in base.items() if k != "hp"}
    hp = dict(base["hp"])
    what, how = move
    if what in OPTIONS:
        set_option(spec, hp, what, how, sample)
    elif what == "loss_agg_mode":
        hp["loss_agg_mode"] = how
    else:
        lo, hi, _log, d, _o = CONTINUOUS[what]
        v = hp.get(what, d)
        if KNOBS[what] is None:
            if how == "up":
                hp[what] = stronger(v, what, rng)
            else:
                w = v / math.exp(rng.uniform(math.log(10.0), math.log(100.0)))
                hp[what] = 0.0 if w < lo else round(w, 4 if w >= 0.01 else 6)
        else:
            a, b = (min(v + 0.01, hi), hi) if how == "up" else (lo, max(v - 0.01, lo))
            hp[what] = round(rng.uniform(a, b), 4)
    spec["hp"] = hp
    return spec
