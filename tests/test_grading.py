"""Grading: shipped data integrity, per-benchmark gold extraction, math-verify on tricky pairs, the
process-pool grader's time bound, crash and hang handling."""

from __future__ import annotations

import hashlib
import re
import textwrap
import time

import pytest

from evaluators.benchmarks import DATA_DIR, SHA256, SUITES, gold_answer, load_problems
from evaluators.grading import (
    GRADER_VERSION,
    extract_boxed,
    grade_answer,
    grade_completion,
    is_equivalent,
)
from evaluators.pool import GraderPool

LINES = {
    "aime24": 30,
    "aime25": 30,
    "amc83": 83,
    "math500": 500,
    "minerva_math": 272,
    "olympiadbench": 675,
}


def test_shipped_files_match_provenance_sha256():
    text = (DATA_DIR / "PROVENANCE.md").read_text()
    listed = dict(
        (path.split("/")[0], digest)
        for digest, path in re.findall(r"^([0-9a-f]{64})  (\S+)$", text, re.M)
    )
    assert listed == SHA256
    for name, digest in SHA256.items():
        data = (DATA_DIR / name / "test.jsonl").read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, name
        assert data.count(b"\n") == LINES[name], name


def test_gold_extraction_per_benchmark():
    benches = {b.key: b for b in SUITES["math6"]}
    first = {k: load_problems(b, limit=1)[0] for k, b in benches.items()}
    assert first["aime24"].gold == "204"
    assert first["aime25"].gold == "70" and first["aime25"].problem.startswith(
        "Find the sum of all integer bases"
    )
    assert first["amc"].gold == "142"  # the float 142.0
    assert first["math500"].gold == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert first["minerva"].gold == "1.6"  # the last \boxed{} of the solution
    assert gold_answer("aime24", {"answer": "025"}) == "025"
    assert (
        gold_answer(
            "minerva_math",
            {"problem": "p", "solution": "so \\boxed{2} then $\\boxed{\\frac{1}{3}}$"},
        )
        == "\\frac{1}{3}"
    )
    row = {"final_answer": ["$69$,$84$"], "is_multiple_answer": True}
    assert gold_answer("olympiadbench", row) == "69, 84"
    assert (
        gold_answer(
            "olympiadbench",
            {"final_answer": ["$(-\\infty, 0) \\cup\\{1\\}$."], "is_multiple_answer": False},
        )
        == "(-\\infty, 0) \\cup\\{1\\}"
    )
    assert all(len(load_problems(b)) == LINES[b.dataset] for b in SUITES["math6"])


def test_golds_with_dollars_inside_grade_the_whole_answer():
    """Three golds carry ``$`` inside the answer (OlympiadBench ``"$221,$8$"`` and
    ``"$f(n)=n$, $g(n)=1$"``; a Minerva solution boxing ``…+$ $…``): the whole answer is graded right
    and a part of it wrong, never the reverse."""
    probs = {(p.benchmark, p.index): p for b in SUITES["math6"] for p in load_problems(b)}
    assert not [k for k, p in probs.items() if re.search(r"(?<!\\)\$", p.gold)]
    mn = probs["olympiadbench", 194].gold
    assert is_equivalent(mn, "221, 8") and is_equivalent(mn, "m=221, n=8")
    assert not is_equivalent(mn, "221") and not is_equivalent(mn, "8")
    fg = probs["olympiadbench", 17].gold
    assert is_equivalent(fg, "f(n)=n, g(n)=1") and not is_equivalent(fg, "f(n)=n")
    x = probs["minerva", 72].gold
    whole = "x_{0} \\cos (\\omega t)+\\dot{x}_{0} \\sin (\\omega t) / \\omega"
    assert is_equivalent(x, whole)
    assert not is_equivalent(x, "\\dot{x}_{0} \\sin (\\omega t) / \\omega")
    assert probs["math500", 242].gold == "\\$32,\\!348"  # an escaped dollar is the answer's own


def test_every_gold_grades_as_its_own_boxed_answer():
    """Each benchmark's extracted gold, boxed as a model would write it, is graded correct (process pool):
    every 20th problem plus every multi-answer gold (all 1,590 pass too; kept small for CI time)."""
    all_probs = [p for b in SUITES["math6"] for p in load_problems(b)]
    assert len(all_probs) == 1590
    probs = [
        p
        for p in all_probs
        if p.index % 20 == 0 or (p.benchmark == "olympiadbench" and "," in p.gold)
    ]
    pairs = [(p.gold, f"The answer is $\\boxed{{{p.gold}}}$.") for p in probs]
    with GraderPool(workers=2, timeout_s=10) as pool:
        grades = pool.grade(pairs)
    bad = [(p.benchmark, p.gold, g.status) for p, g in zip(probs, grades) if not g.correct]
    assert len(probs) > 150 and bad == []


@pytest.mark.parametrize(
    "gold,pred,expected",
    [
        ("\\frac12", "0.5", True),
        ("0.5", "\\frac{1}{2}", True),
        ("025", "25", True),
        ("25", "025", True),
        ("27", "27.0", True),
        ("(1,2]", "(1,2]", True),
        ("(1,2]", "(1,2)", False),
        ("[\\frac{1}{2}, 8]", "[0.5,8]", True),
        ("(-\\infty, 0) \\cup\\{1\\}", "(-\\infty,0)\\cup\\{1\\}", True),
        ("\\{1,2\\}", "\\{2,1\\}", True),
        ("69, 84", "84, 69", True),  # a multi-answer OlympiadBench row: order-free
        ("69, 84", "69", False),
        ("(6,3),(9,3),(9,5),(54,5)", "(9,5),(6,3),(54,5),(9,3)", True),
        ("(6,3),(9,3),(9,5),(54,5)", "(6,3),(9,3),(9,5)", False),
        ("45", "45 \\text{ minutes}", True),  # units
        ("\\frac{41}{12}", "\\frac{41}{12}\\text{ km}", True),
        ("1.6", "1.6 \\mathrm{~cm}", True),
        ("4.2", "4.2\\%", True),
        ("x^2+1", "1+x^2", True),
        ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", True),
        ("3", "4", False),
    ],
)
def test_tricky_pairs(gold, pred, expected):
    assert is_equivalent(gold, pred) is expected


def test_olympiad_multi_answer_rows_from_the_data():
    import json

    rows = [json.loads(line) for line in (DATA_DIR / "olympiadbench" / "test.jsonl").open()]
    multi = {
        r["final_answer"][0]: gold_answer("olympiadbench", r)
        for r in rows
        if r["is_multiple_answer"]
    }
    assert len([r for r in rows if r["is_multiple_answer"]]) == 94
    assert multi["$69$,$84$"] == "69, 84"
    assert multi["$-2,0,2$"] == "-2,0,2"
    assert is_equivalent(multi["$69$,$84$"], "84,69") and not is_equivalent(
        multi["$69$,$84$"], "84"
    )
    assert is_equivalent(multi["$-2,0,2$"], "2, -2, 0") and not is_equivalent(
        multi["$-2,0,2$"], "-2, 2"
    )


def test_extract_boxed():
    assert extract_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_boxed("\\boxed{\\{1, \\{2\\}\\}}") == "\\{1, \\{2\\}\\}"
    assert extract_boxed("\\fbox{7}") == "7"
    assert extract_boxed("no answer") is None
    assert extract_boxed("\\boxed{unbalanced") is None
    assert extract_boxed("") is None


def test_grade_statuses_and_format_validity():
    assert grade_completion("2", "so \\boxed{2}").status == "ok"
    g = grade_completion("2", "I think it is 2")
    assert (g.correct, g.valid, g.status) == (False, False, "no_answer")
    g = grade_completion("2", "\\boxed{3}")
    assert (g.correct, g.valid) == (False, True)
    t = grade_answer("\\frac{1}{2} + \\sqrt{x^2 + 2x + 1}", "\\sqrt{(x+1)^2} + 0.5", timeout_s=1e-4)
    assert (t.correct, t.status) == (False, "timeout")
    assert GRADER_VERSION


HELPER = textwrap.dedent("""
    import os, signal, time
    from evaluators.grading import grade_completion

    def grade(gold, text, timeout_s):
        if gold == "CRASH":
            os._exit(3)
        if gold == "HANG":
            signal.signal(signal.SIGALRM, signal.SIG_IGN)  # the alarm cannot break this one
            time.sleep(60)
        return grade_completion(gold, text, timeout_s)
""")


def test_pool_reports_crashes_and_hangs_and_never_blocks(tmp_path, monkeypatch):
    (tmp_path / "poise_grader_helper.py").write_text(HELPER)
    monkeypatch.syspath_prepend(str(tmp_path))
    pairs = [
        ("1", "\\boxed{1}"),
        ("CRASH", "x"),
        ("2", "\\boxed{2}"),
        ("HANG", "x"),
        ("3", "\\boxed{4}"),
        ("4", "\\boxed{4}"),
    ]
    t0 = time.monotonic()
    with GraderPool(
        workers=2, timeout_s=1.0, grace_s=1.0, chunk=3, grader="poise_grader_helper:grade"
    ) as pool:
        grades = pool.grade(pairs)
        restarts = pool.restarts
    assert time.monotonic() - t0 < 30
    assert [g.status for g in grades] == ["ok", "crash", "ok", "timeout", "ok", "ok"]
    assert [g.correct for g in grades] == [True, False, True, False, False, True]
    assert restarts == 2


def test_pool_matches_single_process_grading():
    pairs = [
        ("\\frac12", "\\boxed{0.5}"),
        ("025", "\\boxed{25}"),
        ("3", "\\boxed{4}"),
        ("x", "none"),
    ] * 5
    with GraderPool(workers=2, chunk=3) as pool:
        pooled = pool.grade(pairs)
    assert pooled == [grade_completion(g, t) for g, t in pairs]


@pytest.mark.slow
def test_the_verl_reward_is_bounded_in_any_thread():
    """verl's reward workers may grade from a thread other than the main one, where no alarm can
    bound math-verify; a response it would grade for ever (a power tower) scores 0 within the bound
    there too, and right answers still score 1."""
    import threading
    import time

    from trainer_template.verl_backend import reward

    out: dict = {}

    def score() -> None:
        t0 = time.monotonic()
        out["tower"] = reward.compute_score("math", "so \\boxed{9^{9^{9^{9}}}}", "5")
        out["s"] = time.monotonic() - t0
        out["right"] = reward.compute_score("math", "so \\boxed{\\frac{1}{2}}", "0.5")

    t = threading.Thread(target=score, daemon=True)
    t.start()
    t.join(timeout=45)
    assert not t.is_alive(), "grading in a thread did not return"
    assert out["tower"] == {"score": 0.0, "acc": 0.0, "format_valid": 1.0}
    assert out["s"] < reward.GRADE_TIMEOUT_S + 20
    assert out["right"]["score"] == 1.0
    main = reward.compute_score("math", "so \\boxed{9^{9^{9^{9}}}}", "5")  # the main thread's alarm
    assert main["score"] == 0.0


def _copy_of_the_data(tmp_path, monkeypatch):
    import shutil

    import evaluators.benchmarks as benchmarks

    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    monkeypatch.setattr(benchmarks, "DATA_DIR", data)
    return data


def test_a_truncated_or_corrupted_benchmark_file_is_one_clear_error_not_a_partial_score(
    tmp_path, monkeypatch
):
    """A benchmark file that is not the shipped one (cut short by a failed copy, edited by hand) is
    refused by name, before anything is generated: scoring the rows that are left would record a
    partial score under the benchmark's name."""
    from evaluators.benchmarks import suite
    from evaluators.errors import SuiteError

    data = _copy_of_the_data(tmp_path, monkeypatch)
    olympiad = next(b for b in SUITES["math6"] if b.dataset == "olympiadbench")
    path = data / "olympiadbench" / "test.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:100]))  # truncated at a line boundary: every row parses
    with pytest.raises(SuiteError, match=r"olympiadbench.*sha256"):
        load_problems(olympiad)
    with pytest.raises(SuiteError, match=r"olympiadbench.*sha256"):
        suite("math6")
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][:50])  # cut inside the last row
    with pytest.raises(SuiteError, match=r"olympiadbench.*sha256"):
        load_problems(olympiad, limit=1)
    path.unlink()
    with pytest.raises(SuiteError, match="missing"):
        suite("math6")
    aime = SUITES["math6"][0]
    assert len(load_problems(aime)) == LINES["aime24"]  # the untouched files still load
