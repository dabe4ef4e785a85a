"""The paper-reliability benchmark: its transcription of the paper's tables, the split-half
reliability on data of known reliability, and the ceiling's behaviour at the limits."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import paper_reliability as pr
    from proxy_runs import PAPER_OVERALL
finally:
    sys.path.remove(str(ROOT / "benchmarks"))


def test_the_transcribed_table_gives_the_papers_overall_and_the_calibrated_mechanisms_numbers():
    rows = pr.read_paper_table()
    main = [r for r in rows if r["table"] == "main"]
    assert len(main) == 64 and len([r for r in rows if r["table"] == "compression"]) == 11
    # every main-run row's Overall is the paper's weighted mean of its six benchmarks, to rounding
    for r in main:
        assert pr.paper_weighted(r, pr.BENCHMARKS) == pytest.approx(r["overall"], abs=0.07), r
    names = {r["algorithm"]: r["overall"] for r in reversed(rows)}
    assert {m: names[pr.TABLE_NAME[m]] for m in PAPER_OVERALL} == PAPER_OVERALL


def _synthetic(n: int, noise_sd: float, seed: int = 0) -> list[dict]:
    """Variants with a true score shared by the six benchmarks (SD 1) and independent benchmark noise."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        t = rng.gauss(0, 1)
        rows.append({b: t + rng.gauss(0, noise_sd) for b in pr.BENCHMARKS})
    return rows


@pytest.mark.parametrize("noise_sd", [1.0, 2.0, 3.0])
def test_split_half_recovers_the_reliability_of_data_whose_reliability_is_known(noise_sd):
    # Overall = sum_b w_b (t + e_b): true variance 1, noise variance noise_sd^2 * sum_b w_b^2
    expected = 1 / (1 + noise_sd**2 * sum(w * w for w in pr.WEIGHTS.values()))
    got = pr.split_half_reliability(_synthetic(3000, noise_sd))
    assert got["reliability"] == pytest.approx(expected, abs=0.04)
    assert len(got["splits"]) == 10


def test_the_ceiling_is_exact_without_noise_and_falls_with_it():
    observed = dict(PAPER_OVERALL)
    collapsed = {m for m, v in observed.items() if v < 40}
    exact = pr.rank_ceiling(observed, collapsed, 47.0, 4.0, 0.0, draws=200)
    assert exact["spearman_mean"] == pytest.approx(1.0)
    assert exact["p_above_grpo"] == {
        m: float(v > observed["grpo"]) for m, v in observed.items() if m != "grpo"
    }
    noisy = [pr.rank_ceiling(observed, collapsed, 47.0, 2.0, sd, draws=2000) for sd in (1.0, 2.0)]
    assert 1.0 > noisy[0]["spearman_mean"] > noisy[1]["spearman_mean"]
    assert noisy[0]["p_above_grpo"]["vm_av_grpo"] > noisy[1]["p_above_grpo"]["vm_av_grpo"] > 0.5
    # a mechanism tied to GRPO is never truly above it, and the expected count drops by one at most
    tied = pr.rank_ceiling(observed, collapsed, 47.0, 2.0, 1.0, draws=2000, tie=("av_grpo", "grpo"))
    assert tied["p_above_grpo"]["av_grpo"] == 0.0
    assert 0 < noisy[0]["expected_improvers_above"] - tied["expected_improvers_above"] <= 1


def test_the_benchmark_prints_its_tables_and_writes_its_json(tmp_path):
    out, fig = tmp_path / "r.json", tmp_path / "f.png"
    script = ROOT / "benchmarks" / "paper_reliability.py"
    res = subprocess.run(
        [sys.executable, str(script), "--draws", "200", "--json", str(out), "--figure", str(fig)],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.read_text())
    assert data["variants"] == {"main": 64, "kept": 59}
    assert 0 < data["split_half"]["reliability"] < 1
    assert data["collapsed"] == ["dcbe_grpo", "sa_grpo"]
    assert [c["training_sd"] for c in data["ceiling"]] == [
        sd for sd in pr.TRAINING_SDS if sd < data["training_sd_room"]
    ]
    assert "a perfect proxy's Spearman" in res.stdout and "| vm_av_grpo |" in res.stdout
    # beside the recorded 53-seed calibration, on both yardsticks
    fp = data["faithful_proxy"]
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert fp["spearman"] == pytest.approx(0.518, abs=0.001)  # the 53-seed table's own
    assert fp["seeds"] == 53 and [s["yardstick"] for s in fp["yardsticks"]] == [
        "sa_grpo",
        "bn_grpo",
    ]
    assert "seeds it needs" in res.stdout
    missing = subprocess.run(
        [sys.executable, str(script), "--proxy", str(tmp_path / "none.json"), "--json", str(out)],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "--proxy" in missing.stderr
    bad = subprocess.run(
        [sys.executable, str(script), "--draws", "5"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "--draws" in bad.stderr


def test_a_faithful_proxy_keeps_the_papers_proportions_on_its_yardstick():
    table = [
        {"mechanism": "sa_grpo", "diff": -0.02, "diff_interval": [-0.03, -0.01], "diff_sd": 0.02},
        {"mechanism": "vm_av_grpo", "diff": 0.0, "diff_interval": [-0.01, 0.01], "diff_sd": 0.02},
        {"mechanism": "dace_grpo", "diff": 0.001, "diff_interval": [-0.01, 0.01], "diff_sd": 0.01},
        {"mechanism": "grpo"},  # the reference row has no difference
    ]
    gains = {"sa_grpo": -10.0, "vm_av_grpo": 2.0, "dace_grpo": 2.0, "fa_grpo": 1.0}
    got = pr.faithful_proxy(table, gains, "sa_grpo")
    rows = got["rows"]
    assert got["scale_per_pp"] == pytest.approx(0.002) and set(rows) == {
        "sa_grpo",
        "vm_av_grpo",
        "dace_grpo",
    }
    assert rows["sa_grpo"]["faithful"] == pytest.approx(-0.02)
    assert rows["vm_av_grpo"]["faithful"] == pytest.approx(0.004)
    # the same gain needs more seeds where the proxy's paired noise is larger
    assert (
        rows["vm_av_grpo"]["seeds_to_resolve_faithful"]
        > rows["dace_grpo"]["seeds_to_resolve_faithful"]
    )
