"""pass@k against the binomial form, Overall against the paper's rows, lengths, bootstrap intervals, scoring."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from evaluators.benchmarks import SUITES
from evaluators.grading import Grade
from evaluators.metrics import (
    MATH6_WEIGHTS,
    bootstrap_intervals,
    math6_overall,
    mean_length,
    pass_at_k,
    word_count,
)
from evaluators.suite import build_metrics, score_benchmark, suite_metric_names


def binomial(n, c, k):
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


@pytest.mark.parametrize("n", [1, 2, 5, 16, 32, 64])
def test_pass_at_k_matches_binomial_form(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(binomial(n, c, k)), abs=1e-12)


def test_pass_at_k_special_cases_and_stability():
    assert pass_at_k(32, 0, 32) == 0.0
    assert pass_at_k(32, 1, 32) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    # large n: the ratio of binomials overflows floats, the product form does not
    exact = float(binomial(2000, 3, 1000))
    assert pass_at_k(2000, 3, 1000) == pytest.approx(exact, rel=1e-12)
    assert math.isfinite(pass_at_k(100000, 1, 50000))
    for bad in [(0, 0, 1), (4, 5, 1), (4, 1, 5), (4, -1, 1), (4, 1, 0)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


@pytest.mark.parametrize(
    "row,expected",
    [
        ((50.0, 26.7, 84.3, 72.4, 24.6, 35.4), 47.8),  # GRPO, the paper's table
        ((53.3, 43.3, 88.0, 73.6, 24.3, 35.3), 52.5),  # VM-AV-GRPO
    ],
)
def test_overall_reproduces_paper_rows(row, expected):
    scores = dict(zip(["aime24", "aime25", "amc", "math500", "minerva", "olympiadbench"], row))
    assert round(math6_overall(scores), 1) == expected


def test_overall_weights_and_missing_keys():
    assert sum(MATH6_WEIGHTS.values()) == pytest.approx(1.0)
    assert math6_overall({k: 10.0 for k in MATH6_WEIGHTS}) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="minerva"):
        math6_overall({k: 1.0 for k in MATH6_WEIGHTS if k != "minerva"})
    assert [b.key for b in SUITES["math6"]] == list(MATH6_WEIGHTS)


def test_lengths():
    assert word_count("We have  $x=2$,\nso \\boxed{2}.") == 5
    assert word_count("") == 0
    assert mean_length({"a": 10.0, "b": 20.0, "c": 0.0}) == pytest.approx(10.0)


def test_bootstrap_intervals():
    rng = np.random.default_rng(1)
    per = {k: list(100.0 * (rng.random(200) < 0.4)) for k in MATH6_WEIGHTS}
    ci = bootstrap_intervals(per, n_boot=2000, seed=3)
    assert set(ci) == set(MATH6_WEIGHTS) | {"overall"}
    for k, (lo, hi) in ci.items():
        mean = (
            math6_overall({j: np.mean(v) for j, v in per.items()})
            if k == "overall"
            else np.mean(per[k])
        )
        assert lo < mean < hi
    # the Overall interval is narrower than a benchmark's (it averages six independent ones)
    assert ci["overall"][1] - ci["overall"][0] < ci["aime24"][1] - ci["aime24"][0]
    assert ci == bootstrap_intervals(per, n_boot=2000, seed=3)  # seeded
    # binomial standard error: 95% half-width ~ 1.96 * sqrt(p(1-p)/n)
    p = np.mean(per["amc"]) / 100
    half = (ci["amc"][1] - ci["amc"][0]) / 2
    assert half == pytest.approx(196 * math.sqrt(p * (1 - p) / 200), rel=0.15)
    flat = bootstrap_intervals({"a": [50.0] * 7}, n_boot=100)
    assert flat == {"a": [50.0, 50.0]}
    with pytest.raises(ValueError):
        bootstrap_intervals({"a": []})


def test_score_benchmark_pass_at_k_and_acc():
    aime = next(b for b in SUITES["math6"] if b.key == "aime24")
    ok, bad = Grade(True, True), Grade(False, True)
    none = Grade(False, False, "no_answer")
    tmo = Grade(False, False, "timeout")
    comps = [["a b"] * 32, ["a"] * 32]
    grades = [[ok] + [bad] * 31, [none] * 30 + [tmo, bad]]
    r = score_benchmark(aime, comps, grades)
    assert r["per_problem"] == [100.0, 0.0] and r["score"] == 50.0
    assert r["mean_accuracy"] == pytest.approx(100 / 64)
    assert r["valid_rate"] == pytest.approx(33 / 64)
    assert r["mean_length"] == pytest.approx(1.5)
    assert r["grader_failures"] == {"timeout": 1} and r["samples"] == 64
    math500 = next(b for b in SUITES["math6"] if b.key == "math500")
    r2 = score_benchmark(math500, [["x"], ["y"], ["z"], ["w"]], [[ok], [bad], [bad], [ok]])
    assert r2["score"] == 50.0
    run = {"benchmarks": {k: (r if k.startswith(("aime", "amc")) else r2) for k in MATH6_WEIGHTS}}
    m = build_metrics(run)
    assert (
        m["overall"] == pytest.approx(50.0) and m["aime24"] == 50.0 and m["grader_failures"] == 3.0
    )
    assert set(m) == suite_metric_names(SUITES["math6"])  # what an objective is checked against


def test_the_generation_backend_is_part_of_the_suites_protocol():
    """vLLM, a server and transformers sample differently from one model and seed: a suite result
    names its generator in its protocol, whose hash differs by it, so no two are ranked or paired."""
    from evaluators.benchmarks import suite
    from evaluators.suite import protocol, protocol_hash

    benches, max_tokens = suite("math6", "paper")
    hashes = {
        g: protocol_hash(protocol("math6", "paper", benches, max_tokens, None, 10.0, 0, g))
        for g in ("vllm", "openai", "transformers")
    }
    assert len(set(hashes.values())) == 3
    again = protocol("math6", "paper", benches, max_tokens, None, 10.0, 0, "vllm")
    assert again["generator"] == "vllm" and protocol_hash(again) == hashes["vllm"]
