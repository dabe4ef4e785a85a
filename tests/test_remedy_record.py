"""``benchmarks/remedy_record.py`` reads where a finished search's diagnosis sent its candidates: the
candidates that applied each remedy, each remedy's trials judged on the entropy, the candidate from
which a remedy was spent, and the candidates with a strong KL anchor."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from results_util import collapsing_root, remedied_child

from engine.archive.store import Archive

ROOT = Path(__file__).resolve().parents[1]


def _why(knob: str, move: str) -> str:
    return f"Offline search from grpo: mutate {knob} (against its entropy collapse: {move})."


def test_the_record_says_where_the_diagnosis_sent_the_candidates(tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    arch = Archive.init(work / "loop-s0")
    (work / "loop-s0.json").write_text("{}")  # what bench_discovery writes beside a finished search
    collapsing_root(arch)
    bonus = _why("entropy_coef", "entropy")
    remedied_child(arch, "bonus-a", 1.01, bonus, entropy_coef=0.004)
    remedied_child(arch, "bonus-b", 0.99, bonus, entropy_coef=0.008)
    # created once both bonuses had results: the rule had spent the bonus by then
    remedied_child(arch, "anchored", 1.5, _why("kl_coef", "kl"), kl_coef=0.05)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import remedy_record

    out = tmp_path / "r.json"
    argv = ["remedy_record.py", "--workdir", str(work), "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    remedy_record.main()
    text = capsys.readouterr().out
    assert "| 0 | entropy | 2 | 0 / 2 / 0 / 0 | 3 |" in text
    assert "| 0 | kl | 1 | 1 / 0 / 0 / 0 | — |" in text
    assert "1 of 3 candidates carry a KL anchor >= 0.01" in text
    (search,) = json.loads(out.read_text())["searches"]
    assert search["applied"] == {"kl": 1, "entropy_control": 0, "entropy": 2, "clip_higher": 0}
    assert search["spent_from"] == {
        "kl": None,
        "entropy_control": None,
        "entropy": 3,
        "clip_higher": None,
    }
    assert search["verdicts"]["kl"] == {"up": 1}
