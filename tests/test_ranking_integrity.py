"""Nothing ranks a result that failed, or results of different protocol versions or units together:
select, retrospect, the report and ``compare --sort`` read each node's result under the compared
protocol (not its latest status under any protocol), and say what they leave apart."""

from __future__ import annotations

import json

import pytest
from results_util import record

from engine.archive.results import Incomparable
from engine.archive.store import Archive
from engine.report.html import render_report
from engine.select import select_parents
from engine.select.retrospect import retrospect


@pytest.fixture
def arch(tmp_path):
    a = Archive.init(tmp_path / "exp")
    record(a, "grpo", {"overall": 0.60})
    for kid in ("good", "broken"):
        a.spawn("grpo", kid)
    record(a, "good", {"overall": 0.62})
    # one seed failed: the result is failed but holds the mean of the seed that survived
    record(
        a, "broken", {"status": "failed", "metrics": {"overall": 0.99}, "reason": "NaN at seed 1"}
    )
    return a


def test_a_failed_result_is_never_ranked(arch):
    sel = select_parents(arch, k=3)
    assert sel.row("broken")["utility"] is None and "broken" not in sel.chosen
    assert "failed" in sel.row("broken")["why"]
    (parent,) = retrospect(arch)["rounds"][0]["parents"]
    assert parent["best_descendant"] == "good" and parent["best_utility"] == pytest.approx(0.62)


def test_status_under_another_protocol_neither_hides_nor_invents_a_failure(arch):
    record(arch, "broken", {"overall": 0.5}, preset="smoke")  # its latest status: evaluated
    assert arch.node("broken").status == "evaluated"
    sel = select_parents(arch, k=3)  # under proxy/default it still failed
    assert "broken" not in sel.chosen and sel.row("broken")["utility"] is None
    record(arch, "good", {"status": "failed", "metrics": {}}, preset="smoke")  # failed elsewhere
    assert arch.node("good").status == "failed"
    sel = select_parents(arch, k=3)
    assert "good" in sel.chosen and sel.row("good")["utility"] == pytest.approx(0.62)


def _record_cli(cli, arch, tmp_path, node, payload, *args):
    f = tmp_path / f"{node}.json"
    f.write_text(json.dumps(payload))
    res = cli("record", node, "--results", str(f), *args, "-C", str(arch.path))
    assert res.returncode == 0, res.stderr


@pytest.fixture
def lab(tmp_path, cli):
    a = Archive.init(tmp_path / "lab", config_toml='[evaluation]\nprotocol = "lab/v1"\n')
    for kid in ("pct", "other"):
        a.spawn("grpo", kid)
    _record_cli(cli, a, tmp_path, "grpo", {"metrics": {"overall": 0.6}}, "--protocol", "lab/v1")
    _record_cli(
        cli, a, tmp_path, "pct", {"metrics": {"overall": 80.0}}, "--protocol", "lab/v1",
        "--unit", "percent",
    )  # fmt: skip
    _record_cli(
        cli, a, tmp_path, "other", {"metrics": {"overall": 0.7}, "protocol_hash": "sha256:aaaa"},
        "--protocol", "lab/v1",
    )  # fmt: skip
    return a


def test_the_report_ranks_one_group_and_names_the_rest(lab):
    page = render_report(lab).read_text()
    assert "<b>protocol</b>" in page and "lab/v1" in page
    assert "not ranked here" in page
    assert "pct: lab/v1 (percent)" in page and "other: lab/v1@aaaa" in page
    assert "best</b></td><td>grpo" in page  # 80 % and the other version are not the best


def test_retrospect_refuses_what_select_refuses(lab):
    with pytest.raises(Incomparable):
        select_parents(lab, k=2)
    with pytest.raises(Incomparable):
        retrospect(lab)


def test_compare_sorts_within_a_unit_and_marks_mixed_units(lab, cli):
    res = cli("compare", "--json", "--sort", "overall", "-C", str(lab.path))
    rows = json.loads(res.stdout)["rows"]
    groups = [(r["protocol_key"], r["metrics"]["overall"]["unit"]) for r in rows]
    assert (
        len(set(groups)) == 3 and groups.index(groups[-1]) == len(groups) - 1
    )  # never interleaved
    res = cli("compare", "--no-pager", "-C", str(lab.path))
    out = res.stdout
    assert "(units differ)" in out and "80 percent" in out


def test_compare_marks_a_result_that_failed_under_the_protocol(arch, cli):
    record(arch, "broken", {"overall": 0.5}, preset="smoke")
    res = cli("compare", "--no-pager", "--status", "all", "-C", str(arch.path))
    line = next(x for x in res.stdout.splitlines() if "broken" in x)
    assert "failed (node: evaluated)" in line
