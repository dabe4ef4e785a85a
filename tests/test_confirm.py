"""Held-out confirmation: the record's rules, its place in the archive (beside the results, never read
by the selection), the seeds it may use, and, on the tiny proxy preset, a real confirmation end to end."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import numpy as np
import pytest
from conftest import mark_verified, run_cli_inprocess

from engine.archive.confirmation import (
    CONFIRMED,
    FAILED,
    NOT_CONFIRMED,
    REVERSED,
    UNRESOLVED,
    Confirmation,
    read_confirmation,
    read_confirmations,
    record_confirmation,
    verdict_of,
)
from engine.archive.results import EvaluationResult, Protocol
from engine.archive.store import Archive
from engine.errors import ArchiveError, EvaluationError
from engine.operators.confirm import heldout_seeds, search_seeds
from engine.stats import paired_interval

PROTO = Protocol(id="proxy/smoke", hash="sha256:" + "ab" * 32, backend="proxy", preset="smoke")
DR_GRPO = '''
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """Dr.GRPO: group-centred, not scaled."""
    stats = group_stats(batch.rewards.to(torch.float32), batch.group)
    return batch.rewards.to(torch.float32) - stats.mean
'''
BROKEN = '''
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """Deliberately broken."""
    raise RuntimeError("deliberately broken mechanism")
'''


def _conf(values, reference, **kw) -> Confirmation:
    base = dict(
        protocol=PROTO,
        node="child",
        against="grpo",
        node_commit="c" * 40,
        against_commit="d" * 40,
        objective="overall",
        seeds=tuple(sorted(values)),
        search_seeds=(0, 1),
    )
    base.update(kw)
    return Confirmation.measured(values=values, reference=reference, **base)


def test_the_verdict_follows_the_held_out_interval():
    assert verdict_of(0.02, (0.001, 0.04)) == CONFIRMED
    assert verdict_of(0.02, (-0.001, 0.04)) == NOT_CONFIRMED
    assert verdict_of(-0.02, (-0.04, -0.001)) == REVERSED
    assert verdict_of(0.02, None) == UNRESOLVED
    up = _conf({2: 0.55, 3: 0.56, 4: 0.57}, {2: 0.50, 3: 0.50, 4: 0.51})
    mean, iv, n = paired_interval(up.values, up.reference)
    assert up.verdict == CONFIRMED and up.difference == pytest.approx(mean) and n == 3
    assert up.interval == pytest.approx(tuple(iv))
    noisy = _conf({2: 0.60, 3: 0.45}, {2: 0.50, 3: 0.50})
    assert noisy.verdict == NOT_CONFIRMED and noisy.difference == pytest.approx(0.025)
    one = _conf({2: 0.6}, {2: 0.5})
    assert one.verdict == UNRESOLVED and one.interval is None
    assert "held-out seed(s) [2]" in one.describe() and "no interval" in one.describe()


def test_a_confirmation_on_seeds_the_search_saw_is_refused():
    with pytest.raises(ArchiveError, match=r"seeds \[1\] were seen by the search"):
        _conf({1: 0.6, 2: 0.6}, {1: 0.5, 2: 0.5})
    with pytest.raises(ArchiveError, match="against itself"):
        _conf({2: 0.6, 3: 0.6}, {2: 0.5, 3: 0.5}, against="child")


def test_a_record_whose_numbers_do_not_follow_from_its_values_is_refused():
    good = _conf({2: 0.6, 3: 0.61}, {2: 0.5, 3: 0.52})
    d = json.loads(good.to_json())
    for field, forged in (
        ("difference", 0.3),
        ("interval", [0.2, 0.4]),
        ("verdict", CONFIRMED if good.verdict != CONFIRMED else NOT_CONFIRMED),
    ):
        with pytest.raises(ArchiveError, match="unreadable confirmation|does not follow|is not"):
            Confirmation.from_json(json.dumps({**d, field: forged}))
    with pytest.raises(ArchiveError, match="finite"):
        Confirmation.from_json(json.dumps({**d, "values": {"2": "NaN", "3": 0.61}}))
    with pytest.raises(ArchiveError, match="both values"):
        Confirmation.from_json(json.dumps({**d, "reference": {"2": 0.5}}))
    with pytest.raises(ArchiveError, match="not a poise.confirmation/1"):
        Confirmation.from_json(json.dumps({**d, "schema": "poise.result/2"}))
    with pytest.raises(ArchiveError, match="must say why"):
        Confirmation(
            protocol=PROTO,
            node="child",
            against="grpo",
            node_commit="",
            against_commit="",
            objective="overall",
            seeds=(2,),
            search_seeds=(0, 1),
            verdict=FAILED,
        )
    assert Confirmation.from_json(good.to_json()) == good


def _result(seeds) -> EvaluationResult:
    """An evaluated PROTO result of Overall 0.5 at each of ``seeds``."""
    per_seed = tuple({"seed": s, "status": "evaluated", "metrics": {"overall": 0.5}} for s in seeds)
    return EvaluationResult(
        protocol=PROTO,
        status="evaluated",
        metrics={"overall": 0.5},
        units={"overall": "fraction"},
        seeds=tuple(seeds),
        per_seed=per_seed,
    )


def test_log_marks_each_confirmed_node_under_the_compared_protocol(archive):
    archive.spawn("grpo", "child", edit=DR_GRPO)
    archive.spawn("grpo", "other", edit=DR_GRPO)
    for name in ("grpo", "child", "other"):
        archive.record_result(name, _result([0, 1]))
    record_confirmation(archive, _conf({2: 0.6, 3: 0.63}, {2: 0.5, 3: 0.52}))
    record_confirmation(archive, _conf({2: 0.4, 3: 0.41}, {2: 0.5, 3: 0.52}, node="other"))
    out = run_cli_inprocess("log", "--protocol", "proxy/smoke", "-C", str(archive.path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    child = next(ln for ln in lines if "child" in ln)
    other = next(ln for ln in lines if "other" in ln)
    assert f"held out vs grpo: confirmed +0.1050 (2 seeds, {PROTO.key})" in child
    assert f"held out vs grpo: reversed -0.1050 (2 seeds, {PROTO.key})" in other
    assert "another protocol version" not in out.stdout  # both confirm the results' version
    from engine.cli.archive_cmds import _held_out

    assert f"(1 seed, {PROTO.key})" in _held_out(_conf({2: 0.6}, {2: 0.5}))
    (root,) = (ln for ln in lines if "grpo" in ln and "held out" not in ln)
    assert "evaluated" in root
    rows = {
        r["node"]: r
        for r in json.loads(
            run_cli_inprocess(
                "log", "--json", "--protocol", "proxy/smoke", "-C", str(archive.path)
            ).stdout
        )
    }
    assert rows["child"]["confirmation"] == {
        "against": "grpo",
        "verdict": CONFIRMED,
        "difference": pytest.approx(0.105),
        "interval": rows["child"]["confirmation"]["interval"],
        "seeds": [2, 3],
        "protocol": PROTO.key,
        "other_version_than": None,
    }
    assert rows["other"]["confirmation"]["verdict"] == REVERSED
    assert rows["grpo"]["confirmation"] is None
    # under another protocol the smoke confirmations are not shown
    other_proto = run_cli_inprocess(
        "log", "--json", "--protocol", "proxy/default", "-C", str(archive.path)
    )
    assert all(r["confirmation"] is None for r in json.loads(other_proto.stdout))


def test_held_out_seeds_start_past_every_seed_the_search_used(archive):
    archive.spawn("grpo", "child", edit=DR_GRPO)
    archive.record_result("grpo", _result([0, 1]))
    archive.record_result("child", _result([0, 1, 2, 5]))  # e.g. evaluated again on more seeds
    nodes = archive.nodes("proxy/smoke")
    assert search_seeds(nodes, "proxy/smoke") == [0, 1, 2, 5]
    assert search_seeds(nodes, "proxy/default") == []
    assert heldout_seeds([0, 1, 2, 5], 2) == [6, 7]
    assert heldout_seeds([0, 1], 3, first=10) == [10, 11, 12]
    assert heldout_seeds([], 2) == [0, 1]
    with pytest.raises(EvaluationError, match=r"seeds \[5\] were used by the search"):
        heldout_seeds([0, 1, 2, 5], 2, first=4)
    with pytest.raises(EvaluationError, match="1 or more"):
        heldout_seeds([0, 1], 0)


def test_a_recorded_confirmation_sits_beside_the_results_and_the_selection_never_reads_it(archive):
    archive.spawn("grpo", "child", edit=DR_GRPO)
    mark_verified(archive, "child")
    before = archive.node("child")
    conf = _conf({2: 0.6, 3: 0.61}, {2: 0.5, 3: 0.52}, node_commit=before.commit)
    record_confirmation(archive, conf)
    after = Archive(archive.path).node("child")  # from git alone
    assert after.status == before.status == "verified" and after.results == before.results
    assert after.trailer("Poise-Event") == "confirmation"
    assert read_confirmation(archive, "child", "proxy/smoke") == conf
    assert read_confirmation(archive, "child", "proxy/default") is None
    assert read_confirmation(archive, "grpo", "proxy/smoke") is None
    shown = subprocess.run(
        ["git", "-C", str(archive.path), "show", "poise/child:confirmations/proxy/smoke.json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(shown)["schema"] == "poise.confirmation/1"
    assert archive.nodes("proxy/smoke")["child"].result is None  # not a result: never ranked
    assert archive.fsck()


def test_confirm_refuses_nodes_without_a_search_result(archive):
    from engine.operators.confirm import confirm_node

    exp = archive.config().experiment
    with pytest.raises(EvaluationError, match="unknown node 'ghost'"):
        confirm_node(archive, "ghost", "grpo", exp, preset="smoke")
    archive.spawn("grpo", "child", edit=DR_GRPO)
    with pytest.raises(EvaluationError, match="child has no evaluated result under proxy/smoke"):
        confirm_node(archive, "child", "grpo", exp, preset="smoke")
    with pytest.raises(EvaluationError, match="against itself"):
        confirm_node(archive, "grpo", "grpo", exp, preset="smoke")
    with pytest.raises(EvaluationError, match="unknown proxy preset"):
        confirm_node(archive, "child", "grpo", exp, preset="giant")
    assert archive.fsck()


def test_confirm_refuses_a_search_result_of_another_protocol_version(archive, monkeypatch):
    """Results under the preset's id but another hash were measured differently: the search's
    difference between them is not a comparison to confirm, and nothing is trained."""
    import engine.operators.confirm as confirm_mod
    from engine.operators.evaluate import proxy_protocol
    from trainer_template.proxy.protocol import get_protocol

    def measured(*_a, **_kw):
        raise AssertionError("a node was measured")

    monkeypatch.setattr(confirm_mod, "measure_node", measured)
    exp = archive.config().experiment
    archive.spawn("grpo", "child", edit=DR_GRPO)
    current = proxy_protocol("smoke", get_protocol("smoke"))
    assert current.hash != PROTO.hash  # PROTO: proxy/smoke at an older hash
    archive.record_result("child", _result([0, 1]))
    archive.record_result("grpo", dataclasses.replace(_result([0, 1]), protocol=current))
    with pytest.raises(
        EvaluationError, match=r"child has no evaluated result under proxy/smoke@"
    ) as e:
        confirm_mod.confirm_node(archive, "child", "grpo", exp, preset="smoke")
    assert f"another version, {PROTO.key}" in str(e.value)
    assert read_confirmation(archive, "child", "proxy/smoke") is None and archive.fsck()


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """An archive where a 'search' evaluated grpo and drgrpo on tiny-preset seeds 0 and 1 (and flaky)."""
    from engine.operators.evaluate import evaluate_node

    mp = pytest.MonkeyPatch()
    mp.setenv("POISE_CACHE_DIR", str(tmp_path_factory.mktemp("proxy-cache")))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.delenv("POISE_EVAL_CACHE", raising=False)
    arch = Archive.init(tmp_path_factory.mktemp("arch") / "exp")
    arch.spawn("grpo", "drgrpo", edit=DR_GRPO)
    arch.spawn("grpo", "flaky", edit=DR_GRPO)
    for name in ("drgrpo", "flaky"):
        mark_verified(arch, name)
    for name in ("grpo", "drgrpo"):
        result = evaluate_node(arch, name, seeds=2, preset="tiny")
        assert result.ok
    # flaky's search result is grpo's numbers under its own commit (what matters here is that it
    # has one: its held-out runs are what fail)
    arch.record_result("flaky", dataclasses.replace(result, node_commit=arch.node("flaky").commit))
    yield arch
    mp.undo()


@pytest.mark.slow  # four tiny-preset seed runs (two nodes at two held-out seeds)
def test_confirm_measures_both_nodes_on_held_out_seeds_and_records_it(searched):
    from engine.archive.tracking import find_runs
    from engine.operators.confirm import confirm_node
    from engine.operators.evaluate import measure_node

    arch = searched
    before = arch.nodes("proxy/tiny")
    events: list[str] = []
    exp = arch.config().experiment
    conf = confirm_node(arch, "drgrpo", "grpo", exp, preset="tiny", on_event=events.append)
    assert conf.seeds == (2, 3) and conf.search_seeds == (0, 1)
    assert conf.verdict in (CONFIRMED, NOT_CONFIRMED, REVERSED)
    assert set(conf.values) == set(conf.reference) == {2, 3}
    assert conf.search_difference is not None and conf.search_difference[2] == 2
    assert any("grpo: seed 3" in e for e in events) and any("drgrpo: seed 2" in e for e in events)
    # the numbers are the protocol's: measuring grpo at seed 3 again gives the same value
    again = measure_node(arch, "grpo", [3], preset="tiny")
    assert again.per_seed[0]["metrics"]["overall"] == pytest.approx(conf.reference[3], abs=1e-9)
    # the search's results, statuses and ranking are untouched; the record reads back from git
    after = Archive(arch.path).nodes("proxy/tiny")
    for name in ("grpo", "drgrpo"):
        assert after[name].result == before[name].result and after[name].status == "evaluated"
    assert read_confirmation(arch, "drgrpo", "proxy/tiny") == conf
    tagged = [r for r in find_runs(arch, "drgrpo") if r.data.tags.get("poise.purpose")]
    assert len(tagged) == 2 and {r.data.tags["poise.confirms"] for r in tagged} == {
        "drgrpo vs grpo"
    }
    assert set(conf.mlflow_run_ids) >= {r.info.run_id for r in tagged}
    # the CLI: shown by `show`, and a second confirmation further out replaces it
    out = run_cli_inprocess("show", "drgrpo", "-C", str(arch.path))
    assert "held-out confirmation under proxy/tiny@" in out.stdout
    with pytest.raises(EvaluationError, match="were used by the search"):
        confirm_node(arch, "drgrpo", "grpo", exp, preset="tiny", first_seed=1)
    assert arch.fsck()


@pytest.mark.slow  # two tiny-preset seed runs of grpo, one failing run of the broken candidate
def test_a_candidate_that_fails_on_held_out_seeds_gives_a_failed_confirmation(searched):
    arch = searched
    # the same node, edited after its search result: now it raises when trained
    arch.commit_files(
        "flaky",
        {"algorithm.py": arch.algorithm("flaky") + BROKEN},
        subject="poise: flaky edited (test)",
    )
    mark_verified(arch, "flaky")
    out = run_cli_inprocess(
        "confirm", "flaky", "--seeds", "1", "--preset", "tiny", "-C", str(arch.path)
    )
    assert out.returncode == 4, out.stdout + out.stderr
    assert (
        "held-out confirmation: flaky vs grpo on 1 held-out seed(s) [2] under proxy/tiny@"
        in out.stdout
    )
    assert ": failed (flaky: seed 2" in out.stdout
    assert "deliberately broken" in out.stdout
    conf = read_confirmation(arch, "flaky", "proxy/tiny")
    assert conf.verdict == FAILED and "deliberately broken" in conf.reason
    assert Archive(arch.path).node("flaky").status == "verified"  # its search status stays
    assert arch.fsck()


def test_the_report_shows_confirmations_under_its_protocol(archive):
    from engine.report.html import render_report

    archive.spawn("grpo", "child", edit=DR_GRPO)
    default = Protocol(id="proxy/default", hash="sha256:" + "cd" * 32, backend="proxy")
    record_confirmation(
        archive,
        _conf({6: 0.61, 7: 0.49}, {6: 0.5, 7: 0.5}, protocol=default, search_seeds=(0, 1, 2)),
    )
    record_confirmation(archive, _conf({2: 0.9, 3: 0.9}, {2: 0.5, 3: 0.5}))  # proxy/smoke
    page = render_report(archive).read_text()
    assert "Held-out confirmations" in page
    # its protocol version is named (and, not the page's current proxy/default, marked so)
    assert f"<td>child</td><td>grpo</td><td>{default.key} <span" in page
    assert "</span></td><td>6, 7</td><td>+0.0500 [" in page
    assert "not confirmed" in page and "+0.4000" not in page  # the smoke one is another protocol


def test_a_forged_search_difference_is_refused_and_never_reaches_the_report(archive):
    """The search's difference is numbers: a record holding text there (markup, say) is unreadable,
    so the report leaves it out rather than failing on it or writing it into the page."""
    from engine.report.html import render_report

    archive.spawn("grpo", "child", edit=DR_GRPO)
    good = _conf({2: 0.6, 3: 0.63}, {2: 0.5, 3: 0.52}, search_difference=(0.1, [0.0, 0.2], 2))
    d = json.loads(good.to_json())
    assert Confirmation.from_json(json.dumps(d)).search_difference == (0.1, (0.0, 0.2), 2)
    markup = "<img src=x onerror=alert(1)>"
    for forged in (
        [0.1, None, markup],
        [markup, None, 2],
        [0.1, [markup, 0.2], 2],
        [0.1, [0.0, 0.1, 0.2], 2],
        [float("nan"), None, 2],
        [0.1, None, True],
    ):
        with pytest.raises(ArchiveError, match="search_difference"):
            Confirmation.from_json(json.dumps({**d, "search_difference": forged}))
    archive.commit_files(
        "child",
        {good.path: json.dumps({**d, "search_difference": [0.1, None, markup]})},
        subject="a forged confirmation",
    )
    page = render_report(archive).read_text()
    assert "<img" not in page and "Held-out confirmations" not in page
    assert archive.fsck()


def test_a_confirmation_nested_too_deep_to_parse_is_unreadable_and_left_out(archive):
    """A confirmation file is archive data anyone who can push a branch can write: JSON nested deeper
    than the parser recurses is an unreadable record like any other, so the report and the log
    leave it out instead of stopping on a RecursionError."""
    from engine.report.html import render_report

    archive.spawn("grpo", "child", edit=DR_GRPO)
    good = _conf({2: 0.6, 3: 0.63}, {2: 0.5, 3: 0.52})
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ArchiveError, match="unreadable confirmation"):
        Confirmation.from_json(deep)
    archive.commit_files("child", {good.path: deep}, subject="a deep confirmation")
    page = render_report(archive).read_text()
    assert "Held-out confirmations" not in page
    r = run_cli_inprocess("log", "-C", str(archive.path))
    assert r.returncode == 0, r.stderr


def test_log_and_the_report_mark_a_confirmation_of_another_protocol_version(archive):
    """A confirmation recorded before the protocol changed (same id, another hash) measured another
    version than the results the log and the report compare: each names the confirmation's version
    and marks it, and lists a confirmation of the current version unmarked."""
    from engine.operators.evaluate import proxy_protocol
    from engine.report.html import render_report
    from trainer_template.proxy.protocol import get_protocol

    current = proxy_protocol("default", get_protocol("default"))
    older = dataclasses.replace(current, hash="sha256:" + "ab" * 32)
    archive.spawn("grpo", "child", edit=DR_GRPO)
    archive.spawn("grpo", "other", edit=DR_GRPO)
    for name in ("grpo", "child", "other"):
        archive.record_result(name, dataclasses.replace(_result([0, 1]), protocol=current))
    record_confirmation(archive, _conf({2: 0.6, 3: 0.63}, {2: 0.5, 3: 0.52}, protocol=older))
    record_confirmation(
        archive, _conf({2: 0.4, 3: 0.41}, {2: 0.5, 3: 0.52}, node="other", protocol=current)
    )
    mark = f"[another protocol version than {current.key}]"
    for args in ((), ("--protocol", "proxy/default")):  # the experiment's (with its hash), the id
        out = run_cli_inprocess("log", *args, "-C", str(archive.path))
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        child = next(ln for ln in lines if "── child " in ln)
        other = next(ln for ln in lines if "── other " in ln)
        assert f"confirmed +0.1050 (2 seeds, {older.key}) {mark}" in child
        assert f"reversed -0.1050 (2 seeds, {current.key})" in other and mark not in other
        rows = {
            r["node"]: r["confirmation"]
            for r in json.loads(
                run_cli_inprocess("log", "--json", *args, "-C", str(archive.path)).stdout
            )
        }
        assert rows["child"]["protocol"] == older.key
        assert rows["child"]["other_version_than"] == current.key
        assert rows["other"]["protocol"] == current.key
        assert rows["other"]["other_version_than"] is None
    shown = run_cli_inprocess("show", "child", "-C", str(archive.path)).stdout
    assert f"held-out confirmation under {older.key} [another protocol version than its " in shown
    page = render_report(archive).read_text()
    assert "<th>against</th><th>protocol</th><th>held-out seeds</th>" in page
    # the current version's first, unmarked; the other version's after it, marked
    assert f"<td>other</td><td>grpo</td><td>{current.key}</td><td>2, 3</td>" in page
    assert (
        f"<td>child</td><td>grpo</td><td>{older.key} <span class='worse'>(another version than "
        f"this page's {current.key})</span></td><td>2, 3</td>"
    ) in page
    assert page.index("<td>other</td><td>grpo</td>") < page.index("<td>child</td><td>grpo</td>")


def test_an_unconfirmed_gain_is_told_how_many_held_out_seeds_would_confirm_it():
    from engine.cli.confirm_cmds import confirmation_line, resolve_hint
    from engine.stats import seeds_to_resolve

    ahead = _conf({2: 0.53, 3: 0.49, 4: 0.52}, {2: 0.50, 3: 0.50, 4: 0.50})  # +0.0133, SD ~0.021
    assert ahead.verdict == NOT_CONFIRMED and ahead.difference > 0
    line = confirmation_line(ahead)
    hint = resolve_hint(ahead.difference, ahead.interval, 3)
    assert line.endswith("; " + hint) and "[bold]held-out confirmation:[/]" in line
    sd = float(np.std([0.03, -0.01, 0.02], ddof=1))
    assert f"{seeds_to_resolve(ahead.difference, sd)} paired seeds would show it" in hint
    assert f"these 3 show ({sd:.4f})" in hint
    behind = _conf({2: 0.47, 3: 0.51, 4: 0.48}, {2: 0.50, 3: 0.50, 4: 0.50})
    confirmed = _conf({2: 0.55, 3: 0.56, 4: 0.57}, {2: 0.50, 3: 0.50, 4: 0.51})
    for c in (behind, confirmed):
        assert "would show it" not in confirmation_line(c)
    assert confirmation_line(confirmed).startswith("[bold green]held-out confirmation:[/]")


def test_a_resumed_run_reads_back_the_confirmation_it_already_recorded(archive):
    """`run --resume` of a run whose held-out confirmation is recorded (it was killed after it, or
    resumed again) reads it back; another node pair, seed count or protocol version is measured."""
    from engine.cli.run_cmds import _done_confirmation

    archive.spawn("grpo", "child", edit=DR_GRPO)
    mark_verified(archive, "child")
    conf = _conf({2: 0.6, 3: 0.61}, {2: 0.5, 3: 0.52}, node_commit=archive.node("child").commit)
    assert _done_confirmation(archive, "child", "grpo", 2, PROTO.key) is None
    record_confirmation(archive, conf)
    assert _done_confirmation(archive, "child", "grpo", 2, PROTO.key) == conf
    assert _done_confirmation(archive, "child", "grpo", 3, PROTO.key) is None
    assert _done_confirmation(archive, "child", "other", 2, PROTO.key) is None
    assert _done_confirmation(archive, "child", "grpo", 2, "proxy/smoke@" + "cd" * 6) is None


def test_the_confirmation_line_names_the_protocol_its_seeds_were_measured_under():
    """`confirm` and `run --confirm-seeds` print one line of numbers: it says what measured them, as
    `show` does (which names the protocol in its own heading)."""
    from engine.cli.confirm_cmds import confirmation_line

    conf = _conf({2: 0.55, 3: 0.56, 4: 0.57}, {2: 0.50, 3: 0.50, 4: 0.51})
    line = confirmation_line(conf)
    assert f"child vs grpo on 3 held-out seed(s) [2, 3, 4] under {PROTO.key}: confirmed" in line
    assert PROTO.key not in conf.describe()  # show's heading names it already


def test_a_child_does_not_inherit_its_parents_confirmation(archive):
    """A node spawned from a confirmed one starts with no confirmation of its own: log, show and the
    report never credit it with its parent's held-out seeds."""
    archive.spawn("grpo", "child", edit=DR_GRPO)
    for name in ("grpo", "child"):
        archive.record_result(name, _result([0, 1]))
    record_confirmation(archive, _conf({2: 0.6, 3: 0.63}, {2: 0.5, 3: 0.52}))
    archive.spawn("child", "grandchild", edit=DR_GRPO.replace("stats.mean", "stats.mean * 1.0"))
    tree = archive.git.ls_tree(archive.node("grandchild").commit)
    assert not any(p.startswith("confirmations/") for p in tree)
    assert read_confirmation(archive, "grandchild", "proxy/smoke") is None
    rows = {
        r["node"]: r
        for r in json.loads(
            run_cli_inprocess(
                "log", "--json", "--protocol", "proxy/smoke", "-C", str(archive.path)
            ).stdout
        )
    }
    assert rows["child"]["confirmation"]["verdict"] == CONFIRMED
    assert rows["grandchild"]["confirmation"] is None


def test_a_confirmation_a_node_inherited_before_the_fix_is_not_read_as_its_own(archive):
    """Archives written before children stopped inheriting ``confirmations/`` hold a parent's record
    on a child's branch: the readers leave it out, since it names another node."""
    archive.spawn("grpo", "child", edit=DR_GRPO)
    archive.record_result("child", _result([0, 1]))
    conf = _conf({2: 0.6, 3: 0.63}, {2: 0.5, 3: 0.52})
    record_confirmation(archive, conf)
    archive.spawn("child", "grandchild", edit=DR_GRPO.replace("stats.mean", "stats.mean * 1.0"))
    archive.commit_files(  # what a spawn wrote before: the parent's record on the child's branch
        "grandchild",
        {conf.path: conf.to_json()},
        subject="poise: inherited",
        trailers={"Poise-Event": "spawn"},
    )
    assert read_confirmation(archive, "grandchild", "proxy/smoke") is None
    nodes = archive.nodes("proxy/smoke")
    assert set(read_confirmations(archive, nodes, "proxy/smoke")) == {"child"}
