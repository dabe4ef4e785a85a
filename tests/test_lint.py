"""The project's own style gate: `ruff check` and `ruff format --check` (settings in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    exe = Path(sys.executable).with_name("ruff")
    if exe.is_file():
        return [str(exe)]
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.skip("ruff is not installed (it comes with the dev extra)")


@pytest.mark.parametrize("args", [["check", "--no-cache"], ["format", "--check", "--no-cache"]])
def test_ruff(args):
    proc = subprocess.run([*_ruff(), *args, "."], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
