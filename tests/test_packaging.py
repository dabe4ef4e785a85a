"""Packaging: what a plain `pip install .` brings is enough to spawn and verify (pytest is a runtime
dependency: verification runs each candidate's generated pytest suite)."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import tomllib

import pytest
from conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _closure(roots: list[str]) -> set[str]:
    """Installed distributions reachable from ``roots`` through their unconditional requirements."""
    seen, todo = set(), list(roots)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        try:
            reqs = md.requires(n) or []
        except md.PackageNotFoundError:
            continue
        todo += [_name(r) for r in reqs if "extra ==" not in r]
    return seen


def test_pytest_is_a_runtime_dependency():
    runtime = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    dev = {_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["dev"]}
    assert "pytest" in runtime and "pytest" not in dev
    assert PYPROJECT["project"]["scripts"]["poise-git"] == "engine.cli:main"


SITECUSTOMIZE = """
import atexit, importlib.abc, json, os, sys
BLOCKED = set(json.loads(os.environ["POISE_TEST_BLOCKED"]))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} belongs to the dev extra")
        return None
sys.meta_path.insert(0, Block())
def dump():
    with open(os.environ["POISE_TEST_IMPORTS"], "a") as f:
        f.write("\\n".join(sorted({m.split(".")[0] for m in sys.modules})) + "\\n")
atexit.register(dump)
"""


@pytest.mark.slow  # several CLI processes / a sandboxed verification: seconds of CPU each
def test_verification_needs_nothing_from_the_dev_extra(archive, tmp_path):
    """Verify the root with every installed module that does not come with the runtime
    dependencies made unimportable (the dev extra's pytest-timeout and ruff, verl's extras...), as
    in a fresh `pip install .`: verification still passes, and really ran pytest."""
    runtime = [_name(r) for r in PYPROJECT["project"]["dependencies"]]
    allowed = _closure(runtime)
    dists = md.packages_distributions()
    ours = ("engine", "trainer_template", "evaluators")
    blocked = sorted(
        mod for mod, ds in dists.items() if mod not in ours and not {_name(d) for d in ds} & allowed
    )
    assert "pytest_timeout" in blocked and "ruff" in blocked and "pytest" not in blocked
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "imports.txt"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(site), str(REPO)]),
        POISE_TEST_BLOCKED=json.dumps(blocked),
        POISE_TEST_IMPORTS=str(log),
        # the suite runs in a sandboxed child, whose environment is an allowlist and which sees no
        # tmp_path under bubblewrap: the weak mode, with these three variables passed on
        POISE_SANDBOX="none",
        POISE_SANDBOX_ENV="PYTHONPATH,POISE_TEST_BLOCKED,POISE_TEST_IMPORTS",
    )
    p = subprocess.run(
        [sys.executable, "-m", "engine", "verify", "grpo", "-C", str(archive.path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0 and "verified" in p.stdout, p.stdout + p.stderr
    imported = set(log.read_text().split())
    assert {"pytest", "_pytest", "torch"} <= imported  # the suite really ran under pytest
    assert not imported & set(blocked)
