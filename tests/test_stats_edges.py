"""The engine's statistics and the results they are read from, at their edges: the Student-t quantile
at many seeds, intervals from one seed or identical values, pairing over the seeds two nodes share,
and result files hand-edited so their per-seed values no longer give their recorded numbers. Real
archives in tmp_path."""

from __future__ import annotations

import json
import math

import pytest
from results_util import record

from engine.select.objective import paired_difference
from engine.stats import mean_interval, paired_interval, seeds_to_resolve, t95

RESULT = "results/proxy/default.json"


def test_t95_is_the_student_t_quantile_at_every_number_of_seeds():
    """The interval is a Student-t interval at any number of seeds: beyond 30 degrees of freedom
    the quantile is not the normal 1.96 (2.040 at 31, 2.007 at 52), which made intervals over 32 or
    more seeds 2-4% too narrow."""
    st = pytest.importorskip("scipy.stats")
    for df in [*range(1, 130), 200, 500, 1000, 10_000]:
        assert t95(df) == pytest.approx(st.t.ppf(0.975, df), abs=6e-4), df
    vals = [0.5 + 0.01 * ((7 * i) % 11 - 5) for i in range(40)]
    m, (lo, hi) = mean_interval(vals)
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / 39)
    assert (hi - lo) / 2 == pytest.approx(st.t.ppf(0.975, 39) * sd / math.sqrt(40), rel=1e-3)


def test_seeds_to_resolve_counts_with_the_t_quantile_past_thirty_seeds():
    """A difference of a fifth of its SD needs the smallest n with (t95(n-1) + z80) sd / sqrt(n)
    <= diff, with the true t quantile there (n near 200)."""
    st = pytest.importorskip("scipy.stats")
    n = seeds_to_resolve(0.2, 1.0)
    assert (st.t.ppf(0.975, n - 1) + 0.8416) / math.sqrt(n) <= 0.2 + 1e-4
    assert (st.t.ppf(0.975, n - 2) + 0.8416) / math.sqrt(n - 1) > 0.2 - 1e-4


def test_intervals_from_one_seed_identical_values_and_shared_seeds():
    assert mean_interval([0.4]) == (0.4, None)
    m, iv = mean_interval([0.3, 0.3, 0.3])
    assert m == pytest.approx(0.3) and iv == pytest.approx([0.3, 0.3])
    # pairing uses only the seeds both have, and says how many
    mean, iv, n = paired_interval({0: 0.5, 1: 0.6, 2: 0.7, 9: 5.0}, {1: 0.5, 2: 0.6, 3: 0.0})
    assert n == 2 and mean == pytest.approx(0.1) and iv == pytest.approx([0.1, 0.1])
    assert paired_interval({0: 0.5}, {1: 0.5}) is None


def _rows(values, seeds=None):
    seeds = list(range(len(values))) if seeds is None else seeds
    return [
        {"seed": s, "status": "evaluated", "metrics": {"overall": v}}
        for s, v in zip(seeds, values, strict=True)
    ]


def _evaluated(archive, name, values):
    m, iv = mean_interval(values)
    payload = {
        "metrics": {"overall": m},
        "seeds": list(range(len(values))),
        "per_seed": _rows(values),
    }
    record(archive, name, {**payload, "intervals": {"overall": iv}})


@pytest.fixture
def pair(archive):
    """The root and a child evaluated at seeds 0-2, the child 0.1 above it at every seed."""
    archive.spawn("grpo", "child", algorithm=archive.algorithm("grpo") + "\n# child\n")
    _evaluated(archive, "grpo", [0.50, 0.52, 0.51])
    _evaluated(archive, "child", [0.60, 0.62, 0.61])
    mean, _iv, n = paired_difference(
        *(archive.nodes()[k] for k in ("child", "grpo")), _exp(archive)
    )
    assert n == 3 and mean == pytest.approx(0.1)
    return archive


def _exp(archive):
    return archive.config().experiment


def _edit(archive, name, change):
    data = json.loads(archive.git.text("show", f"refs/heads/poise/{name}:{RESULT}"))
    change(data)
    archive.commit_files(name, {RESULT: json.dumps(data)}, subject="hand edit")


@pytest.mark.parametrize(
    "change, why",
    [
        # the recorded mean raised while the per-seed values stay: the ranking read the mean and
        # the paired difference the values, two different answers from one file
        (lambda d: d["metrics"].update(overall=0.9), "not the mean of its per-seed values"),
        # per-seed values lowered under the recorded mean
        (lambda d: d["per_seed"][0]["metrics"].update(overall=0.1), "not the mean"),
        # a seed list longer than the values
        (lambda d: d.update(seeds=[0, 1, 2, 3, 4]), "seeds"),
        (lambda d: d.update(seeds=[0, 0, 1]), "seeds"),
        (lambda d: d["per_seed"][0].update(seed=-1), "seed"),
        (lambda d: d["per_seed"][0].update(seed="x"), "seed"),
        (lambda d: d["per_seed"][1].update(seed=0), "seed"),
        (lambda d: d["per_seed"][0].pop("seed"), "seed"),
        (lambda d: d["per_seed"][0]["metrics"].update(overall="high"), "finite number"),
        (lambda d: d["per_seed"].__setitem__(0, "row"), "per-seed row"),
    ],
)
def test_a_result_whose_numbers_do_not_follow_from_its_seeds_is_unreadable(pair, change, why):
    """A results file edited so that its per-seed values, its seeds and its recorded mean disagree
    is unreadable: the node is not evaluated under the protocol (neither ranked by its mean nor
    paired by its values), the reason names the file, nothing crashes and the archive stays
    consistent."""
    _edit(pair, "child", change)
    node = pair.nodes()["child"]
    assert node.result is None and not node.evaluated
    assert RESULT in node.unreadable and why in node.unreadable[RESULT], node.unreadable
    assert paired_difference(node, pair.nodes()["grpo"], _exp(pair)) is None
    assert pair.fsck()


def test_a_failed_seed_with_metrics_enters_the_recorded_mean_as_evaluations_write_it(archive):
    """An evaluation's mean runs over every seed that produced the metric, a failed one included
    (``engine.operators.evaluate``): such a result stays readable."""
    rows = _rows([0.5, 0.7])
    rows[1].update(status="failed")
    record(
        archive,
        "grpo",
        {
            "status": "failed",
            "reason": "seed 1: nan",
            "metrics": {"overall": 0.6},
            "seeds": [0, 1],
            "per_seed": rows,
        },
    )
    node = archive.nodes()["grpo"]
    assert not node.unreadable and node.result.status == "failed"


def test_log_and_show_name_an_unreadable_results_file(pair, cli):
    """``log`` and ``show`` say that a node's results file is unreadable, and why, where before the
    node showed as evaluated with no number and ``show`` dropped its results without a word."""
    _edit(pair, "child", lambda d: d["metrics"].update(overall=0.9))
    log = cli("log", "-C", str(pair.path))
    assert log.returncode == 0, log.stderr
    line = next(x for x in log.stdout.splitlines() if "child" in x)
    assert f"{RESULT} unreadable" in line, log.stdout
    show = cli("show", "child", "-C", str(pair.path))
    assert show.returncode == 0, show.stderr
    assert f"{RESULT} is unreadable:" in show.stdout
    assert "not the mean of its per-seed values" in " ".join(show.stdout.split())


def test_results_of_two_versions_of_a_protocol_are_never_paired(pair):
    """Under a protocol named without a hash (an external ``lab/v1``), two nodes' results may come
    from different versions of it, or different units: their per-seed values are not paired, as
    nothing ranks them together."""
    import dataclasses
    from types import SimpleNamespace

    nodes = pair.nodes()
    child, root = nodes["child"], nodes["grpo"]
    assert paired_difference(child, root, _exp(pair)) is not None
    proto = dataclasses.replace(child.result.protocol, hash="sha256:" + "0" * 64)
    other = SimpleNamespace(
        result=dataclasses.replace(child.result, protocol=proto), evaluated=True
    )
    assert paired_difference(other, root, _exp(pair)) is None
