"""The typed EvaluationResult: validation, one file per protocol, legacy results.json, comparability."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from results_util import proxy_result, record

from engine.archive.results import (
    EvaluationResult,
    Incomparable,
    Protocol,
    ProtocolRef,
    describe_elsewhere,
    from_record,
    parse_result,
    require_comparable,
)
from engine.errors import ArchiveError
from engine.select import select_parents


def _res(**kw) -> EvaluationResult:
    base = dict(
        protocol=Protocol("lab/v1", "sha256:abc", "record"),
        status="evaluated",
        metrics={"overall": 0.5, "mean_length": 120.0},
        units={"overall": "fraction", "mean_length": "tokens"},
        intervals={"overall": (0.45, 0.55)},
        seeds=(0, 1),
    )
    base.update(kw)
    return EvaluationResult(**base)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"units": {"overall": "fraction"}}, "has no unit"),
        ({"metrics": {"overall": 1.5, "mean_length": 1.0}}, "outside its unit's range"),
        ({"metrics": {"overall": math.nan, "mean_length": 1.0}}, "finite number"),
        ({"metrics": {"mean_length": 1.0}, "intervals": {}}, "utility metric 'overall'"),
        ({"status": "failed", "metrics": {}, "units": {}, "intervals": {}}, "must say why"),
        ({"intervals": {"overall": (0.6, 0.4)}}, "interval of 'overall'"),
        ({"intervals": {"pass@8": (0.1, 0.2)}}, "not a metric"),
        ({"seeds": (-1,)}, "bad seeds"),
        ({"status": "done"}, "status must be"),
    ],
)
def test_invalid_results_are_refused_with_the_field_named(change, message):
    with pytest.raises(ArchiveError, match=message):
        _res(**change)


def test_round_trip_and_describe():
    r = _res(trajectory={"step": [0, 1], "train/kl": [0.0, 0.01]}, details={"versions": {"x": "1"}})
    back = parse_result(r.to_json())
    assert back == r and back.value == 0.5 and back.unit("mean_length") == "tokens"
    assert "lab/v1@abc" in r.describe() and "[0.45, 0.55]" in r.describe()
    with pytest.raises(ArchiveError, match="bad protocol id"):
        Protocol("proxy/default/extra")


def test_a_nodes_interval_over_its_seeds_is_not_called_paired_even_where_recorded_so():
    """A proxy result's interval is the node's mean over its own seeds; the paired interval is that
    of a difference between two nodes. Results recorded under the old name read as the new one."""
    old = json.loads(_res(interval_kind="95% Student-t over paired seeds").to_json())
    assert old["interval_kind"] == "95% Student-t over paired seeds"
    assert parse_result(json.dumps(old)).interval_kind == "95% Student-t over seeds"
    assert parse_result(_res(interval_kind="90% bootstrap").to_json()).interval_kind == (
        "90% bootstrap"
    )


def test_results_live_per_protocol_on_the_node(archive):
    record(archive, "grpo", {"overall": 0.50})
    record(archive, "grpo", {"overall": 0.20}, preset="smoke")
    node = archive.node("grpo")
    assert set(node.results) == {"proxy/default", "proxy/smoke"}
    assert node.result.protocol.id == "proxy/default" and node.overall == 0.50
    assert archive.nodes("proxy/smoke")["grpo"].overall == 0.20
    assert archive.fsck()


def test_record_refuses_a_result_without_the_experiments_utility(archive):
    with pytest.raises(ArchiveError, match="utility"):
        archive.record_result("grpo", from_record({"accuracy": 0.4}, utility="accuracy"))
    with pytest.raises(ArchiveError, match="measured by poise-git itself"):
        from_record({"overall": 0.4}, protocol="proxy/default")


def test_a_legacy_results_json_is_read_with_inferred_protocol_and_units(archive):
    legacy = {
        "backend": "proxy",
        "preset": "default",
        "protocol_hash": "sha256:old",
        "status": "evaluated",
        "metrics": {"overall": 0.5, "hard/pass@8": 0.4, "mean_length": 30.0},
        "intervals": {"overall": [0.45, 0.55]},
        "seeds": [0, 1],
    }
    archive.commit_files(
        "grpo",
        {"results.json": json.dumps(legacy)},
        subject="old writer",
        status="evaluated",
        trailers={"Poise-Results": "yes"},
    )
    node = archive.node("grpo")
    (r,) = node.results.values()
    assert r.legacy and r.protocol.id == "proxy/default" and r.unit("mean_length") == "tokens"
    assert r.unit("hard/pass@8") == "fraction" and r.interval("overall") == (0.45, 0.55)
    # the current proxy has another hash: the old result is shown as stale, not ranked
    assert node.result is None and node.stale is r
    row = select_parents(archive).row("grpo")
    assert "older version of proxy/default" in row["why"]
    # a new typed result beside it keeps both files
    record(archive, "grpo", {"overall": 0.6})
    node = archive.node("grpo")
    assert node.overall == 0.6 and node.trailer("Poise-Results") == "proxy/default,yes"


def test_select_never_ranks_smoke_results_with_default_ones(archive):
    """A smoke-preset result beside default-preset ones is separated: listed with its reason, never
    ranked; asking for the smoke protocol ranks only the smoke results."""
    for name, u, preset in (("a", 0.55, "default"), ("b", 0.90, "smoke"), ("c", 0.50, "default")):
        archive.spawn("grpo", name)
        record(archive, name, {"overall": u}, preset=preset)
    record(archive, "grpo", {"overall": 0.40})
    sel = select_parents(archive, k=3)
    assert "b" not in sel.chosen and sel.params["protocol"].startswith("proxy/default@")
    assert "results under proxy/smoke only" in sel.row("b")["why"]
    smoke = select_parents(archive, k=3, protocol="proxy/smoke")
    assert smoke.chosen == ["b"]


def test_results_of_one_id_with_different_hashes_or_units_are_refused():
    a = _res()
    b = dataclasses.replace(a, protocol=Protocol("lab/v1", "sha256:def", "record"))
    with pytest.raises(Incomparable, match="lab/v1@abc .*lab/v1@def"):
        require_comparable({"a": a, "b": b})
    c = dataclasses.replace(
        a,
        metrics={"overall": 50.0, "mean_length": 120.0},
        intervals={},
        units={"overall": "percent", "mean_length": "tokens"},
    )
    with pytest.raises(Incomparable, match="percent"):
        require_comparable({"a": a, "c": c})
    require_comparable(
        {"a": a, "a2": dataclasses.replace(a, metrics={**a.metrics, "overall": 0.6})}
    )


def test_a_protocol_ref_matches_by_hash_prefix():
    p = proxy_result({"overall": 0.5}).protocol
    assert ProtocolRef.parse("proxy/default").matches(p)
    assert ProtocolRef.parse(f"proxy/default@{p.hash.split(':')[1][:8]}").matches(p)
    assert not ProtocolRef.parse("proxy/default@0000").matches(p)
    assert not ProtocolRef.parse("proxy/smoke").matches(p)


def test_describe_elsewhere_tells_another_version_from_other_protocols():
    counts = {"lab/v1": 3, "proxy/default": 2, "proxy/smoke": 1}
    assert describe_elsewhere(counts, "proxy/default") == (
        "another version of proxy/default (2 nodes); "
        "other protocols: lab/v1 (3 nodes), proxy/smoke (1 node)"
    )
    assert describe_elsewhere({"proxy/default": 1}, "proxy/default") == (
        "another version of proxy/default (1 node)"
    )
    assert describe_elsewhere(counts, None).startswith("other protocols: lab/v1 (3 nodes), ")
