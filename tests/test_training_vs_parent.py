"""``benchmarks/training_vs_parent.py`` reads each child of a finished search the way its reflection
does: the kind of change it made (from its code), its paired gain, and whether its training changed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from results_util import per_seed_rows, record

from engine.archive.store import Archive

ROOT = Path(__file__).resolve().parents[1]
SERIES = ("train/entropy", "train/kl", "train/response_length", "train/valid_rate")


def _result(overall: list[float], entropy: list[float]) -> dict:
    """Results over len(overall) paired seeds whose per-seed tails differ only in entropy."""
    traj = {"step": [0, 1, 2], **{k: [0.5, 0.4, 0.3] for k in SERIES}}
    rest = {"train/kl": 0.01, "train/response_length": 20.0, "train/valid_rate": 0.9}
    per_seed = per_seed_rows(overall, [{"train/entropy": e, **rest} for e in entropy])
    mean = sum(overall) / len(overall)
    return {
        "status": "evaluated",
        "metrics": {"overall": mean},
        "intervals": {"overall": [mean - 0.02, mean + 0.02]},
        "trajectory": traj,
        "seeds": list(range(len(overall))),
        "per_seed": per_seed,
    }


def test_children_are_read_by_kind_of_change_and_what_their_training_did(
    tmp_path, monkeypatch, capsys
):
    work = tmp_path / "work"
    arch = Archive.init(work / "loop-s0")
    (work / "loop-s0.json").write_text("{}")  # what bench_discovery writes beside a finished search
    record(arch, "grpo", _result([0.50, 0.51, 0.49, 0.50], [0.20, 0.22, 0.21, 0.20]))
    root = arch.algorithm("grpo")
    assert "kl_coef: float = 0.001" in root
    arch.spawn(
        "grpo", "anchored", algorithm=root.replace("kl_coef: float = 0.001", "kl_coef: float = 0.1")
    )
    # a stronger anchor: more entropy at every seed (x1.5) and a gain at every seed
    record(arch, "anchored", _result([0.53, 0.54, 0.52, 0.535], [0.30, 0.33, 0.315, 0.30]))
    arch.spawn("grpo", "same")  # no change at all: trains like its parent, its gain is noise
    record(arch, "same", _result([0.52, 0.49, 0.50, 0.48], [0.201, 0.219, 0.211, 0.20]))
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import training_vs_parent

    out = tmp_path / "t.json"
    fig = tmp_path / "t.png"
    argv = [
        "training_vs_parent.py",
        "--workdir",
        str(work),
        "--json",
        str(out),
        "--figure",
        str(fig),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    training_vs_parent.main()
    text = capsys.readouterr().out
    assert "KL weight up" in text and "kept more entropy" in text
    data = json.loads(out.read_text())
    rows = {r["node"]: r for r in data["children"]}
    assert set(rows) == {"anchored", "same"}
    a, s = rows["anchored"], rows["same"]
    assert (a["kind"], a["reading"], a["training"]) == (
        "KL weight up",
        "finding",
        "kept more entropy",
    )
    assert a["gain_interval"][0] > 0 and a["seeds"] == 4
    assert s["kind"].startswith("retune") and s["reading"] == "like its parent"
    assert s["gain_interval"][0] < 0 < s["gain_interval"][1]
    by_reading = {t["reading"]: t for t in data["by_reading"]}
    assert (
        by_reading["finding"]["above_parent"] == 1
        and by_reading["like its parent"]["children"] == 1
    )
    assert data["protocol"] == "proxy/default" and data["unit"].startswith("utility")
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
