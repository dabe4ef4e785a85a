"""The recorded protocol-sweep results are what their rows give: every table in
``benchmarks/results/*.json`` that has a ``.rows.jsonl`` beside it (the seed runs, each naming its
machine) is recomputed from those rows, so a figure in docs/calibration.md can be traced to the runs
that measured it and a hand-edited or stale table fails here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SWEEPS = sorted(p for p in RESULTS.glob("*.json") if p.with_suffix(".rows.jsonl").is_file())


def _same(a, b) -> bool:
    """Equal, numbers to 1e-12 (a JSON round trip), NaN equal to NaN, lists and dicts item by item."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, rel=1e-12, abs=1e-12, nan_ok=True)
    return a == b


def test_there_are_recorded_sweeps():
    assert {p.stem for p in SWEEPS} >= {"calibration-17seeds", "protocol-sweep", "task-sweep"}


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_recorded_sweep_table_is_the_summary_of_its_rows(sweep, path):
    data = json.loads(path.read_text())
    rows = sweep.read_rows(path.with_suffix(".rows.jsonl"))
    seeds = data["args"]["seeds"]
    for name, recorded in data["variants"].items():
        mechs = [r["mechanism"] for r in recorded["table"]]
        mine = [r for r in rows if r["variant"] == name and r["seed"] < seeds]
        assert mine, f"{path.name}: no rows for variant {name!r}"
        # the score the table compares (the protocol's Overall unless recorded otherwise)
        got = sweep.summarize(sweep.rescore(mine, data["args"].get("score", "overall")), mechs)
        for key, value in got.items():
            assert _same(recorded[key], value), (path.name, name, key)
        # every seed run names the machine that measured it
        assert all(r.get("machine", {}).get("cpu") for r in mine), (path.name, name)
        # the table's protocol is the one its rows were measured under (where they record it)
        assert {r.get("protocol_hash", recorded["protocol_hash"]) for r in mine} == {
            recorded["protocol_hash"]
        }, (path.name, name)


def test_the_gpu_calibration_records_the_cuda_protocol_it_ran_under(sweep):
    from trainer_template.proxy.protocol import get_protocol

    data = json.loads((RESULTS / "calibration-large-gpu.json").read_text())
    rows = sweep.read_rows(RESULTS / "calibration-large-gpu.rows.jsonl")
    cuda = get_protocol("large").hash("cuda")
    assert data["protocol_hash"] == data["variants"]["large-gpu"]["protocol_hash"] == cuda
    assert {(r["device"], r["protocol_hash"]) for r in rows} == {("cuda", cuda)}
    assert data["args"]["seeds"] == 15 and len(data["variants"]["large-gpu"]["table"]) == 11


def test_the_rl_budget_figure_is_drawn_from_the_recorded_rows(tmp_path):
    import subprocess

    rows = [RESULTS / "rl-budget.rows.jsonl", RESULTS / "calibration-17seeds.rows.jsonl"]
    out = tmp_path / "budget.png"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "plot_rl_budget.py")]
    cmd += [a for r in rows for a in ("--rows", str(r))]
    cmd += ["--variants", "s40,d", "--seeds", "17", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"
    grpo40 = [
        r["overall"]
        for r in (json.loads(x) for x in rows[0].read_text().splitlines())
        if r["variant"] == "s40" and r["mechanism"] == "grpo" and r["seed"] < 17
    ]
    assert len(grpo40) == 17
    assert f"| 40 | {sum(grpo40) / 17:.3f} |" in res.stdout
    assert "| vm_av_grpo | +0.011 [+0.004, +0.018] |" in res.stdout  # the 17-seed 40-step row
    bad = subprocess.run(
        [*cmd[:2], "--rows", str(rows[0]), "--variants", "nope", "--out", str(tmp_path / "x.png")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "no finished rows of variants nope" in bad.stderr
