"""The offline proposer (the embedded default): search over the mechanism components the priors are
made of, with no endpoint and no key.

Each candidate mutates ONE component of the parent's spec (baseline, scale, invalid handling, all-fail
handling, length shaping, advantage clipping, clip ratios, aggregation mode, KL or entropy coefficient)
or crosses the parent with an evaluated reference node (uniform crossover per component); a reference
that scored well below the parent (a collapsed or regressed node) is never taken as a partner.
Continuous hyperparameters are sampled by Optuna's TPE, warm-started with every archived node that has
a spec and a utility. Each proposal's expected gain is read from the archive's evidence on the
component options it changes: their effects on utility, fitted over every node that introduced an
option to its own parent (:func:`component_effects`); an untested option that a pending node already
tries is not proposed again before that node has a result (:func:`options_in_flight`). The code is
rendered by
:mod:`engine.operators.proposers.codegen` and applied through LibCST.

The search reads the parent's diagnosis: the reflection's findings on its recorded training trajectory
(:func:`engine.operators.reflect.trajectory_diagnostics`). A finding with known remedies (an entropy
collapse: a stronger anchor to the reference, an entropy controller, a larger entropy bonus, a higher
upper clip bound) directs a share of the mutations to one of them (``[propose].directed``, default
half), and a proposal that applies one is credited a prior expected effect (:data:`REMEDY_PRIOR`)
until the archive has evidence of its own. ``[propose].remedies`` names the remedies it may use;
``directed = 0`` turns the direction off. A remedy whose children trained like their parents on the
series it is meant to move (``[propose].remedy_trials`` of them, default 2, and none moved it) is
spent: no longer directed to nor credited (:mod:`engine.operators.proposers.remedies`).
"""

from __future__ import annotations

import json
import logging
import math
import random
from dataclasses import dataclass
from typing import Any

from engine.archive.results import configured_protocol
from engine.archive.store import ALGORITHM
from engine.config import utility
from engine.errors import PoiseError
from engine.operators.propose import Proposal, archived_code, code_key
from engine.operators.proposers import register
from engine.operators.proposers.codegen import (
    CONTINUOUS,
    LOSS_KNOBS,
    OPTIONS,
    PRIOR_SPECS,
    describe,
    normalize,
)
from engine.operators.proposers.edit_plan import class_defaults, plan_edit
from engine.operators.proposers.moves import (
    apply_move,
    code_spec,
    design,
    features,
    features_in_flight,
    fit_moves,
    learned_move,
    move_features,
    readable_spec,
    set_option,
    stronger,
)
from engine.operators.proposers.remedies import (
    REMEDIES,
    REMEDY_PRIOR,
    RemedyTrial,
    remedies_applied,
    remedies_for,
    remedy_trials,
    spent_remedies,
)
from engine.operators.reflect import trajectory_diagnostics
from engine.select.objective import seed_utilities
from trainer_template.interface import LOSS_AGG_MODES

MUTABLE = tuple(OPTIONS) + LOSS_KNOBS
log = logging.getLogger(__name__)
RATIO_MARGIN = 0.02
"""a clip bound counts as inert only if every recorded ratio stayed this far inside it"""


def parent_trajectory(archive, parent: str, cfg=None, nodes=None) -> dict:
    """The parent's recorded training trajectory: its result under the experiment's protocol ({}
    when it has none there; an entry that is no series, as a results file edited by hand may hold,
    left out); ``nodes``: the archive's nodes under it, when already read."""
    if nodes is None:
        nodes = archive.nodes(configured_protocol(cfg or archive.config()))
    node = nodes.get(parent)
    if node is None or node.result is None:
        return {}
    return {k: v for k, v in node.result.trajectory.items() if isinstance(v, (list, tuple))}


def parent_ratios(archive, parent: str, cfg=None) -> tuple[float, float] | None:
    """(min, max) importance ratio over the parent's recorded training trajectory, or None when
    unknown (:func:`trajectory_ratios`)."""
    return trajectory_ratios(parent_trajectory(archive, parent, cfg))


def trajectory_ratios(traj: dict) -> tuple[float, float] | None:
    """(min, max) importance ratio over a recorded training trajectory, or None when unknown. Results
    without ratio extremes: a clip fraction of 0 at every recorded step means every ratio stayed
    inside the harness's [0.8, 1.2]."""
    hi = [v for v in traj.get("train/ratio_max") or [] if isinstance(v, (int, float))]
    lo = [v for v in traj.get("train/ratio_min") or [] if isinstance(v, (int, float))]
    if hi and lo:
        return min(lo), max(hi)
    cf = [v for v in traj.get("train/clipfrac") or [] if isinstance(v, (int, float))]
    if cf and max(cf) == 0.0:
        return 0.8, 1.2
    return None


def parent_findings(archive, parent: str, cfg=None) -> list[str]:
    """The parent's diagnosis: the reflection's findings on its recorded training trajectory under the
    experiment's protocol ([] when it has no result there)."""
    return trajectory_diagnostics(parent_trajectory(archive, parent, cfg))


def clip_is_inert(old: dict, new: dict, ratios: tuple[float, float] | None) -> str:
    """Why changing the clip ratios from ``old`` to ``new`` cannot change training ('' if it can): the
    parent's ratios stayed inside both the old and the new clip range, so neither clips anything and
    the child would retrace the parent's run."""
    keys = ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c")
    if ratios is None or all(old.get(k) == new.get(k) for k in keys):
        return ""
    if any(old.get(k) != new.get(k) for k in new if k not in keys):
        return ""
    lo, hi = ratios
    low = min(old.get("clip_ratio_low", 0.2), new.get("clip_ratio_low", 0.2))
    high = min(old.get("clip_ratio_high", 0.2), new.get("clip_ratio_high", 0.2))
    c = min(old.get("clip_ratio_c", 3.0), new.get("clip_ratio_c", 3.0))
    if lo > 1 - low + RATIO_MARGIN and hi < min(1 + high, c) - RATIO_MARGIN:
        return (
            f"the parent's importance ratios stayed in [{lo:.3f}, {hi:.3f}], inside both clip "
            f"ranges [{1 - low:.2f}, {1 + high:.2f}]: nothing would be clipped"
        )
    return ""


def mutation_base(components: dict | None, parent_src: str) -> dict[str, Any]:
    """The parent's component spec to mutate from: its recorded components (normalized) with the
    hyperparameters its ``algorithm.py`` actually sets."""
    return code_spec(components, class_defaults(parent_src))


def intents_for(spec: dict[str, Any]) -> tuple[str, ...]:
    """Intent tests a spec satisfies by construction."""
    out = ["correct_above_wrong"]
    if spec["baseline"] != "batch" and spec["scale"] != "batch":
        out.append("rare_success_larger")
    if spec["invalid"] == "penalty" and spec["adv_clip"] == "none":
        out.append("invalid_below_wrong")
    if spec["all_fail"] == "penalty" and spec["adv_clip"] == "none":
        out.append("all_fail_negative")
    if spec["length"] == "penalty" and spec["adv_clip"] == "none":
        out.append("shorter_correct_preferred")
    if spec["length"] == "negative_scale" and spec["adv_clip"] == "none":
        out.append("longer_wrong_penalized_less")
    if spec["adv_clip"] == "clip":
        out.append("bounded")
    return tuple(out)


def prior_record(name: str) -> dict[str, Any] | None:
    """records/proposal.json of a seeded prior the catalog expresses exactly (its components and the
    intents they satisfy), so that the offline search mutates the prior itself; None for the others."""
    if name not in PRIOR_SPECS:
        return None
    spec = normalize(PRIOR_SPECS[name])
    return {
        "proposer": "prior",
        "prior": name,
        "components": spec,
        "intents": list(intents_for(spec)),
    }


@dataclass(frozen=True)
class Evidence:
    """One archived node as the offline search reads it."""

    name: str
    parent: str | None
    utility: float | None
    """under the experiment's protocol (None: not evaluated under it)"""
    components: dict | None
    """its recorded component spec (None: not written by the component catalog)"""
    pending: bool = False
    """verified or under evaluation, no result yet: what it introduced is being tried"""
    seeds: dict[int, float] | None = None
    """seed -> utility at that seed, where its result recorded per-seed rows (the learned
    direction's measurement noise, :func:`~engine.operators.proposers.moves.observation_sd`)"""
    hp: dict | None = None
    """the hyperparameters its ``algorithm.py`` sets, read only for an evaluated or pending node with
    the learned direction or the remedies' record on (:func:`reads_code`; the spec the fit,
    ``explore`` and the record read: a knob-only mutation of a parent without components records
    none, yet moved a knob)"""

    def spec(self) -> dict | None:
        """The spec its code realises (:func:`~engine.operators.proposers.moves.code_spec`), None
        when unreadable."""
        return readable_spec(self.components, self.hp)


PENDING = ("verified", "evaluating")
"""statuses of a node whose result is still to come"""


def reads_code(cfg) -> bool:
    """Whether the search reads each node's hyperparameters from its code: for the learned
    direction (``[propose].learned``) or the remedies' record (``directed`` and ``remedy_trials``)."""
    p = cfg.propose
    return p.learned > 0 or (p.directed > 0 and p.remedy_trials > 0)


def archive_evidence(
    archive, cfg, nodes=None, read_code: bool | None = None
) -> dict[str, Evidence]:
    """Every node under the experiment's protocol with its utility and, for the nodes that have a
    utility (the only ones the fit and the TPE warm start read) or are pending, its recorded
    components and, where :func:`reads_code`, the hyperparameters its code sets (what the fit and
    the remedies' record read of the evaluated ones, and ``explore`` of the pending ones): their
    records/proposal.json (and algorithm.py) files are read in one git call. ``nodes``: the
    archive's nodes under that protocol, when already read; ``read_code``: read the code whatever
    the configuration says (None: where :func:`reads_code`)."""
    if nodes is None:
        nodes = archive.nodes(configured_protocol(cfg))
    u = {
        n: utility(x.metrics, cfg.experiment) if x.evaluated and x.metrics else None
        for n, x in nodes.items()
    }
    pending = {n for n, x in nodes.items() if u[n] is None and x.status in PENDING}
    read = [n for n in nodes if u[n] is not None or n in pending]
    code = read if (reads_code(cfg) if read_code is None else read_code) else []
    blobs = archive.git.cat_blobs(
        [f"{nodes[n].commit}:records/proposal.json" for n in read]
        + [f"{nodes[n].commit}:{ALGORITHM}" for n in code]
    )
    hps = {n: class_defaults(src) for n, src in zip(code, blobs[len(read) :]) if src}
    comps: dict[str, dict | None] = {}
    for n, blob in zip(read, blobs):
        try:
            comps[n] = (json.loads(blob) or {}).get("components") if blob else None
        except (ValueError, AttributeError):
            comps[n] = None
    return {
        n: Evidence(
            n,
            x.parent,
            u[n],
            comps.get(n) or None,
            n in pending,
            seed_utilities(x.result, cfg.experiment) if u[n] is not None else None,
            hps.get(n),
        )
        for n, x in nodes.items()
    }


def archive_remedy_trials(
    archive, nodes, evidence: dict[str, Evidence] | None = None
) -> list[RemedyTrial]:
    """:func:`~engine.operators.proposers.remedies.remedy_trials` over ``nodes`` (the archive's
    nodes under one protocol), each node's spec read from its code; ``evidence``: the archive's
    evidence with the code read, when already there (:func:`archive_evidence`)."""
    if evidence is None:
        evidence = archive_evidence(archive, archive.config(), nodes, read_code=True)
    return remedy_trials(nodes, {n: ev.spec() for n, ev in evidence.items()})


def _introduced(ev: Evidence, evidence: dict[str, Evidence]) -> list[tuple[str, str]]:
    """The (component, option) pairs ``ev`` changed relative to its own parent (a parent without
    recorded components counts as the default spec); [] when either spec is unreadable."""
    par = evidence.get(ev.parent) if ev.parent else None
    if ev.components is None or par is None:
        return []
    try:
        mine, theirs = normalize(ev.components), normalize(par.components)
    except PoiseError:
        return []
    return [(k, mine[k]) for k in OPTIONS if mine[k] != theirs[k]]


RIDGE = 0.5
"""L2 weight of the component-effect fit: a single introduction is credited with 1 / (1 + RIDGE) of
the change it made, and options never tried with 0"""


def component_effects(evidence: dict[str, Evidence]) -> dict[tuple[str, str], float]:
    """(component, option) -> its estimated effect on utility, fitted over the archive.

    Each evaluated node with recorded components that changed options relative to its own (first)
    parent is one observation: its utility change over that parent, explained as the sum of the
    effects of the options it introduced (a parent without recorded components counts as the
    default spec). The effects are a ridge least-squares fit, so a crossover that brought a
    collapsing baseline together with a harmless option charges the collapse to the baseline, which
    collapsed wherever else it was introduced, and not to what came along with it."""
    rows: list[tuple[dict[tuple[str, str], float], float]] = []
    for ev in evidence.values():
        par = evidence.get(ev.parent) if ev.parent else None
        if ev.utility is None or par is None or par.utility is None:
            continue
        changed = _introduced(ev, evidence)
        if changed:
            rows.append((dict.fromkeys(changed, 1.0), ev.utility - par.utility))
    if not rows:
        return {}
    import numpy as np  # lazy: only this path needs it (optuna brings it)

    names, x, y = design(rows)
    w = np.linalg.solve(x.T @ x + RIDGE * np.eye(len(names)), x.T @ y)
    return {o: float(v) for o, v in zip(names, w)}


def options_in_flight(
    evidence: dict[str, Evidence], effects: dict[tuple[str, str], float]
) -> dict[tuple[str, str], str]:
    """(component, option) -> the pending node trying it, for the options no evaluated node has
    introduced yet: a second untested try of one option before the first has a result would spend
    two candidates on one unknown (a loop round expands its parents one after another, and the
    first parent's children are still being evaluated when the second's are proposed)."""
    out: dict[tuple[str, str], str] = {}
    for ev in sorted(evidence.values(), key=lambda e: e.name):
        if ev.pending:
            for o in _introduced(ev, evidence):
                if o not in effects:
                    out.setdefault(o, ev.name)
    return out


def expected_gain(
    spec: dict,
    base: dict,
    effects: dict[tuple[str, str], float],
    beta: float,
    prior: float = 0.0,
    fit=None,
) -> float:
    """0.5 + 0.5 tanh((sum of the fitted effects of the options ``spec`` changes from ``base`` +
    ``prior``) / beta): an option never tried counts 0 (neutral), so the search stays willing to
    explore; one that collapsed the nodes it was introduced in sinks the proposal. ``prior`` is what
    the parent's diagnosis expects of the move (:data:`REMEDY_PRIOR`). With ``fit`` (a
    :class:`~engine.operators.proposers.moves.MoveFit`, when ``[propose].learned`` is on), the
    change's effect is its posterior mean, knob moves included."""
    if fit is not None:
        total = prior + fit.effect(features(spec, base))
    else:
        total = prior + sum(effects.get((k, spec[k]), 0.0) for k in OPTIONS if spec[k] != base[k])
    return round(0.5 + 0.5 * math.tanh(total / beta), 4)


def crossover_partners(context, beta: float) -> list:
    """The reference nodes a crossover may take components from: evaluated, with a component spec,
    and not worse than the parent by more than ``beta`` utility (a regressed or collapsed node would
    hand its cause on). With an unevaluated parent every evaluated reference qualifies."""
    parent_u = context.parent.utility
    seen, out = set(), []
    for s in context.frontier + context.complementary + context.exploratory:
        if s.name in seen or not s.components or s.utility is None:
            continue
        seen.add(s.name)
        if parent_u is not None and s.utility < parent_u - beta:
            log.info(
                "offline proposer: %s (U=%.4g) is no crossover partner for a parent at U=%.4g",
                s.name,
                s.utility,
                parent_u,
            )
            continue
        out.append(s)
    return out


def _study(evidence: dict[str, Evidence], seed: int):
    """An in-memory TPE study warm-started with the archive's (spec hyperparameters, utility) pairs."""
    import optuna  # lazy: optuna is heavy (only this path needs it)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=8)
    )
    dists = _distributions()
    for ev in evidence.values():
        u, comps = ev.utility, ev.components
        if u is None or not comps:
            continue
        try:
            hp = normalize(comps)["hp"]
        except PoiseError:
            continue
        params = {k: v for k, v in hp.items() if k in dists and _inside(dists[k], v)}
        if params:
            study.add_trial(
                optuna.trial.create_trial(
                    params=params, distributions={k: dists[k] for k in params}, value=float(u)
                )
            )
    return study


def _distributions():
    import optuna  # lazy: optuna is heavy (only this path needs it)

    return {
        k: optuna.distributions.FloatDistribution(lo, hi, log=log)
        for k, (lo, hi, log, _d, _o) in CONTINUOUS.items()
    }


def _inside(dist, v) -> bool:
    return isinstance(v, (int, float)) and dist.low <= v <= dist.high


@register("offline")
class OfflineProposer:
    """Component mutation / crossover with TPE-sampled continuous hyperparameters."""

    def __init__(self, llm=None, **_):
        self.llm = llm  # unused: the offline proposer never calls an endpoint

    def propose(self, archive, parent: str, context, cfg, n: int, seed: int | None) -> list:
        # lazy: engine.operators.implement imports the proposers package (a circle at the top)
        from engine.operators.implement import build_source

        seed = seed if seed is not None else len(archive.nodes())
        rng = random.Random(seed)
        nodes = archive.nodes(configured_protocol(cfg))
        evidence = archive_evidence(archive, cfg, nodes)
        study = _study(evidence, seed)
        effects = component_effects(evidence)
        dists = _distributions()
        rendered = bool(context.parent.components)
        parent_src = context.parent_code or archive.algorithm(parent)
        base = mutation_base(context.parent.components, parent_src)
        traj = parent_trajectory(archive, parent, cfg, nodes)
        ratios = trajectory_ratios(traj)
        findings = trajectory_diagnostics(traj)
        directed, learned = cfg.propose.directed, cfg.propose.learned
        fit = fit_moves(evidence) if learned > 0 else None
        # the moves pending nodes are trying, and those this call explores: not explored twice
        trying_moves = (
            features_in_flight(evidence) if learned > 0 and cfg.propose.explore else set()
        )
        remedies = remedies_for(findings, base, cfg.propose.remedies) if directed > 0 else ()
        treated = [k for k in REMEDIES if any(f.startswith(k) for f in findings)]
        if remedies and cfg.propose.remedy_trials > 0:
            trials = archive_remedy_trials(archive, nodes, evidence)
            spent = spent_remedies(trials, tuple(treated), cfg.propose.remedy_trials)
            for move in (m for m in remedies if m in spent):
                log.info(
                    "offline proposer: %s is no longer directed to %s: %s",
                    parent,
                    move,
                    spent[move],
                )
            remedies = tuple(m for m in remedies if m not in spent)
        if remedies:
            log.info(
                "offline proposer: %s's diagnosis (%s) directs its mutations to %s",
                parent,
                " and ".join(treated),
                ", ".join(remedies),
            )
        known = archived_code(archive)
        partners = crossover_partners(context, cfg.select.beta)
        in_flight = options_in_flight(evidence, effects)
        out: list[Proposal] = []
        seen: set[str] = set()
        for _ in range(4 * n):
            if len(out) >= 2 * n:
                break
            trial = study.ask()

            def sample(name: str, trial=trial) -> float:
                v = trial.suggest_float(
                    name, dists[name].low, dists[name].high, log=dists[name].log
                )
                return round(v, 4 if v >= 0.01 else 6)

            if partners and rng.random() < 0.25:
                partner = rng.choice(partners)
                spec, what = (
                    self._cross(base, normalize(partner.components), rng),
                    f"crossover with {partner.name}",
                )
                extra, favoured = (partner.name,), None
            else:
                extra, favoured = (), None
                if learned > 0 and rng.random() < learned:
                    favoured = learned_move(
                        fit, base, rng, cfg.propose.explore, cfg.propose.min_gain, trying_moves
                    )
                if favoured is not None:
                    spec, what = apply_move(base, favoured.move, rng, sample), ""
                else:
                    spec, what = self._mutate(base, rng, sample, remedies, directed), ""
            spec = normalize(spec)
            inert = clip_is_inert(base["hp"], spec["hp"], ratios)
            if inert:
                log.info("offline proposer: skipping a mutation of %s: %s", parent, inert)
                continue
            trying = sorted(
                {
                    in_flight[(k, spec[k])]
                    for k in OPTIONS
                    if spec[k] != base[k] and (k, spec[k]) in in_flight
                }
            )
            if trying:
                log.info(
                    "offline proposer: skipping a proposal for %s: %s already tries an option it "
                    "introduces, with no result yet",
                    parent,
                    ", ".join(trying),
                )
                continue
            plan = plan_edit(parent_src, base, spec, rendered=rendered)
            try:
                key = code_key(build_source(parent_src, plan.edit, plan.hyperparameters, plan.drop))
            except PoiseError:
                key = None
            if key is not None and (key in seen or key in known):
                if key in known:
                    log.warning(
                        "offline proposer: skipping an edit of %s already in the archive as %r",
                        parent,
                        known[key],
                    )
                continue
            if key is not None:
                seen.add(key)
            changed = sorted(k for k in MUTABLE[: len(OPTIONS)] if spec[k] != base[k])
            owned = {h for h, c in CONTINUOUS.items() if c[4] is not None and c[4][0] in changed}
            changed += sorted(
                k
                for k in spec["hp"]
                if spec["hp"].get(k) != base["hp"].get(k) and k not in owned | {"eps"}
            )
            what = what or ("mutate " + ", ".join(changed) if changed else "retune")
            applied = remedies_applied(spec, base, remedies)
            if applied:
                what += f" (against its {' and '.join(treated)}: {', '.join(applied)})"
            if favoured is not None and favoured.explored:
                trying_moves.update(move_features(favoured.move, base))
                what += (
                    f" (an untried move the archive's evidence cannot judge yet: "
                    f"{' '.join(favoured.move)}, a gain of {favoured.gain:+.4f} +- "
                    f"{favoured.spread:.4f} under the prior)"
                )
            elif favoured is not None:  # a crossover has none
                what += (
                    f" (the move the archive's evidence favours: {' '.join(favoured.move)}, an "
                    f"expected gain of {favoured.gain:+.4f}, probability {favoured.probability:.2f})"
                )
            out.append(
                Proposal(
                    name=f"{parent}-{_short(spec, base, changed, extra)}",
                    motivation=f"Offline search from {parent}: {what}. Parent mechanism — {describe(base)}.",
                    mechanism=describe(spec),
                    expected_effect=self._expectation(spec, base),
                    hyperparameters=plan.hyperparameters,
                    edit=plan.edit,
                    drop_hyperparameters=plan.drop,
                    proposer="offline",
                    parents=extra,
                    intents=intents_for(spec),
                    expected_gain=expected_gain(
                        spec,
                        base,
                        effects,
                        cfg.select.beta,
                        REMEDY_PRIOR * cfg.select.beta if applied else 0.0,
                        fit,
                    ),
                    components=spec
                    if rendered or any(spec[k] != base[k] for k in OPTIONS)
                    else None,
                )
            )
        return out

    def revise(self, archive, parent, proposal, failure, cfg, node=None):
        return None  # generated code is correct by construction or the component combination is infeasible

    # -- operators -------------------------------------------------------------------------------
    @staticmethod
    def _mutate(
        base: dict,
        rng: random.Random,
        sample,
        remedies: tuple[str, ...] = (),
        directed: float = 0.0,
    ) -> dict:
        """One component of ``base`` changed; with ``remedies`` (the parent's diagnosis), a share
        ``directed`` (``[propose].directed``) of the calls applies one of them instead; the rest stay
        uniform over every component, so the search still explores."""
        spec = {k: v for k, v in base.items() if k != "hp"}
        hp = dict(base["hp"])
        if remedies and rng.random() < directed:
            move = rng.choice(remedies)
            if move == "kl":
                hp["kl_coef"] = stronger(hp.get("kl_coef", 0.0), "kl_coef", rng)
            elif move == "entropy":
                hp["entropy_coef"] = stronger(hp.get("entropy_coef", 0.0), "entropy_coef", rng)
            elif move == "clip_higher":
                lo = max(hp.get("clip_ratio_high", 0.2), hp.get("clip_ratio_low", 0.2))
                hi = CONTINUOUS["clip_ratio_high"][1]
                hp["clip_ratio_high"] = round(rng.uniform(min(lo + 0.04, hi), hi), 4)
            else:  # an entropy controller, for a parent without one (remedies_for's rule)
                _switch_option(spec, hp, "entropy_control", rng, sample)
            spec["hp"] = hp
            return spec
        knob = rng.choice(MUTABLE)
        if knob in OPTIONS:
            _switch_option(spec, hp, knob, rng, sample)
        elif knob == "clip":
            hp["clip_ratio_low"], hp["clip_ratio_high"] = (
                sample("clip_ratio_low"),
                sample("clip_ratio_high"),
            )
        elif knob == "loss_agg":
            hp["loss_agg_mode"] = rng.choice(
                [m for m in LOSS_AGG_MODES if m != hp.get("loss_agg_mode")]
            )
        elif knob in ("kl", "entropy"):
            key = f"{knob}_coef"
            hp[key] = 0.0 if hp.get(key, 0.0) > 0 and rng.random() < 0.3 else sample(key)
        spec["hp"] = hp
        return spec

    @staticmethod
    def _cross(a: dict, b: dict, rng: random.Random) -> dict:
        spec = {k: (a[k] if rng.random() < 0.5 else b[k]) for k in OPTIONS}
        hp = {}
        for k in sorted(set(a["hp"]) | set(b["hp"])):  # sorted: a set's order varies by process
            hp[k] = (
                a["hp"].get(k, b["hp"].get(k))
                if rng.random() < 0.5
                else b["hp"].get(k, a["hp"].get(k))
            )
        spec["hp"] = hp
        return spec

    @staticmethod
    def _expectation(spec: dict, base: dict) -> str:
        notes = {
            (
                "scale",
                "analytic",
            ): "steadier advantages on near-saturated groups (the floor caps the scale-up)",
            (
                "scale",
                "none",
            ): "no difficulty bias from std scaling (Dr.GRPO); larger steps on mixed groups",
            (
                "baseline",
                "loo",
            ): "an unbiased leave-one-out baseline (RLOO); slightly larger advantages",
            (
                "baseline",
                "valid_bayes",
            ): "a baseline robust to invalid samples and tiny valid subsets",
            ("invalid", "penalty"): "fewer format-invalid outputs (valid rate up)",
            ("all_fail", "penalty"): "a learning signal on unsolved prompts",
            ("length", "penalty"): "shorter responses at similar accuracy",
            (
                "length",
                "negative_scale",
            ): "long wrong answers no longer pushed harder per sequence than short ones",
            (
                "invalid",
                "floor",
            ): "a fixed floor penalty below valid answers (fewer invalid outputs)",
            ("entropy_control", "adaptive"): "entropy held near its target: later collapse",
            ("entropy_control", "annealed"): "exploration early, consolidation late",
            ("entropy_control", "dynamic"): "entropy steered both ways towards its target",
            ("adv_clip", "clip"): "bounded updates: fewer spikes in KL and grad norm",
        }
        out = [notes[(k, spec[k])] for k in OPTIONS if spec[k] != base[k] and (k, spec[k]) in notes]
        if spec["hp"].get("clip_ratio_high", 0.2) > spec["hp"].get("clip_ratio_low", 0.2):
            out.append("clip-higher keeps entropy up (DAPO)")
        if spec["hp"].get("kl_coef", 0) > 0 and not base["hp"].get("kl_coef", 0):
            out.append("KL anchoring: slower drift from the reference")
        if spec["hp"].get("entropy_coef", 0) > 0 and not base["hp"].get("entropy_coef", 0):
            out.append("entropy bonus: later entropy collapse")
        return "; ".join(out) or "a local variation of the parent; effect to be measured"


def _switch_option(spec: dict, hp: dict, knob: str, rng: random.Random, sample) -> None:
    """Set the component ``knob`` of ``spec`` to another of its options, drawn uniformly, and sample
    the continuous hyperparameters the new option's code reads into ``hp``."""
    set_option(spec, hp, knob, rng.choice([o for o in OPTIONS[knob] if o != spec[knob]]), sample)


def _short(spec: dict, base: dict, changed: list[str], extra: tuple) -> str:
    if extra:
        return f"x-{extra[0]}"[:40]
    bits = []
    for k in changed[:2]:
        if k in OPTIONS:
            bits.append(f"{k.replace('_', '')}-{spec[k]}".replace("_", "-"))
        else:
            v = spec["hp"][k]
            bits.append(
                f"{k.split('_')[0]}{v:.3g}" if isinstance(v, float) else f"{k.split('_')[0]}-{v}"
            )
    return "-".join(bits)[:40] or "retune"
