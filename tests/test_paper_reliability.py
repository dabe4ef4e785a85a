"""The paper-reliability benchmark: its transcription of the paper's tables, the split-half
reliability on data of known reliability, and the ceiling's behaviour at the limits."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import random
import re
import statistics
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
        weighted = sum(pr.WEIGHTS[b] * r[b] for b in pr.BENCHMARKS)  # the weights sum to 1
        assert weighted == pytest.approx(r["overall"], abs=0.07), r
    names = {r["algorithm"]: r["overall"] for r in reversed(rows)}
    assert {m: names[pr.TABLE_NAME[m]] for m in PAPER_OVERALL} == PAPER_OVERALL


PAPER_TEX = ROOT.parent / "shared" / "paper" / "poise-paper.tex"
PAPER_SHA256 = "39680424ebae5048215f22a7f0d7d48c6afa71c25da96f6fc7de1f4ac2f7e480"


def _tex_rows(tex: str, label: str) -> list[tuple[str, list[str]]]:
    """(name, cells) of the table labelled ``label``: its value cells as printed."""
    at = tex.index("\\label{" + label + "}")
    body = tex[tex.rfind("\\begin{tabular*}", 0, at) : at]
    body = body[body.index("\\midrule") : body.index("\\end{tabular*}")]
    rows = []
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().rstrip("\\").split("&")]
        if len(cells) < 2 or "multicolumn" in line:
            continue
        rows.append((cells[0], [re.match(r"(?:\\score\{)?([\d.]+)", c)[1] for c in cells[1:]]))
    return rows


@pytest.mark.skipif(not PAPER_TEX.is_file(), reason="the paper's source is not beside the project")
def test_every_cell_is_the_papers_as_printed():
    """Against the paper's LaTeX source, where it is beside the project (the file PROVENANCE.md
    names): every row, name and cell of both tables."""
    tex = PAPER_TEX.read_bytes()
    if hashlib.sha256(tex).hexdigest() != PAPER_SHA256:
        pytest.skip("another version of the paper's source")
    with pr.DATA.open(newline="") as f:
        got = [(r["table"], r["algorithm"], r) for r in csv.DictReader(f)]
    text = tex.decode()
    main = _tex_rows(text, "tab:experiment:all_results")
    comp = _tex_rows(text, "tab:compression_compact")
    assert [(t, n) for t, n, _ in got] == [("main", n) for n, _ in main] + [
        ("compression", n) for n, _ in comp
    ]
    cols = {
        "main": (*pr.BENCHMARKS, "overall"),
        "compression": (
            "aime24",
            "aime25",
            "amc",
            "math",
            "overall",
            "mean_length",
            "length_ratio",
        ),
    }
    for (table, name, row), (_, cells) in zip(got, main + comp):
        assert [row[c] for c in cols[table]] == cells, (table, name)


def _synthetic(n: int, noise: dict[str, float], seed: int) -> list[dict]:
    """Variants with a true score of SD 1 shared by the six benchmarks, and independent noise of SD
    ``noise[b]`` on benchmark b."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        t = rng.gauss(0, 1)
        rows.append({b: t + rng.gauss(0, noise[b]) for b in pr.BENCHMARKS})
    return rows


def test_split_half_recovers_the_reliability_of_halves_of_unequal_noise():
    """Noise like the paper's (the AIMEs' far larger than MATH's): Overall's reliability is
    1 / (1 + sum_b w_b^2 sd_b^2); Flanagan-Rulon's split-half reads it (to the 0.4% its unequal
    half weights take off), where Spearman-Brown's, which assumes parallel halves, reads high."""
    sds = dict(zip(pr.BENCHMARKS, (5.9, 5.6, 3.2, 1.6, 1.6, 1.4)))
    noise = {b: 0.574 * sd for b, sd in sds.items()}
    expected = 1 / (1 + sum(pr.WEIGHTS[b] ** 2 * noise[b] ** 2 for b in pr.BENCHMARKS))
    got = [pr.split_half_reliability(_synthetic(3000, noise, seed)) for seed in range(4)]
    assert all(len(g["splits"]) == 10 for g in got)
    assert statistics.fmean(g["reliability"] for g in got) == pytest.approx(expected, abs=0.025)
    assert statistics.fmean(g["spearman_brown"] for g in got) > expected + 0.03
    exact = pr.split_half_reliability(_synthetic(50, dict.fromkeys(pr.BENCHMARKS, 0.0), 0))
    assert exact["reliability"] == pytest.approx(1.0, abs=0.005)


def test_the_posterior_shrinks_by_the_reliability_and_the_draws_follow_it():
    observed = {"grpo": 47.0, "vm_av_grpo": 51.0, "sa_grpo": 34.5}
    post = pr.posterior(observed, {"sa_grpo"}, 47.0, true_var=3.0, noise_sd=1.0)
    k = 3.0 / 4.0
    assert post["vm_av_grpo"] == pytest.approx((47.0 + k * 4.0, math.sqrt(k)))
    assert post["grpo"] == pytest.approx((47.0, math.sqrt(k)))
    assert post["sa_grpo"] == (34.5, 1.0)  # a flat prior: no shrinkage
    got = pr.rank_ceiling(observed, post, draws=20000)
    # the difference of two independent normals: mean k * 4, SD sqrt(2 k)
    assert got["mean_true_gain"]["vm_av_grpo"] == pytest.approx(k * 4.0, abs=0.03)
    z = k * 4.0 / math.sqrt(2 * k)
    assert got["p_above_grpo"]["vm_av_grpo"] == pytest.approx(
        statistics.NormalDist().cdf(z), abs=0.01
    )


def test_the_ceiling_is_exact_without_noise_and_falls_with_it():
    observed = dict(PAPER_OVERALL)
    collapsed = {m for m, v in observed.items() if v < 40}

    def ceiling(true_var, noise_sd, **kw):
        post = pr.posterior(observed, collapsed, 47.0, true_var, noise_sd)
        return pr.rank_ceiling(observed, post, draws=kw.pop("draws", 2000), **kw)

    exact = ceiling(4.0, 0.0, draws=200)
    assert exact["spearman_mean"] == pytest.approx(1.0)
    assert exact["p_above_grpo"] == {
        m: float(v > observed["grpo"]) for m, v in observed.items() if m != "grpo"
    }
    noisy = [ceiling(2.0, sd) for sd in (1.0, 2.0)]
    assert 1.0 > noisy[0]["spearman_mean"] > noisy[1]["spearman_mean"]
    assert noisy[0]["p_above_grpo"]["vm_av_grpo"] > noisy[1]["p_above_grpo"]["vm_av_grpo"] > 0.5
    # a mechanism tied to GRPO is never truly above it, and the expected count drops by one at most
    tied = ceiling(2.0, 1.0, tie=("av_grpo", "grpo"))
    assert tied["p_above_grpo"]["av_grpo"] == 0.0
    assert 0 < noisy[0]["expected_improvers_above"] - tied["expected_improvers_above"] <= 1
    # a faithful proxy without noise ranks as the true values do; with noise it ranks worse
    measured = {m: (v - observed["grpo"]) / 500 for m, v in observed.items()}
    faithful = [
        ceiling(
            2.0,
            1.0,
            seed=3,
            proxy={
                "yardstick": "sa_grpo",
                "measured": measured,
                "se": dict.fromkeys(observed, se),
                "rho": 0.5,
            },
        )
        for se in (0.0, 0.02)
    ]
    # (on the same draws of the true values: a faithful proxy's ranking is theirs)
    assert faithful[0]["faithful_proxy"]["spearman_mean"] == pytest.approx(
        faithful[0]["spearman_mean"]
    )
    assert faithful[1]["faithful_proxy"]["spearman_mean"] < faithful[1]["spearman_mean"] - 0.1
    assert faithful[1]["faithful_proxy"]["share_at_or_below_measured"] > 0


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
    # the figures docs/calibration.md quotes
    assert data["split_half"]["reliability"] == pytest.approx(0.438, abs=0.0005)
    assert data["split_half"]["spearman_brown"] == pytest.approx(0.501, abs=0.0005)
    assert data["benchmark_noise_sd"] == pytest.approx(1.64, abs=0.005)
    assert data["training_sd_room"] == pytest.approx(1.45, abs=0.005)
    assert data["gain_without_aime25"]["msa_grpo"]["gain_without_aime25"] == pytest.approx(
        -0.5, abs=0.05
    )
    assert data["collapsed"] == ["dcbe_grpo", "sa_grpo"]
    assert [c["training_sd"] for c in data["ceiling"]] == [
        sd for sd in pr.TRAINING_SDS if sd < data["training_sd_room"]
    ]
    assert "a perfect proxy's Spearman" in res.stdout and "| vm_av_grpo |" in res.stdout
    # beside the recorded 53-seed calibration, on both yardsticks
    fp = data["faithful_proxy"]
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the figure alone, from the JSON
    again = tmp_path / "g.png"
    plot = ROOT / "benchmarks" / "plot_paper_reliability.py"
    subprocess.run(
        [sys.executable, str(plot), "--json", str(out), "--figure", str(again)], check=True
    )
    assert again.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert fp["spearman"] == pytest.approx(0.518, abs=0.001)  # the 53-seed table's own
    assert fp["seeds"] == 53 and [s["yardstick"] for s in fp["yardsticks"]] == [
        "sa_grpo",
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
    grpo_out = subprocess.run(
        [sys.executable, str(script), "--collapse-below", "48", "--json", str(out)],
        capture_output=True,
        text=True,
    )
    assert grpo_out.returncode == 2 and "GRPO (47.8) as collapsed" in grpo_out.stderr
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
    got = pr.faithful_proxy(table, gains, "sa_grpo", "printed gains")
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
