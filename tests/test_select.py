"""The selector: descendant gain by hand, Pareto layers, determinism, unevaluated nodes, CLI schema,
retrospective analysis. Lineages are built with Archive.spawn and recorded with the real CLI."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
from results_util import proxy_result, record

from engine.archive.store import Archive
from engine.config import Config, ExperimentConfig, SelectConfig
from engine.select import SelectError, pareto, retrospect, select_parents
from engine.select.features import descendant_gain
from engine.select.pareto import default_objectives, layers, strength

run_cli = None


@pytest.fixture(autouse=True)
def _cli(cli):
    """The real entry point, in this process (conftest.run_cli_inprocess), for helpers below."""
    global run_cli
    run_cli = cli


EDIT = '''\
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """variant {i}"""
    scores = batch.rewards.to(torch.float32) * {scale}
    return scores - scores.mean()
'''


LAB = "lab-eval/v1"
"""the protocol of the externally recorded lineage (its archive ranks under it)"""


def put(arch: Archive, node: str, tmp_path, via_cli: bool = False, **metrics) -> None:
    """``poise-git record --protocol lab-eval/v1`` (the real CLI, for an archive configured to rank
    under that protocol) or a typed proxy result (faster, for bigger lineages)."""
    if not via_cli:
        record(arch, node, metrics)
        return
    f = tmp_path / f"{node}.json"
    f.write_text(json.dumps(metrics))
    r = run_cli(
        "record",
        node,
        "--results",
        str(f),
        "--protocol",
        LAB,
        "--unit",
        "fraction",
        "--archive",
        str(arch.path),
    )
    assert r.returncode == 0, r.stderr


def spawn(arch, parent, name, trailers=None, edit=None):
    return arch.spawn(parent, name, edit, trailers=trailers)


@pytest.fixture(scope="module")
def lineage(tmp_path_factory):
    """grpo 0.40 -> A 0.50 -> A1 0.60, A2 0.55 ; grpo -> B 0.50 -> B1 0.45 (B == A in code).
    Built once per module; the tests using it only read it."""
    global run_cli
    spec = importlib.util.spec_from_file_location(
        "_select_conftest", Path(__file__).with_name("conftest.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    run_cli = mod.run_cli_inprocess
    tmp_path = tmp_path_factory.mktemp("lineage")
    from engine.config import DEFAULT_TOML

    toml = DEFAULT_TOML.replace('# protocol = "proxy/default"', f'protocol = "{LAB}"')
    assert f'protocol = "{LAB}"' in toml
    archive = Archive.init(tmp_path / "exp", config_toml=toml)
    put(archive, "grpo", tmp_path, via_cli=True, overall=0.40)
    for n in ("A", "B"):
        spawn(archive, "grpo", n)
        put(archive, n, tmp_path, via_cli=True, overall=0.50)
    for n, p, u in (("A1", "A", 0.60), ("A2", "A", 0.55), ("B1", "B", 0.45)):
        spawn(archive, p, n)
        put(archive, n, tmp_path, via_cli=True, overall=u)
    return archive


def test_descendant_gain_by_hand(lineage):
    nodes = lineage.nodes()
    util = {n: v.overall for n, v in nodes.items()}
    g, b = 0.8, 0.05
    gains, count = descendant_gain(nodes, util, top_k=3, gamma=g, beta=b)
    t = math.tanh
    assert gains["A"] == pytest.approx((g * t(0.10 / b) + g * t(0.05 / b)) / 2)
    assert gains["B"] == pytest.approx(g * t(-0.05 / b))
    # root: top-3 by U of {A1 .60 d2, A2 .55 d2, A .50 d1, B .50 d1, B1 .45 d2} -> A1, A2, then B (name tie-break)
    assert gains["grpo"] == pytest.approx(
        (g**2 * t(0.2 / b) + g**2 * t(0.15 / b) + g * t(0.1 / b)) / 3
    )
    assert "A1" not in gains and count["grpo"] == 5
    gains1, _ = descendant_gain(nodes, util, top_k=1, gamma=g, beta=b)
    assert gains1["grpo"] == pytest.approx(g**2 * t(0.2 / b))


def test_improving_lineage_outranks_equal_parent(lineage):
    sel = select_parents(lineage, k=5)
    a, b = sel.row("A"), sel.row("B")
    assert a["perf"] == b["perf"] and a["pareto"] == b["pareto"]
    assert a["descendant_gain"] > 0 > b["descendant_gain"]
    assert a["score"] > b["score"]
    assert sel.chosen.index("A") < sel.chosen.index("B")
    for key in ("pareto", "perf", "div", "gp_ucb", "score"):
        assert all(r[key] is not None for r in sel.rows if r["eligible"])


def test_pareto_layers_known_set():
    y = np.array([[3, 1], [1, 3], [2, 2], [2, 1], [1, 2], [1, 1], [0, 0], [3, 1]], dtype=float)
    assert layers(y).tolist() == [0, 0, 0, 1, 1, 2, 3, 0]
    y3 = np.array(
        [[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0], [1, 1, 1], [-np.inf, 5, 5]], dtype=float
    )
    assert layers(y3).tolist() == [1, 1, 1, 2, 0, 0]
    assert strength(np.array([0, 1, 2])).tolist() == [1.0, 0.5, 0.0]
    rng = np.random.default_rng(3)
    pts = np.round(rng.normal(size=(120, 3)), 1)
    lay = layers(pts)
    for i in range(
        len(pts)
    ):  # brute force: no point dominates another of its own or an earlier layer
        dom = (pts >= pts[i]).all(axis=1) & (pts > pts[i]).any(axis=1)
        assert (lay[dom] < lay[i]).all()
        if lay[i] > 0:
            assert (lay[dom] == lay[i] - 1).any()


def test_default_objectives_and_length_directive(archive, tmp_path):
    ms = [
        {
            "overall": 0.5,
            "mean_length": 300,
            "aime/pass@32": 0.2,
            "math/acc@1": 0.7,
            "valid_rate": 1.0,
        },
        {"overall": 0.4, "mean_length": 100, "aime/pass@32": 0.3, "math/acc@1": 0.6},
    ]
    assert default_objectives(ms, "overall", 0.0) == [
        ("overall", 1.0),
        ("aime/pass@32", 1.0),
        ("math/acc@1", 1.0),
    ]
    assert default_objectives(ms, "overall", 1e-3)[-1] == ("mean_length", -1.0)
    put(archive, "grpo", tmp_path, overall=0.5, mean_length=300)
    spawn(archive, "grpo", "short")
    put(archive, "short", tmp_path, overall=0.45, mean_length=100)
    cfg = Config(experiment=ExperimentConfig(pareto_objectives=("overall", "-mean_length")))
    sel = select_parents(archive, cfg, k=2)
    assert sel.row("short")["pareto"] == 1.0 and sel.row("grpo")["pareto"] == 1.0
    assert sel.params["objectives"] == ["overall", "-mean_length"]
    sel1 = select_parents(archive, Config(), k=2)
    assert sel1.row("short")["pareto"] == 0.0


def test_an_objective_no_node_measured_ranks_as_missing_not_a_crash(archive, tmp_path):
    """pareto(overall, -mean_length) on results that report no mean_length: the column is missing
    everywhere (worst for all, so no one's strength changes), and the GP's features stay finite."""
    put(archive, "grpo", tmp_path, overall=0.40)
    parent = "grpo"
    for i, u in enumerate((0.45, 0.42, 0.50, 0.48)):  # a chain: 4 nodes with observed gains
        spawn(archive, parent, f"n{i}", edit=EDIT.format(i=i, scale=1 + i))
        put(archive, f"n{i}", tmp_path, overall=u)
        parent = f"n{i}"
    cfg = Config(experiment=ExperimentConfig(pareto_objectives=("overall", "-mean_length")))
    sel = select_parents(archive, cfg, k=2)
    plain = select_parents(archive, Config(experiment=ExperimentConfig()), k=2)
    assert sel.params["gp"]["observed"] == 4 and sel.chosen == plain.chosen
    for r in sel.rows:
        assert all(math.isfinite(r[k]) for k in ("pareto", "perf", "div", "gp_ucb", "score"))
        assert r["pareto"] == plain.row(r["node"])["pareto"]


def test_determinism_and_diversity(archive, tmp_path):
    put(archive, "grpo", tmp_path, overall=0.40)
    rng = np.random.default_rng(0)
    for i in range(12):
        parent = "grpo" if i < 4 else f"n{rng.integers(0, i)}"
        spawn(archive, parent, f"n{i}", edit=EDIT.format(i=i, scale=1 + i % 3))
        put(archive, f"n{i}", tmp_path, overall=float(np.round(rng.uniform(0.3, 0.6), 3)))
    a = select_parents(archive, k=3, seed=7)
    b = select_parents(archive, k=3, seed=7)
    assert a.chosen == b.chosen and a.rows == b.rows and len(set(a.chosen)) == 3
    assert a.params["mechanism"] == "code"
    c = select_parents(archive, k=3, seed=7, exclude=[a.chosen[0]])
    assert a.chosen[0] not in c.chosen and c.row(a.chosen[0])["score"] is None
    # the first pick's distance term is 1; a node with the same mechanism as a pick loses it
    first = a.row(a.chosen[0])
    twins = [r for r in a.rows if r["eligible"] and r["rank"] is None]
    assert all(r["div"] <= 1.0 for r in twins) and first["div"] is not None


def test_a_fallback_names_the_protocols_that_have_results(archive):
    """Nodes evaluated only under another preset are not 'unevaluated': the fallback says where their
    results are and which --protocol ranks them."""
    record(archive, "grpo", {"overall": 0.5}, preset="tiny")
    record(archive, "grpo", {"overall": 0.4}, preset="smoke")
    archive.spawn("grpo", "child")
    record(archive, "child", {"overall": 0.6}, preset="tiny")
    fallback = select_parents(archive).params["fallback"]
    assert "no node has an evaluated result under proxy/default@" in fallback, fallback
    assert "results under other protocols: proxy/smoke (1 node), proxy/tiny (2 nodes)" in fallback
    assert fallback.endswith("--protocol proxy/tiny ranks them)")
    assert select_parents(archive, protocol="proxy/tiny").chosen[0] == "child"
    fresh = select_parents(Archive.init(archive.path.parent / "fresh")).params["fallback"]
    assert "results under" not in fresh


def test_a_fallback_calls_results_under_an_older_hash_another_version(archive):
    """Results under the ranked id with another hash are an older version of that protocol, not
    another protocol."""
    older = proxy_result({"overall": 0.5})
    older = dataclasses.replace(
        older, protocol=dataclasses.replace(older.protocol, hash="sha256:" + "ab" * 32)
    )
    archive.record_result("grpo", older)
    record(archive, "grpo", {"overall": 0.4}, preset="smoke")
    fallback = select_parents(archive).params["fallback"]
    assert (
        "results under another version of proxy/default (1 node); "
        "other protocols: proxy/smoke (1 node)" in fallback
    ), fallback


def test_select_explain_says_a_status_once_and_its_json_rows_carry_the_seeds(archive, cli):
    """`select --explain` reads "failed (evidence, not a parent)", not "failed (failed: ...)";
    each `select --json` row has the seeds of the node's result under the ranked protocol (None
    without one), beside the keys it had."""
    record(archive, "grpo", {"metrics": {"overall": 0.4}, "seeds": [0, 1, 2]})
    for name in ("pending", "broken", "crash"):
        spawn(archive, "grpo", name)
    archive.set_status("broken", "rejected", reason="static check failed")
    failed = {"metrics": {"overall": 0.9}, "seeds": [0, 1], "status": "failed", "reason": "oom"}
    record(archive, "crash", failed)
    r = cli("select", "--explain", "-C", str(archive.path))
    assert r.returncode == 0, r.stderr
    cells = [[c.strip() for c in ln.split("│")[1:-1]] for ln in r.stdout.splitlines()]
    status = {c[1]: c[2] for c in cells if len(c) > 2}
    assert status["crash"] == "failed (evidence, not a parent)", status
    assert status["broken"] == "rejected (evidence, not a parent)", status
    assert status["pending"] == "spawned (no results)", status
    r = cli("select", "--json", "-C", str(archive.path))
    out = {row["node"]: row for row in json.loads(r.stdout)["rows"]}
    assert {n: out[n]["seeds"] for n in out} == {
        "grpo": [0, 1, 2],
        "pending": None,
        "broken": None,
        "crash": [0, 1],
    }
    assert out["crash"]["why"] == "failed: evidence, not a parent"  # the JSON's text as it was
    assert set(out["grpo"]) >= {"node", "status", "utility", "score", "rank", "eligible", "why"}


def test_unevaluated_and_failed_nodes(archive, tmp_path):
    sel = select_parents(archive)  # fresh archive: the unevaluated root is the only choice
    assert sel.chosen == ["grpo"] and "fallback" in sel.params
    put(archive, "grpo", tmp_path, overall=0.4)
    spawn(archive, "grpo", "pending")
    spawn(archive, "grpo", "broken")
    archive.set_status("broken", "rejected", reason="static check failed")
    spawn(archive, "grpo", "crash")
    record(archive, "crash", {"metrics": {"overall": 0.9}, "status": "failed", "reason": "oom"})
    sel = select_parents(archive, k=3)
    assert sel.chosen == ["grpo"]
    rows = {r["node"]: r for r in sel.rows}
    assert rows["pending"]["why"] == "no results" and rows["broken"]["eligible"] is False
    assert rows["crash"]["why"].startswith("failed") and rows["grpo"]["children"] == 3
    cfg = Config(select=SelectConfig(allow_failed=True))
    assert select_parents(archive, cfg, k=1).chosen == ["crash"]
    with pytest.raises(SelectError):
        select_parents(archive, exclude=["grpo", "pending"])


def test_select_cli_json_schema(lineage):
    r = run_cli("select", "--k", "2", "--json", "--archive", str(lineage.path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"chosen", "rows", "params"} and len(out["chosen"]) == 2
    for key in ("top_k", "gamma", "beta", "kappa", "weights", "seed"):
        assert key in out["params"]
    assert set(out["params"]["weights"]) == {"pareto", "perf", "div", "bayes"}
    for row in out["rows"]:
        assert {"node", "pareto", "perf", "div", "gp_ucb", "descendant_gain", "score"} <= set(row)
    assert out["chosen"] == [r["node"] for r in out["rows"][:2]]
    r = run_cli("select", "--explain", "--archive", str(lineage.path))
    assert r.returncode == 0 and "chosen:" in r.stdout and "kappa=1.0" in r.stdout
    bad = run_cli("select", "--archive", str(lineage.path / "nope"))
    assert bad.returncode == 1 and "error" in bad.stderr and lineage.fsck()


def test_retrospect_rounds(archive, tmp_path):
    """Round 1 ranks A over B (below the root), but B's line wins later: a miss; round 2 is a hit;
    round 0 has a single parent and is not judged."""
    put(archive, "grpo", tmp_path, overall=0.40)
    for n, u in (("A", 0.50), ("B", 0.35)):
        spawn(archive, "grpo", n, trailers={"Poise-Round": "0"})
        put(archive, n, tmp_path, overall=u)
    r1 = {"A": ("1", "0.9"), "B": ("2", "0.7")}
    for n, p, u in (("A1", "A", 0.52), ("B1", "B", 0.45)):
        rank, score = r1[p]
        spawn(
            archive,
            p,
            n,
            trailers={
                "Poise-Round": "1",
                "Poise-Selection-Rank": rank,
                "Poise-Selection-Score": score,
            },
        )
        put(archive, n, tmp_path, overall=u)
    for n, p, rank, u in (("B2", "B1", "1", 0.58), ("A1a", "A1", "2", 0.50)):
        spawn(
            archive,
            p,
            n,
            trailers={
                "Poise-Round": "2",
                "Poise-Selection-Rank": rank,
                "Poise-Selection-Score": "0.5",
            },
        )
        put(archive, n, tmp_path, overall=u)
    rep = retrospect(archive)
    by = {r["round"]: r for r in rep["rounds"]}
    assert by[1]["top_parent"] == "A" and by[1]["best_parent"] == "B" and by[1]["hit"] is False
    b = next(e for e in by[1]["parents"] if e["parent"] == "B")
    assert b["best_descendant"] == "B2" and b["gain"] == pytest.approx(0.23)
    assert by[2]["top_parent"] == "B1" and by[2]["hit"] is True and by[0]["hit"] is None
    s = rep["summary"]
    assert (s["top_parent_best"], s["top_parent_not_best"]) == (1, 1)
    assert s["selected_below_root"] == 1 and s["below_root_led_above"] == 1  # B: 0.35 -> B2 0.58
    r = run_cli("retrospect", "--json", "--archive", str(archive.path))
    assert r.returncode == 0 and json.loads(r.stdout)["summary"] == json.loads(json.dumps(s))
    # without trailers: generations as rounds, parents ranked by utility
    nodes = {n: v for n, v in archive.nodes().items()}
    for v in nodes.values():
        v.trailers = {
            k: x
            for k, x in v.trailers.items()
            if not k.startswith(("Poise-Round", "Poise-Selection"))
        }
    rep2 = retrospect(nodes)
    assert any("generation" in a for a in rep2["assumptions"]) and any(
        "utility" in a for a in rep2["assumptions"]
    )
    by2 = {r["round"]: r for r in rep2["rounds"]}
    assert by2[2]["top_parent"] == "A" and by2[2]["best_parent"] == "B" and by2[2]["hit"] is False


def _peeled_layers(y: np.ndarray) -> list[int]:
    """The obviously correct O(N^2) non-dominated sort: peel off, again and again, the rows no
    remaining row dominates (a missing value, -inf, is the worst; equal rows dominate neither)."""
    n = len(y)
    want, left, layer = [-1] * n, set(range(n)), 0
    while left:
        front = [
            i for i in left if not any((y[j] >= y[i]).all() and (y[j] > y[i]).any() for j in left)
        ]
        for i in front:
            want[i] = layer
        left -= set(front)
        layer += 1
    return want


def _direct_gain(nodes, util, top_k, gamma, beta):
    """The definition read literally: every evaluated descendant at its shortest depth (breadth
    first), the top-K by (U, name), the mean of the discounted tanh gains; descendants counted
    along every path."""
    kids = {n: set() for n in nodes}
    for n, node in nodes.items():
        for p in node.parents:
            if p in nodes:
                kids[p].add(n)
    gains, count = {}, {}
    for d in nodes:
        depth, wave, seen = {}, {d}, {d}
        for gen in range(1, len(nodes) + 1):
            wave = {c for w in wave for c in kids[w]} - seen
            if not wave:
                break
            seen |= wave
            depth.update({c: gen for c in wave})
        best = sorted((c for c in depth if util[c] is not None), key=lambda c: (util[c], c))
        best = best[::-1][:top_k]
        if best and util[d] is not None:
            vals = [gamma ** depth[c] * math.tanh((util[c] - util[d]) / beta) for c in best]
            gains[d] = sum(vals) / len(vals)

    paths: dict[str, int] = {}

    def count_paths(n):
        if n not in paths:
            paths[n] = sum((util[c] is not None) + count_paths(c) for c in kids[n])
        return paths[n]

    count = {n: count_paths(n) for n in nodes}
    return gains, count


def test_descendant_gain_matches_the_definition_on_random_lineages():
    """The array pass (a generation of the topological order at a time) against the definition, on
    random lineages with crossovers (repeated parents among them), tied utilities, unevaluated
    nodes and parents outside the archive; top-K from 1 to 9 (means of 8 or more values too)."""
    rng = np.random.default_rng(5)
    for case in range(120):
        n = int(rng.integers(1, 45))
        names = [f"x{int(v)}" for v in rng.permutation(1000)[:n]]
        nodes = {}
        for i, name in enumerate(names):
            parents = tuple(names[int(j)] for j in rng.integers(0, max(i, 1), rng.integers(0, 4)))
            if i == 0 or rng.random() < 0.05:
                parents = ("elsewhere",) if rng.random() < 0.5 else ()
            nodes[name] = type("N", (), {"parents": parents, "name": name})()
        util = {c: None if rng.random() < 0.15 else float(rng.integers(0, 6)) / 10 for c in names}
        top_k = int(rng.integers(1, 10))
        gains, count = descendant_gain(nodes, util, top_k=top_k, gamma=0.8, beta=0.05)
        want, want_count = _direct_gain(nodes, util, top_k, 0.8, 0.05)
        assert count == want_count, case
        assert gains.keys() == want.keys(), case
        for d, g in want.items():
            assert gains[d] == pytest.approx(g, rel=1e-12, abs=1e-15), (case, d)


def test_descendant_counts_beyond_64_bits_stay_exact():
    """Where crossovers join lineages the count follows every path: a ladder of 100 nodes, each a
    child of the two before it, counts Fibonacci-many paths (about 5.7e20 at its root, beyond a
    64-bit integer), exactly."""
    names = [f"r{i:03d}" for i in range(100)]
    nodes = {
        n: type("N", (), {"parents": tuple(names[max(i - 2, 0) : i]), "name": n})()
        for i, n in enumerate(names)
    }
    util = {n: 0.5 + i / 1000 for i, n in enumerate(names)}
    gains, count = descendant_gain(nodes, util, top_k=3, gamma=0.8, beta=0.05)
    want, want_count = _direct_gain(nodes, util, 3, 0.8, 0.05)
    assert count == want_count and count["r000"] > 2**64
    assert all(type(c) is int for c in count.values())
    assert gains == pytest.approx(want, rel=1e-12)


def test_pareto_layers_match_a_direct_peel_on_random_matrices():
    """Every layering path (1, 2 and 3..8 objectives; the batched sort with batches of 1 to 40 rows)
    against a direct peel, on matrices with ties, duplicate rows, missing values and values wide
    enough to need several packed words."""
    rng = np.random.default_rng(3)
    for case in range(300):
        n, m = int(rng.integers(1, 60)), int(rng.integers(1, 9))
        if case % 3 == 0:  # few distinct values: many ties
            y = rng.integers(0, int(rng.integers(2, 5)), size=(n, m)).astype(float)
        elif case % 3 == 1:  # correlated columns: many layers
            y = np.round(rng.normal(size=(n, 1)) * 3 + rng.normal(size=(n, m)), 1)
        else:  # wide integers: several fields per packed word, several words
            y = rng.integers(-(10**6), 10**6, size=(n, m)).astype(float)
        y[rng.random((n, m)) < 0.08] = -np.inf
        if n > 2:  # duplicate rows
            y[: n // 3] = y[rng.integers(0, n, n // 3)]
        want = _peeled_layers(y)
        assert layers(y).tolist() == want, (case, n, m)
        if m >= 3:
            batch = int(rng.integers(1, 41))
            assert pareto._layers_nd(y, batch=batch).tolist() == want, (case, n, m, batch)


def test_pareto_layers_of_a_long_chain_and_a_wide_front():
    """One layer per row along a chain crossing many batches; one layer for an antichain."""
    n = 700
    i = np.arange(n)
    chain = np.column_stack([i, 3 * i + (i % 7 == 0), -np.zeros(n)])
    assert layers(chain).tolist() == list(range(n - 1, -1, -1))
    t = np.arange(n, dtype=float)
    wide = np.column_stack([t, -t, np.where(t % 2 == 0, -np.inf, 1.0)])
    assert layers(wide).tolist() == [0] * n


def test_code_vectors_cached_across_calls():
    from engine.select import features

    src = "def compute_advantages(batch, cfg):\n    return batch.rewards * 2  # cached\n"
    first = features.cached_code_vector(src)
    assert features.cached_code_vector(src) is first and not first.flags.writeable
    assert np.allclose(first, features.code_vector(src))
    assert not np.allclose(features.cached_code_vector(src.replace("* 2", "- 1")), first)


def test_paired_difference_resolves_what_the_intervals_cannot(archive):
    """A child better by 0.02 at every paired seed, with seed-to-seed spread 0.05: the two nodes'
    intervals overlap ('within noise'), the paired difference's interval lies above zero."""
    import dataclasses

    from results_util import proxy_result

    from engine.cli.run_cmds import discovery_verdict
    from engine.select.objective import WITHIN, paired_difference, promotion

    base = [0.50, 0.55, 0.45, 0.60, 0.52, 0.48]
    archive.spawn("grpo", "child", algorithm=archive.algorithm("grpo"))
    for node, shift in (("grpo", 0.0), ("child", 0.02)):
        vals = [b + shift + 0.001 * (i % 2) for i, b in enumerate(base)]
        m = sum(vals) / len(vals)
        r = proxy_result(
            {"metrics": {"overall": m}, "intervals": {"overall": (m - 0.05, m + 0.05)}}
        )
        per_seed = tuple(
            {"seed": s, "status": "evaluated", "metrics": {"overall": v}}
            for s, v in enumerate(vals)
        )
        archive.record_result(
            node, dataclasses.replace(r, seeds=tuple(range(6)), per_seed=per_seed)
        )
    nodes = archive.nodes()
    exp = archive.config().experiment
    assert promotion(nodes["child"], nodes["grpo"], exp) == WITHIN
    mean, iv, n = paired_difference(nodes["child"], nodes["grpo"], exp)
    assert n == 6 and mean == pytest.approx(0.02) and iv[0] > 0
    line = discovery_verdict(archive, None, "child", "grpo")
    assert "DISCOVERY" in line and "beats grpo" in line and "over 6 paired seeds" in line
    assert "does not beat" in discovery_verdict(archive, None, "grpo", "child")
    assert "paired seeds would show it" not in discovery_verdict(archive, None, "grpo", "child")


def test_an_unresolved_gain_is_told_how_many_seeds_would_resolve_it(archive):
    """A child ahead by +0.01 on average with a paired SD of about 0.02 over 4 seeds is no
    discovery; the verdict says how many paired seeds a real +0.01 at that SD would need."""
    import dataclasses

    from results_util import proxy_result

    from engine.cli.run_cmds import discovery_verdict
    from engine.stats import sd_upper90, seeds_to_resolve, t95

    shifts = {"grpo": [0.0] * 4, "child": [0.03, -0.01, 0.03, -0.01]}
    archive.spawn("grpo", "child", algorithm=archive.algorithm("grpo"))
    for node, sh in shifts.items():
        vals = [0.5 + x for x in sh]
        r = proxy_result({"metrics": {"overall": sum(vals) / 4}})
        per_seed = tuple(
            {"seed": s, "status": "evaluated", "metrics": {"overall": v}}
            for s, v in enumerate(vals)
        )
        archive.record_result(
            node, dataclasses.replace(r, seeds=tuple(range(4)), per_seed=per_seed)
        )
    line = discovery_verdict(archive, None, "child", "grpo")
    assert "no discovery" in line and "+0.0100" in line
    sd = (4 * 0.02**2 / 3) ** 0.5  # the SD of +0.03, -0.01, +0.03, -0.01
    need, high = seeds_to_resolve(0.01, sd), seeds_to_resolve(0.01, sd_upper90(sd, 4))
    assert 4 < need < high
    assert f"{need} paired seeds would show it" in line and f"these 4 show ({sd:.4f})" in line
    assert f", {high} at that SD's 90% upper bound ({sd_upper90(sd, 4):.4f})" in line
    assert (t95(need - 1) + 0.8416) * sd / need**0.5 <= 0.01  # enough seeds
    assert (t95(need - 2) + 0.8416) * sd / (need - 1) ** 0.5 > 0.01  # and no more


def test_seeds_to_resolve_gives_the_power_it_names():
    """At the seeds it names, simulated paired differences of the given mean and SD put the 95%
    interval above zero in about 4 evaluations of 5; at a third of them, far fewer."""
    import numpy as np

    from engine.stats import mean_interval, seeds_to_resolve

    rng = np.random.default_rng(0)
    n = seeds_to_resolve(0.01, 0.023)
    assert 35 <= n <= 50  # about 40 paired seeds for +0.01 at the null control's SD

    def power(k: int) -> float:
        hits = sum(mean_interval(list(rng.normal(0.01, 0.023, k)))[1][0] > 0 for _ in range(2000))
        return hits / 2000

    assert 0.75 <= power(n) <= 0.86
    assert power(n // 3) < 0.5
    assert seeds_to_resolve(-0.01, 0.023) == n  # the sign does not matter
    assert seeds_to_resolve(0.02, 0.023) < n < seeds_to_resolve(0.01, 0.03)
    assert seeds_to_resolve(0.0, 0.02) is None and seeds_to_resolve(1e-6, 0.02) is None
    assert seeds_to_resolve(0.01, 0.0) == 2


def test_the_upper_bound_of_a_few_seeds_sd_covers_the_true_sd_nine_times_in_ten():
    """sd_upper90 from n normal values lies above the true SD in about 90% of draws, for a
    tabulated and an approximated number of degrees of freedom; from 2 values it is about 8 SDs."""
    import numpy as np

    from engine.stats import chi2_low10, sd_upper90

    rng = np.random.default_rng(1)
    for n in (2, 4, 25):
        draws = rng.normal(0.0, 0.02, (4000, n))
        cover = np.mean([sd_upper90(float(d.std(ddof=1)), n) >= 0.02 for d in draws])
        assert 0.88 <= cover <= 0.92, (n, cover)
    assert sd_upper90(1.0, 2) == pytest.approx(7.96, abs=0.01)
    assert chi2_low10(11) == pytest.approx(5.5778, abs=0.005)  # the approximation past the table
    with pytest.raises(ValueError, match="at least 1 degree"):
        chi2_low10(0)


def test_tail_mean_is_the_last_third_of_a_series():
    """A training series' settled value: the mean over its last third, skipping what is not a
    finite number; the ``step`` column and short series have none."""
    from engine.stats import tail_mean, tail_means

    assert tail_mean([1, 2, 3, 4, 5, 6, 7, 8, 9]) == 8.0  # indices 6..8
    assert tail_mean([0.0, 1.0, 2.0, 3.0]) == 2.5  # 4 * 2 // 3 = 2: the last two
    assert tail_mean([1.0, float("nan"), 2.0, None, 3.0]) == 3.0  # three finite numbers: the last
    assert tail_mean([1.0, 2.0]) is None and tail_mean(None) is None
    traj = {"step": [0, 1, 2], "train/kl": [0.0, 0.1, 0.2], "train/x": [1.0], "note": "text"}
    assert tail_means(traj) == {"train/kl": 0.2}


def test_selection_turns_the_cyclic_collector_back_to_how_it_found_it():
    import gc

    was = gc.isenabled()
    try:
        for state in (True, False):
            (gc.enable if state else gc.disable)()
            with pytest.raises(SelectError):  # no node at all: it raises, from inside
                select_parents({}, Config())
            assert gc.isenabled() is state
    finally:
        (gc.enable if was else gc.disable)()
