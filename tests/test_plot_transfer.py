"""``benchmarks/plot_transfer.py`` pairs each mechanism with the GRPO runs of its own rows file, on
the seeds asked for, and refuses rows of different protocols."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HASH = "sha256:" + "1" * 64


def _rows(path: Path, overall: dict[str, list[float]], protocol_hash: str = HASH) -> None:
    lines = [
        json.dumps(
            {
                "variant": "v",
                "mechanism": mech,
                "seed": seed,
                "overall": value,
                "protocol_hash": protocol_hash,
                "device": "cpu",
            }
        )
        for mech, values in overall.items()
        for seed, value in enumerate(values)
    ]
    path.write_text("\n".join(lines) + '\n{"cut off by a kill\n')


def _plot(monkeypatch, capsys, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """The script's ``main`` in this process (one matplotlib import for every call): its exit code,
    stdout and stderr."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import plot_transfer

    argv = ["plot_transfer.py", "--variant", "v", "--figure", str(tmp_path / "f.png"), *args]
    monkeypatch.setattr(sys, "argv", argv)
    try:
        plot_transfer.main()
        code = 0
    except SystemExit as exc:
        code, msg = 1, str(exc)
        print(msg, file=sys.stderr)
    out, err = capsys.readouterr()
    return code, out, err


def test_plot_transfer_pairs_within_each_file_and_refuses_mixed_protocols(
    monkeypatch, capsys, tmp_path
):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    # file a: its own GRPO; "up" is +0.02 above it at every seed, "flat" straddles it
    _rows(a, {"grpo": [0.50, 0.52, 0.48], "up": [0.52, 0.54, 0.50], "flat": [0.51, 0.51, 0.49]})
    # file b: another GRPO (0.1 higher): "same" equals it, so it is paired with b's GRPO, not a's
    _rows(b, {"grpo": [0.60, 0.62, 0.58], "same": [0.60, 0.62, 0.58], "short": [0.7, 0.7]})
    code, out, err = _plot(
        monkeypatch,
        capsys,
        tmp_path,
        "--seeds",
        "3",
        f"first={a}",
        f"second={b}",
        "--name",
        "up=a raise",
    )
    assert code == 0, err
    assert "| first | up | +0.020 | [+0.020, +0.020] | above | 3 |" in out
    assert "| first | flat | +0.003 |" in out and "| within | 3 |" in out
    assert "| second | same | +0.000 |" in out
    assert "(left out of second: short, 2 of 3 seeds)" in out
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    # --only keeps the named mechanisms of one group
    code, out, err = _plot(
        monkeypatch, capsys, tmp_path, "--seeds", "3", f"first={a}", "--only", "first:up"
    )
    assert code == 0 and "| first | up |" in out and "flat" not in out
    # rows of another protocol are refused, not drawn beside these
    _rows(b, {"grpo": [0.6, 0.6, 0.6]}, protocol_hash="sha256:" + "2" * 64)
    code, out, err = _plot(
        monkeypatch, capsys, tmp_path, "--seeds", "3", f"first={a}", f"second={b}"
    )
    assert code == 1 and "different protocols" in err
    # GRPO short of the seeds asked for, and too few seeds for an interval: clear errors
    code, out, err = _plot(monkeypatch, capsys, tmp_path, "--seeds", "4", f"first={a}")
    assert code == 1 and "GRPO has 3 of the 4 seeds" in err
    code, out, err = _plot(monkeypatch, capsys, tmp_path, "--seeds", "1", f"first={a}")
    assert code == 1 and "at least 2" in err
