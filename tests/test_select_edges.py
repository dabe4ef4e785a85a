"""The selector on archives a user or an attacker can make: hand-edited result and fingerprint files,
utilities near the float limit, results under several protocols. Real archives in tmp_path."""

from __future__ import annotations

import json
import math
import warnings

from results_util import record

from engine.archive.results import EvaluationResult, Protocol, now
from engine.select import select_parents

RESULT = "results/proxy/default.json"
SRC = '''\
def compute_advantages(batch, cfg):
    """variant {i}"""
    scores = batch.rewards.to(torch.float32) * {i}
    return scores - scores.mean()
'''


def _chain(archive, utilities, record_one=None) -> list[str]:
    """The root and a chain of children, each with its own code, recorded with ``utilities``."""
    record_one = record_one or (lambda n, u: record(archive, n, {"overall": u}))
    names = ["grpo"] + [f"n{i}" for i in range(len(utilities) - 1)]
    for i, (name, u) in enumerate(zip(names, utilities)):
        if i:
            archive.spawn(names[i - 1], name, SRC.format(i=i))
        record_one(name, u)
    return names


def _finite_rows(sel) -> None:
    for r in sel.rows:
        for key in ("pareto", "perf", "div", "gp_ucb", "score"):
            assert r[key] is None or math.isfinite(r[key]), (r["node"], key, r[key])
    json.dumps(sel.to_dict(), allow_nan=False)  # what `select --json` prints is valid JSON


def test_a_result_hand_edited_to_a_huge_integer_is_unreadable_not_a_crash(archive):
    """JSON has integers of any size; one too large for a float made every read of the archive
    raise OverflowError. The node now reads as not evaluated, and the selection says why."""
    names = _chain(archive, [0.40, 0.45, 0.50])
    text = archive.git.text("show", f"refs/heads/poise/{names[-1]}:{RESULT}")
    edited = text.replace('"overall": 0.5', '"overall": 1' + "0" * 400)
    assert edited != text
    archive.commit_files(names[-1], {RESULT: edited}, subject="hand edit")
    sel = select_parents(archive, k=2)
    row = sel.row(names[-1])
    assert not row["eligible"] and names[-1] not in sel.chosen
    assert RESULT in row["why"] and "unreadable" in row["why"], row["why"]
    assert sel.chosen == ["n0", "grpo"] and archive.fsck()


def test_a_result_hand_edited_to_nan_says_its_file_is_unreadable(archive):
    names = _chain(archive, [0.40, 0.45, 0.50])
    text = archive.git.text("show", f"refs/heads/poise/{names[-1]}:{RESULT}")
    archive.commit_files(
        names[-1], {RESULT: text.replace('"overall": 0.5', '"overall": NaN')}, subject="edit"
    )
    row = select_parents(archive, k=2).row(names[-1])
    assert not row["eligible"] and row["why"] != "no results"
    assert f"{RESULT} is unreadable" in row["why"] and "finite" in row["why"], row["why"]


def test_hand_edited_fingerprints_are_ignored_not_a_crash(archive):
    """fingerprint.json is read from git: nesting deeper than the JSON reader's recursion limit, or an
    integer too large for a float, makes that file unusable (code features are used), not a crash."""
    names = _chain(archive, [0.40, 0.45, 0.50, 0.48])
    for n, vec in zip(names, ([1, 2], [2, 1], [1, 1])):
        archive.commit_files(n, {"fingerprint.json": json.dumps(vec)}, subject="fp")
    plain = select_parents(archive, k=2)
    for blob in ("[" * 100_000 + "]" * 100_000, "[1" + "0" * 400 + ", 1]", "[1" + "0" * 5000 + "]"):
        archive.commit_files(names[-1], {"fingerprint.json": blob}, subject="fp")
        sel = select_parents(archive, k=2)
        assert sel.params["mechanism"] == "code" and sel.chosen == plain.chosen
        _finite_rows(sel)


def _lab(archive, node, u) -> None:
    archive.record_result(
        node,
        EvaluationResult(
            protocol=Protocol("lab/v1"),
            status="evaluated",
            metrics={"overall": u},
            units={"overall": "value"},
            seeds=(0,),
            recorded_at=now(),
        ),
    )


def test_utilities_near_the_float_limit_rank_without_nan(archive):
    """A recorded number of unknown scale (unit ``value``) may be any finite float: utilities near
    the float limit overflowed U's span and the features' variance, so the best node scored NaN
    (ranked last, and `select --json` printed NaN). Every term stays finite, on the same scale."""
    _chain(archive, [1e308, -1e308, 0.0, 1.0, 2.0], lambda n, u: _lab(archive, n, u))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the library prints nothing, numpy's warnings included
        sel = select_parents(archive, k=2, protocol="lab/v1")
    _finite_rows(sel)
    assert sel.row("grpo")["perf"] == 1.0 and sel.row("n0")["perf"] == 0.0
    assert sel.row("n3")["perf"] == 0.5 and sel.row("grpo")["pareto"] == 1.0
    same = [1e308] * 5
    for i, n in enumerate(["grpo", "n0", "n1", "n2", "n3"]):
        _lab(archive, n, same[i])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _finite_rows(select_parents(archive, k=2, protocol="lab/v1"))


def test_fingerprints_near_the_float_limit_stay_finite(archive):
    names = _chain(archive, [0.40, 0.45, 0.50, 0.48])
    for n, vec in zip(names, ([1e308, 2], [-1e308, 1], [1, 1], [1e308, 0])):
        archive.commit_files(n, {"fingerprint.json": json.dumps(vec)}, subject="fp")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sel = select_parents(archive, k=2)
    assert sel.params["mechanism"] == "fingerprint"
    _finite_rows(sel)


def test_a_failure_under_another_protocol_is_no_evidence_here(archive, tmp_path):
    """The GP's failed-children feature reads "failed" under the compared protocol, as parent
    eligibility does: a child that failed only under another preset (its status says failed) leaves
    the ranking under this protocol exactly as it was."""
    _chain(archive, [0.40, 0.45, 0.42, 0.50, 0.48])
    archive.spawn("n0", "side", SRC.format(i=9))
    failed = {"metrics": {}, "status": "failed", "reason": "oom"}

    def unchanged_by(preset: str, payload: dict, status: str) -> None:
        before = select_parents(archive, k=3)
        record(archive, "side", payload, preset=preset)
        assert archive.node("side").status == status
        after = select_parents(archive, k=3)
        assert after.chosen == before.chosen
        for r in before.rows:
            assert after.row(r["node"])["score"] == r["score"], r["node"]
            assert after.row(r["node"])["gp_ucb"] == r["gp_ucb"], r["node"]

    record(archive, "side", {"overall": 0.30})
    unchanged_by("tiny", failed, "failed")  # evaluated here, failed elsewhere: not a failure here
    archive.set_status("side", "evaluated")
    record(archive, "side", failed)
    unchanged_by("smoke", {"overall": 0.5}, "evaluated")  # failed here, evaluated elsewhere: still


def test_select_help_explains_every_column_and_the_table_names_the_unit(archive, cli):
    _chain(archive, [0.40, 0.45])
    out = cli("select", "--help", env={"COLUMNS": "300"}).stdout
    legend = " ".join(out.split("Columns:", 1)[1].split("Options")[0].split())
    for col in ("U =", "layer =", "pareto, perf, div =", "gp_ucb =", "desc. gain =", "score ="):
        assert col in legend, (col, legend)
    assert "[0, 1]" in legend and "[-1, 1]" in legend
    r = cli("select", "-C", str(archive.path), env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert "utility: overall (fraction)" in r.stdout, r.stdout
    assert select_parents(archive).params["unit"] == "fraction"
