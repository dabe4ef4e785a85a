"""Parent selection: s(d) = w_pareto*U_pareto + w_perf*U_perf + w_div*U_div + w_bayes*alpha_GP(d).

Every component lies in [0, 1] in the score; ``gp_ucb`` in a row is alpha on its own scale (the
descendant gain y_d in [-1, 1] where observed, else the GP's mean + kappa*std) and enters the score as
clip((alpha + 1) / 2, 0, 1). k parents are picked greedily without replacement; U_div is recomputed
after each pick. See docs/selection.md.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter, methodcaller
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from engine.archive.index import no_gc
from engine.archive.results import (
    LEGACY_FILE,
    RESULTS_DIR,
    ProtocolRef,
    configured_protocol,
    describe_elsewhere,
    named_protocol,
    protocols_with_results,
    require_comparable,
)
from engine.config import Config, SelectConfig, metric_direction, utility
from engine.errors import ConfigError, PoiseError
from engine.select import pareto
from engine.select.features import (
    FINGERPRINT,
    edges,
    gain_arrays,
    mechanism_matrix,
    order_by,
    scaled_into_range,
)
from engine.select.objective import utility_label

NOT_PARENTS = ("failed", "rejected")
CROWD_NEIGHBOURS = 5
CROWD_REFERENCE = 1024
CROWD_CHUNK = 2048
"""rows of the [N, CROWD_REFERENCE] distances taken at a time"""
MECH_COMPONENTS = 4
PRIOR_STD = 0.5
"""GP std (in y units) used when fewer than 3 nodes have observed descendant gains"""


class SelectError(PoiseError):
    """No node can be a parent (everything excluded, failed or rejected)."""


@dataclass
class Selection:
    chosen: list[str]
    """the parents, best first"""
    rows: list[dict[str, Any]]
    """one per node: node, pareto, perf, div, gp_ucb, descendant_gain, score (+ context)"""
    params: dict[str, Any] = field(default_factory=dict)

    def row(self, name: str) -> dict[str, Any]:
        return next(r for r in self.rows if r["node"] == name)

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": list(self.chosen), "rows": self.rows, "params": self.params}


def _check(sc: SelectConfig) -> None:
    if sc.top_k < 1:
        raise ConfigError("poise.toml: [select].top_k must be >= 1")
    if sc.kappa < 0:
        raise ConfigError("poise.toml: [select].kappa must be >= 0")
    if sc.gp_max_train < 3:
        raise ConfigError("poise.toml: [select].gp_max_train must be >= 3")
    if sc.expansion_half <= 0:
        raise ConfigError("poise.toml: [select].expansion_half must be > 0")
    for w in ("w_pareto", "w_perf", "w_div", "w_bayes"):
        if getattr(sc, w) < 0:
            raise ConfigError(f"poise.toml: [select].{w} must be >= 0")


def _read(archive: Any, protocol: Any) -> tuple[dict, dict | None, dict | None]:
    if isinstance(archive, Mapping):
        return dict(archive), None, None
    nodes = archive.nodes(protocol)
    names = list(nodes)
    blobs = archive.git.cat_blobs(
        [f"{nodes[n].commit}:algorithm.py" for n in names]
        + [f"{nodes[n].commit}:{FINGERPRINT}" for n in names]
    )
    k = len(names)
    sources = {n: b.decode("utf-8", "replace") for n, b in zip(names, blobs[:k]) if b is not None}
    fps = {n: b for n, b in zip(names, blobs[k:]) if b is not None}
    return nodes, sources, fps


def _why_unranked(node: Any, ref: ProtocolRef, objective: str) -> str:
    if node.result is not None:
        return (
            f"{node.result.status} under {ref.id}"
            if not node.result.ok
            else (f"objective {objective!r} not measured")
        )
    if getattr(node, "stale", None) is not None:
        return f"evaluated under an older version of {ref.id} ({node.stale.protocol.key})"
    # a result file that could not be read (hand-edited?) is not "no results": name it
    unreadable = sorted((getattr(node, "unreadable", None) or {}).items())
    own = [u for u in unreadable if u[0] in (f"{RESULTS_DIR}/{ref.id}.json", LEGACY_FILE)]
    if own:
        return f"{own[0][0]} is unreadable: {own[0][1]}"
    others = sorted(getattr(node, "results", {}) or {})
    if others:
        return f"results under {', '.join(others)} only (not compared with {ref.id})"
    if unreadable:
        return f"{unreadable[0][0]} is unreadable: {unreadable[0][1]}"
    return "no results"


def _gp_alpha(
    x: np.ndarray,
    y: np.ndarray | None,
    has_y: np.ndarray,
    kappa: float,
    max_train: int,
    rng: np.random.Generator,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, int]:
    """(mean, std) of the GP at the rows of x without an observed y (0 at the others: they keep their
    y); trained on a seeded uniform subset (<= max_train) of the rows with an observed y."""
    n = len(x)
    idx = np.flatnonzero(has_y)
    if idx.size < 3:
        mu = float(np.mean(y[idx])) if idx.size else 0.0
        return np.full(n, mu), np.full(n, PRIOR_STD), int(idx.size)
    if idx.size > max_train:
        idx = np.sort(rng.choice(idx, size=max_train, replace=False))
    # lazy: sklearn is heavy (only this path needs it)
    from sklearn.exceptions import ConvergenceWarning

    # lazy: sklearn is heavy (only this path needs it)
    from sklearn.gaussian_process import GaussianProcessRegressor

    # lazy: sklearn is heavy (only this path needs it)
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    kernel = ConstantKernel(1.0, (1e-2, 1e2)) * RBF(
        length_scale=np.sqrt(x.shape[1]), length_scale_bounds=(1e-2, 1e3)
    ) + WhiteKernel(0.1, (1e-5, 1e1))
    gp = GaussianProcessRegressor(
        kernel=kernel, normalize_y=True, random_state=seed, n_restarts_optimizer=0
    )

    # one BLAS thread: the matrices are small (<= max_train), and threaded BLAS that spins on a busy
    # machine made the fit's Cholesky factorisations ~100x slower
    with warnings.catch_warnings(), threadpool_limits(limits=1, user_api="blas"):
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(x[idx], y[idx])
        mu, sd = np.zeros(n), np.zeros(n)
        need = np.flatnonzero(~has_y)  # each row's prediction is its own: predict only these
        if need.size:
            mu[need], sd[need] = gp.predict(x[need], return_std=True)
    return mu, sd, int(idx.size)


def _crowding(
    mech: np.ndarray, ref: np.ndarray, chunk: int = CROWD_CHUNK
) -> tuple[np.ndarray, float]:
    """Per row of ``mech`` [N, D]: mean Euclidean distance to its nearest ``CROWD_NEIGHBOURS`` rows
    among ``ref`` (itself excluded); and the 90th percentile of the distances among the ``ref`` rows
    (> 0). When ``ref`` is every row (N <= CROWD_REFERENCE) both come from one [N, N] matrix; else
    the [N, R] distances are taken ``chunk`` rows at a time and never held whole."""
    n, r = len(mech), len(ref)
    if n <= r:
        return _crowding_all(mech)
    sq = (mech**2).sum(axis=1)
    own = np.full(n, -1)
    own[ref] = np.arange(r)  # the column of a reference row's distance to itself
    nn = min(CROWD_NEIGHBOURS, max(r - 1, 1))
    toward = -2.0 * mech[ref].T  # [D, R]: a row times it is -2 a.b, exactly
    crowd = np.empty(n)
    for a in range(0, n, chunk):
        rows = np.arange(a, min(n, a + chunk))
        d2 = mech[rows] @ toward
        d2 += sq[ref][None, :]  # |a|^2 + |b|^2 - 2 a.b less |a|^2: the same order within a row
        hit = np.flatnonzero(own[rows] >= 0)
        d2[hit, own[rows[hit]]] = np.inf
        near = d2 if nn >= r else np.partition(d2, nn - 1, axis=1)[:, :nn]
        near = near + sq[rows][:, None]
        np.maximum(near, 0.0, out=near)
        near = np.sort(np.sqrt(near), axis=1)[:, :nn]
        crowd[rows] = _mean_finite(near)
    d = _distances(mech[ref], np.arange(r))
    finite = d[np.isfinite(d)]
    scale = float(np.percentile(finite, 90, overwrite_input=True)) if finite.size else 1.0
    return crowd, scale if scale > 0 else 1.0


def _distances(mech: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """[N, R] Euclidean distances from every row to the ``ref`` rows; a row's own entry is inf."""
    sq = (mech**2).sum(axis=1)
    d = mech @ mech[ref].T  # [N, R], in place from here on: |a|^2 + |b|^2 - 2 a.b
    d *= 2.0
    np.subtract(sq[:, None] + sq[ref][None, :], d, out=d)
    np.maximum(d, 0.0, out=d)
    np.sqrt(d, out=d)
    d[ref, np.arange(len(ref))] = np.inf  # a node is not its own neighbour
    return d


def _mean_finite(near: np.ndarray) -> np.ndarray:
    """Row means over the finite entries; 1.0 for a row with none."""
    near = np.where(np.isfinite(near), near, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a row with no finite neighbour -> 1.0
        return np.nan_to_num(np.nanmean(near, axis=1), nan=1.0)


def _crowding_all(mech: np.ndarray) -> tuple[np.ndarray, float]:
    """:func:`_crowding` with every row in the reference: one [N, N] matrix."""
    n = len(mech)
    d = _distances(mech, np.arange(n))
    nn = min(CROWD_NEIGHBOURS, max(n - 1, 1))
    if n > 1:
        near = d if nn >= d.shape[1] else np.partition(d, nn - 1, axis=1)[:, :nn]
        crowd = _mean_finite(np.sort(near, axis=1)[:, :nn])
    else:
        crowd = np.ones(1)
    finite = d[np.isfinite(d)]
    scale = float(np.percentile(finite, 90, overwrite_input=True)) if finite.size else 1.0
    return crowd, scale if scale > 0 else 1.0


def _standardize(a: np.ndarray) -> np.ndarray:
    """Columns to zero mean and unit variance; a missing value takes its column's mean, and a column
    no row measured (an objective no candidate reports) is all 0."""
    a = scaled_into_range(np.where(np.isfinite(a), a, np.nan))
    measured = np.isfinite(a).any(axis=0)
    mean = np.nanmean(np.where(measured, a, 0.0), axis=0) if a.size else a
    a = np.where(np.isnan(a), mean, a)
    sd = a.std(axis=0)
    return (a - a.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def select_parents(
    archive: Any,
    cfg: Config | None = None,
    k: int | None = None,
    seed: int | None = None,
    exclude: Iterable[str] = (),
    *,
    sources: Mapping[str, str] | None = None,
    fingerprints: Mapping[str, Any] | None = None,
    protocol: str | None = None,
) -> Selection:
    """Rank the archive's nodes by s(d) and pick ``k`` parents (default ``[select].k``).

    ``archive``: an :class:`engine.archive.Archive` (nodes, algorithm.py and fingerprint.json read in
    one batch) or an already-read ``{name: Node}`` (then ``sources`` / ``fingerprints`` may give the
    mechanisms; without them diversity uses the objective vector). Results are compared under
    ``protocol`` (``id`` or ``id@hash``; default: the one ``cfg`` defines); nodes evaluated only under
    other protocols are listed with the reason, never ranked against them.

    The cyclic garbage collector is off while it runs (and back on after): at 100k nodes its
    full passes over the nodes, results and rows made up about a sixth of the time; what cycles a
    selection leaves are collected afterwards. BLAS runs on one thread, as the GP's fit did: on a
    shared 2-core machine a second BLAS thread waiting for work cost about a third more CPU time
    at 100k nodes and gained no wall time."""
    with no_gc(), threadpool_limits(limits=1, user_api="blas"):
        return _select_parents(
            archive,
            cfg,
            k,
            seed,
            exclude,
            sources=sources,
            fingerprints=fingerprints,
            protocol=protocol,
        )


def _select_parents(
    archive: Any,
    cfg: Config | None = None,
    k: int | None = None,
    seed: int | None = None,
    exclude: Iterable[str] = (),
    *,
    sources: Mapping[str, str] | None = None,
    fingerprints: Mapping[str, Any] | None = None,
    protocol: str | None = None,
) -> Selection:
    """:func:`select_parents` with the collector as it is."""
    if cfg is None:
        cfg = archive.config() if not isinstance(archive, Mapping) else Config()
    ref = named_protocol(protocol) or configured_protocol(cfg)
    nodes, src, fps = _read(archive, ref)
    sc, exp = cfg.select, cfg.experiment
    _check(sc)
    k = sc.k if k is None else int(k)
    if k < 1:
        raise SelectError("k must be >= 1")
    seed = sc.seed if seed is None else int(seed)
    sources = sources if sources is not None else src
    fingerprints = fingerprints if fingerprints is not None else fps
    exclude = set(exclude)
    rng = np.random.default_rng(seed)
    weights = {"pareto": sc.w_pareto, "perf": sc.w_perf, "div": sc.w_div, "bayes": sc.w_bayes}

    # the nodes in (created, name) order; arrays below are in this order unless named *_k (the
    # mapping's order, which the descendant gain's best-effort pass over cycles follows)
    keys = list(nodes)
    node_k = list(nodes.values())
    created = np.array(list(map(attrgetter("created"), node_k)), dtype=float)
    perm = order_by(created, keys)
    names = list(map(keys.__getitem__, perm.tolist()))
    node_l = list(map(node_k.__getitem__, perm.tolist()))
    n_all = len(names)
    res_l = list(map(attrgetter("result"), node_l))
    status_l = list(map(attrgetter("status"), node_l))
    depth_l = list(map(attrgetter("depth"), node_l))
    # the compared result's metrics as they are (Node.metrics copies them); read, never written
    mets = [_NO_METRICS if r is None else r.metrics for r in res_l]
    has_res = np.array([r is not None for r in res_l], dtype=bool)
    ok = np.array([r is not None and r.ok for r in res_l], dtype=bool)

    # U only from a successful result: a failed one may hold the mean of the seeds that survived
    # (unless [select].allow_failed asks for failed nodes as parents, on what they measured)
    counted = ok | has_res if sc.allow_failed else ok
    u_all, has_u = _utilities(mets, counted, exp)
    ranked_res = list(map(res_l.__getitem__, np.flatnonzero(has_u).tolist()))
    same = attrgetter("protocol.id", "protocol.hash")
    if (
        len(set(map(same, ranked_res))) > 1
        or len(set(map(methodcaller("unit", exp.objective), ranked_res))) > 1
    ):
        # one protocol and unit: nothing to refuse
        require_comparable(
            {names[i]: res_l[i] for i in np.flatnonzero(has_u).tolist()}, exp.objective
        )
    index_k = dict(zip(keys, range(n_all)))
    child_k, parent_k = edges(keys, [n.parents for n in node_k], index_k)
    inv = np.empty(n_all, dtype=np.intp)
    inv[perm] = np.arange(n_all)
    has_u_k, u_k = np.zeros(n_all, dtype=bool), np.zeros(n_all)
    has_u_k[perm], u_k[perm] = has_u, u_all
    gain, has_gain, n_desc = (
        a[perm]
        for a in gain_arrays(keys, u_k, has_u_k, child_k, parent_k, sc.top_k, sc.gamma, sc.beta)
    )
    child, parent = inv[child_k], inv[parent_k]  # the same edges, in names' positions
    n_kids_all = np.bincount(parent, minlength=n_all)

    status_a = np.array(status_l, dtype=object)
    rejected = status_a == "rejected"
    # not rejected, and not failed under the compared protocol: a node's status is its latest
    # result's, under whichever protocol that was recorded
    if sc.allow_failed:
        allowed = np.ones(n_all, dtype=bool)
    else:
        not_parent = np.array([st in NOT_PARENTS for st in status_l], dtype=bool)
        allowed = np.where(rejected | ~has_res, ~not_parent, ok)
    excluded = (
        np.array([n in exclude for n in names], dtype=bool)
        if exclude
        else np.zeros(n_all, dtype=bool)
    )
    pop = np.flatnonzero(has_u & allowed)
    pop_names = list(map(names.__getitem__, pop.tolist()))
    pop_mets = list(map(mets.__getitem__, pop.tolist()))
    objectives = (
        pareto.parse_objectives(exp.pareto_objectives, exp)
        if exp.pareto_objectives
        else pareto.default_objectives(pop_mets, exp.objective, exp.length_penalty, exp)
    )
    params: dict[str, Any] = {
        "k": k,
        "top_k": sc.top_k,
        "gamma": sc.gamma,
        "beta": sc.beta,
        "kappa": sc.kappa,
        "weights": weights,
        "seed": seed,
        "allow_failed": sc.allow_failed,
        "objectives": [("-" if s < 0 else "") + m for m, s in objectives],
        "directions": _directions(objectives, exp),
        "utility": utility_label(exp),
        "protocol": ref.key,
    }
    why: list[str | None] = [None] * n_all
    for i in np.flatnonzero(excluded | ~allowed | ~has_u).tolist():
        node = node_l[i]
        if excluded[i]:
            why[i] = "excluded"
        elif not allowed[i]:
            failed_here = res_l[i] is not None and not ok[i]
            why[i] = f"{'failed' if failed_here else node.status}: evidence, not a parent"
        else:
            why[i] = _why_unranked(node, ref, exp.objective)
    table = _Table(
        names, status_l, depth_l, res_l, n_kids_all, u_all, has_u, gain, has_gain, n_desc, why
    )

    cand_in_pop = np.flatnonzero(~excluded[pop])  # positions in pop of the candidates
    if not cand_in_pop.size:
        rows = {r["node"]: r for r in table.rows(np.arange(n_all))}
        pos = {n: i for i, n in enumerate(names)}
        return _fallback(
            nodes, names, rows, exclude, lambda n: bool(allowed[pos[n]]), k, params, ref
        )

    # the unit U is on (one: require_comparable refused results on different units above)
    params["unit"] = next(
        (res_l[i].unit(exp.objective) for i in pop.tolist() if res_l[i] is not None), None
    )

    # -- population components --------------------------------------------------------------
    y = pareto.objective_matrix(pop_mets, objectives)
    layer = pareto.layers(y)
    u_par = pareto.strength(layer)
    u = u_all[pop]
    us = scaled_into_range(u)  # u itself unless it nears the float limit (the span would overflow)
    span = us.max() - us.min()
    u_perf = (us - us.min()) / span if span > 0 else np.ones(len(pop))
    n_kids = n_kids_all[pop].astype(float)
    # per parent: its children that are failure evidence (rejected, failed under the compared
    # protocol, or failed with no result under any)
    failed = rejected | (has_res & ~ok)
    for i in np.flatnonzero(~has_res & (status_a == "failed")).tolist():
        failed[i] = failed[i] or not node_l[i].results
    failed_kids = np.bincount(parent[failed[child]], minlength=n_all)
    failed_frac = failed_kids[pop] / np.maximum(n_kids, 1)
    depth = np.array(depth_l, dtype=float)[pop]

    ystd = _standardize(y)
    mech, mech_kind = mechanism_matrix(
        pop_names, sources, fingerprints, ystd / max(1.0, np.sqrt(y.shape[1]))
    )
    params["mechanism"] = mech_kind

    # crowding: mean distance to the nearest neighbours within a seeded reference sample
    ref = (
        np.arange(len(pop))
        if len(pop) <= CROWD_REFERENCE
        else np.sort(rng.choice(len(pop), CROWD_REFERENCE, replace=False))
    )
    crowd, scale = _crowding(mech, ref)
    crowd_n = np.clip(crowd / scale, 0.0, 1.0)
    discount = 1.0 / (1.0 + n_kids / sc.expansion_half)

    # -- GP-UCB on the descendant gain --------------------------------------------------------
    has_y = has_gain[pop]
    yg = np.where(has_gain, gain, 0.0)[pop]
    mech_pc = mech - mech.mean(axis=0)
    if mech_pc.shape[1] > MECH_COMPONENTS and len(pop) > 1:
        _, vecs = np.linalg.eigh(mech_pc.T @ mech_pc)  # principal axes of a [D, D] scatter matrix
        mech_pc = mech_pc @ vecs[:, ::-1][:, :MECH_COMPONENTS]
    feats = _standardize(
        np.column_stack(
            [u, np.where(np.isfinite(y), y, np.nan), depth, n_kids, failed_frac, mech_pc]
        )
    )
    mu, sd, n_train = _gp_alpha(feats, yg, has_y, sc.kappa, sc.gp_max_train, rng, seed)
    alpha = np.where(has_y, yg, mu + sc.kappa * sd)
    u_gp = np.clip((alpha + 1.0) / 2.0, 0.0, 1.0)
    params["gp"] = {
        "train": n_train,
        "observed": int(has_y.sum()),
        "max_train": sc.gp_max_train,
        "subset": "seeded uniform sample of nodes with an observed descendant gain",
    }

    # -- greedy, diversity-aware picks --------------------------------------------------------
    ci = cand_in_pop
    base = sc.w_pareto * u_par[ci] + sc.w_perf * u_perf[ci] + sc.w_bayes * u_gp[ci]
    tiebreak = rng.permutation(len(ci))
    d_pick = np.ones(len(ci))
    alive = np.ones(len(ci), dtype=bool)
    mech_c, disc_c, crowd_c = mech[ci], discount[ci], crowd_n[ci]
    picks: list[tuple[int, float, float]] = []  # (position in ci, div, score) at the pick
    for _ in range(min(k, len(ci))):
        div = disc_c * (0.5 * d_pick + 0.5 * crowd_c)
        score = base + sc.w_div * div
        masked = np.where(alive, score, -np.inf)
        top = masked.max()
        if np.isnan(top):  # NaN last, as the sort by -score put it
            best = int(np.lexsort((tiebreak, -masked))[0])
        else:  # the highest score, ties by the seeded permutation: the sort's first, unsorted
            tied = np.flatnonzero(masked == top)
            best = int(tied[np.argmin(tiebreak[tied])])
        picks.append((best, float(div[best]), float(score[best])))
        alive[best] = False
        dist = np.linalg.norm(mech_c - mech_c[best], axis=1) / scale
        d_pick = np.minimum(d_pick, np.clip(dist, 0.0, 1.0))
    div = disc_c * (0.5 * d_pick + 0.5 * crowd_c)
    score = base + sc.w_div * div
    chosen = [pop_names[int(ci[b])] for b, _, _ in picks]
    # every population member gets its components (excluded ones no div or score), candidates
    # their div and score (the chosen ones as they stood when picked) and the chosen their rank
    table.fill(pop, layer, u_par, u_perf, alpha)
    div_o, score_o = div.astype(object), score.astype(object)
    rank = np.full(len(ci), None, dtype=object)
    for r, (b, d, s) in enumerate(picks):
        div_o[b], score_o[b], rank[b] = d, s, r + 1
    at = pop[ci]
    table.div[at], table.score[at], table.rank[at] = div_o, score_o, rank
    return Selection(chosen, table.rows(table.order(at, picks, score)), params)


_NO_METRICS: Mapping[str, float] = {}
"""the metrics of a node without a result under the compared protocol (read only)"""

_ROW_KEYS = (
    "node",
    "status",
    "depth",
    "children",
    "utility",
    "layer",
    "pareto",
    "perf",
    "div",
    "gp_ucb",
    "descendant_gain",
    "descendants",
    "score",
    "rank",
    "eligible",
    "why",
    "seeds",
)


class _Table:
    """The rows of a selection as one column per field (object arrays, None where unset), made into
    the row dicts once, in their final order."""

    def __init__(
        self, names, status, depth, res_l, children, util, has_u, gain, has_gain, n_desc, why
    ):
        n = len(names)

        def col(values=None, where=None) -> np.ndarray:
            out = np.full(n, None, dtype=object)
            if values is not None:
                if where is None:
                    out[:] = values
                else:
                    out[where] = values[where]
            return out

        self.names = names
        self.node = np.array(names, dtype=object)
        self.status = col(status)
        self.depth = col(depth)
        self.children = col(children)
        self.utility = col(util, has_u)
        self.layer, self.pareto, self.perf, self.gp_ucb = col(), col(), col(), col()
        self.div, self.score, self.rank = col(), col(), col()
        self.descendant_gain = col(gain, has_gain)
        self.descendants = col(n_desc)
        self.why = col(why)
        self.eligible = col(np.array([w is None for w in why], dtype=bool))
        self.seeds = [None if r is None else list(r.seeds) for r in res_l]  # lists: no array

    def fill(self, at, layer, u_par, u_perf, alpha) -> None:
        self.layer[at], self.pareto[at], self.perf[at], self.gp_ucb[at] = (
            layer,
            u_par,
            u_perf,
            alpha,
        )

    def order(self, at: np.ndarray, picks, score: np.ndarray) -> np.ndarray:
        """Rows by (chosen rank, -score, name): the chosen, then the other candidates best first,
        then the rest by name."""
        n = len(self.names)
        first = np.array([int(at[b]) for b, _, _ in picks], dtype=np.intp)
        rest = np.ones(len(at), dtype=bool)
        rest[[b for b, _, _ in picks]] = False
        scored = at[rest]
        if np.isnan(score[rest]).any():  # as the row sort ordered them (NaN compares false)
            return np.array(
                sorted(
                    range(n),
                    key=lambda i: (
                        self.rank[i] is None,
                        self.rank[i] or 0,
                        self.score[i] is None,
                        -(self.score[i] or 0.0),
                        self.names[i],
                    ),
                ),
                dtype=np.intp,
            )
        scored = scored[order_by(-score[rest], [self.names[i] for i in scored.tolist()])]
        others = np.ones(n, dtype=bool)
        others[at] = False
        unscored = np.flatnonzero(others)
        unscored = unscored[
            np.array(
                sorted(
                    range(unscored.size), key=[self.names[i] for i in unscored.tolist()].__getitem__
                ),
                dtype=np.intp,
            )
        ]
        return np.concatenate([first, scored, unscored])

    def rows(self, order: np.ndarray) -> list[dict[str, Any]]:
        """The row dicts, in ``order`` (their keys in :data:`_ROW_KEYS`' order)."""
        c = [getattr(self, key)[order].tolist() for key in _ROW_KEYS[:-1]]
        c.append([self.seeds[i] for i in order.tolist()])
        return [
            {
                "node": a,
                "status": b,
                "depth": d,
                "children": e,
                "utility": f,
                "layer": g,
                "pareto": h,
                "perf": i,
                "div": j,
                "gp_ucb": k,
                "descendant_gain": m,
                "descendants": o,
                "score": p,
                "rank": q,
                "eligible": r,
                "why": s,
                "seeds": t,
            }
            for a, b, d, e, f, g, h, i, j, k, m, o, p, q, r, s, t in zip(*c)
        ]


def _utilities(mets: list, counted: np.ndarray, exp) -> tuple[np.ndarray, np.ndarray]:
    """U of every counted node (``engine.config.utility`` on its metrics) and where it has one,
    as arrays: the objective's value, its sign, less length_penalty * mean_length where measured."""
    n = len(mets)
    u, has = np.zeros(n), np.zeros(n, dtype=bool)
    idx = np.flatnonzero(counted)
    if not idx.size:
        return u, has
    sub = [mets[i] for i in idx.tolist()]
    vals = list(map(methodcaller("get", exp.objective), sub))
    got = np.array([v is not None for v in vals], dtype=bool)
    try:
        col = np.array([0.0 if v is None else float(v) for v in vals], dtype=float)
        # U's sign rule, read from utility itself: +1 or -1
        sign = utility({exp.objective: 1.0}, dataclasses.replace(exp, length_penalty=0.0))
        if sign < 0:
            col = -col
        if exp.length_penalty:
            lengths = list(map(methodcaller("get", "mean_length"), sub))
            has_len = np.array([v is not None for v in lengths], dtype=bool)
            ln = np.array([0.0 if v is None else float(v) for v in lengths], dtype=float)
            col = np.where(has_len, col - exp.length_penalty * ln, col)
    except (TypeError, ValueError, OverflowError):  # a value utility reads as it is: as it did
        col = np.array([utility(m, exp) if g else 0.0 for m, g in zip(sub, got)], dtype=float)
    u[idx], has[idx] = col, got
    return u, has


def _directions(objectives, exp) -> list[dict[str, str]]:
    """Each objective's direction and where it comes from (poise.toml, length directive, default)."""
    out = []
    for m, s in objectives:
        d, why = metric_direction(m, exp)
        if (s < 0) != (d == "min"):  # a sign written into pareto_objectives
            d, why = ("min" if s < 0 else "max"), "pareto_objectives sign"
        out.append({"metric": m, "direction": d, "why": why})
    return out


def _fallback(
    nodes: dict,
    names: list[str],
    rows: dict,
    exclude: set,
    allowed,
    k: int,
    params: dict,
    ref: ProtocolRef,
) -> Selection:
    """No evaluated candidate: pick unevaluated, non-failed nodes, shallowest and oldest first."""
    pool = [n for n in names if n not in exclude and allowed(n)]
    if not pool:
        raise SelectError(
            "no node can be a parent: every node is excluded, failed or rejected "
            "(set [select].allow_failed = true to allow failed ones)"
        )
    pool.sort(key=lambda n: (nodes[n].depth, nodes[n].created, n))
    chosen = pool[:k]
    for r, n in enumerate(chosen):
        rows[n]["rank"] = r + 1
    params["fallback"] = (
        "no evaluated candidates: unevaluated nodes picked, shallowest and oldest first"
    )
    # nodes evaluated under other protocols (or another version of this one) only: say where
    elsewhere = protocols_with_results({n: nodes[n] for n in names}, besides=ref.matches)
    if elsewhere:
        params["fallback"] += (
            f" (no node has an evaluated result under {params['protocol']}; results under "
            f"{describe_elsewhere(elsewhere, ref.id)}: --protocol {max(elsewhere, key=elsewhere.get)} "
            "ranks them)"
        )
    out = sorted(rows.values(), key=lambda r: (r["rank"] is None, r["rank"] or 0, r["node"]))
    return Selection(chosen, out, params)
