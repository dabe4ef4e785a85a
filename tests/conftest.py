"""Shared fixtures. tests/ is not a package (verl installs a top-level `tests` package)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def run_cli(
    *args: str,
    cwd: Path | None = None,
    env: dict | None = None,
    timeout: float = 600,
    input: str | None = None,
):
    """Run the real `poise-git` entry point (``python -m engine``) and return the CompletedProcess."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("COLUMNS", "200")
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "engine", *args],
        cwd=cwd or REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
    )


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def archive(tmp_path):
    from engine.archive.store import Archive

    return Archive.init(tmp_path / "exp")


def mark_verified(archive, name: str) -> None:
    """Record a passing verification.json for ``name``'s current algorithm.py without running it:
    what a candidate that behaves during verification (or a static-check miss) would get."""
    import hashlib
    import json

    src = archive.algorithm(name)
    rec = {"ok": True, "reason": "", "algorithm_sha256": hashlib.sha256(src.encode()).hexdigest()}
    archive.commit_files(
        name,
        {"verification.json": json.dumps(rec) + "\n"},
        subject=f"poise: {name} verified (test)",
        status="verified",
    )


def require_boundary():
    """The OS boundary (bubblewrap), or skip — except under CI (``$CI`` set), where its absence fails.

    Tests that run hostile code need it: in the weak mode such code can reach this very process."""
    from engine.sandbox import boundary

    b = boundary.resolve(os.environ.get("POISE_TEST_FORCE_MODE", "auto"))
    if not b.isolated and not os.environ.get("POISE_TEST_FORCE_MODE"):
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the boundary's tests under bubblewrap: {b.note}")
        pytest.skip(f"needs bubblewrap (ci/setup.sh installs it): {b.note}")
    return b
