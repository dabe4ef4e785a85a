"""benchmarks/bench_select.py runs at a tiny size in process: every column and the target line are
printed, the JSON has one entry per size, and the layering agrees with the previous bitset one."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location(
        "bench_select", ROOT / "benchmarks" / "bench_select.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_select_prints_and_writes_every_size(tmp_path, capsys, monkeypatch):
    bench = _bench()
    monkeypatch.setattr(bench, "TARGET_NODES", 150)  # the target line judges a measured size
    out = tmp_path / "select.json"
    args = ["--sizes", "60", "150", "--repeat", "2", "--reference-max", "100"]
    bench.main([*args, "--json", str(out)])
    text = capsys.readouterr().out
    header, small, large, target = text.strip().splitlines()
    assert header.split() == [
        "nodes",
        "select_s",
        "median_s",
        "cpu_s",
        "layering_s",
        "gain_s",
        "features_s",
        "crowding_s",
        "layers",
        "x_first",
        "bitset_s",
        "bitset_x",
    ]
    assert small.split()[0] == "60" and small.split()[9] == "1.00"
    assert large.split()[0] == "150" and large.split()[-2:] == ["-", "-"]  # above --reference-max
    assert target.startswith("target: select <= 2 s at 150 nodes: ")
    assert " met (" in target or " MISSED (" in target
    data = json.loads(out.read_text())
    assert data["target"] == {"nodes": 150, "select_s": 2.0}
    rows = data["sizes"]
    assert [r["nodes"] for r in rows] == [60, 150]
    for r in rows:
        assert r["evaluated"] < r["nodes"] and r["layers"] >= 1 and len(r["chosen"]) == 3
        for key in (
            "select_s",
            "select_cpu_s",
            "layering_s",
            "descendant_gain_s",
            "features_s",
            "crowding_s",
        ):
            assert r[key] >= 0
    assert rows[0]["reference_layering_s"] > 0 and rows[0]["reference_ratio"] > 0
    assert rows[1]["reference_layering_s"] is None and rows[0]["ratio_vs_first"] == 1.0


def test_bitset_reference_and_the_layering_agree_on_the_synthetic_archive():
    bench = _bench()
    from engine.select.pareto import default_objectives, layers, objective_matrix

    nodes, _ = bench.synthetic(400)
    ms = [v.metrics for v in nodes.values() if v.evaluated]
    y = objective_matrix(ms, default_objectives(ms, "overall", 0.0))
    assert y.shape[1] == 7
    lay = layers(y)
    assert lay.max() > 3 and bench.bitset_layers(y).tolist() == lay.tolist()
