"""How the engine picks the OS boundary (issue 61): never the weak mode without an explicit opt-in,
and a child that imports what the engine imports, wherever the engine's import path puts it."""

from __future__ import annotations

import os

import pytest
from conftest import require_boundary

from engine.sandbox import boundary
from engine.sandbox.limits import Limits
from engine.sandbox.runner import run_sandboxed


@pytest.fixture
def no_bwrap(monkeypatch, tmp_path):
    """A machine without bubblewrap: nothing named bwrap on PATH."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(boundary.ENV_MODE, raising=False)
    boundary._bwrap.cache_clear()
    yield
    boundary._bwrap.cache_clear()


def test_without_bubblewrap_candidate_code_is_refused_unless_the_weak_mode_is_chosen(
    no_bwrap, monkeypatch
):
    """Before, ``auto`` fell back to the weak mode with a warning in a log the user may not see."""
    with pytest.raises(boundary.SandboxUnavailable) as exc:
        boundary.resolve()
    msg = str(exc.value)
    assert "\n" not in msg
    assert "apt-get install bubblewrap" in msg and "POISE_SANDBOX=none" in msg
    with pytest.raises(boundary.SandboxUnavailable):  # nothing is started
        run_sandboxed("engine.sandbox.exec_source", ["{input}/x.py"], limits=Limits(wall_s=5))
    monkeypatch.setenv(boundary.ENV_MODE, "none")  # the explicit opt-in keeps the weak mode
    b = boundary.resolve()
    assert b.kind == "rlimits" and not b.isolated


def test_bwrap_required_says_how_to_install_it(no_bwrap):
    with pytest.raises(boundary.SandboxUnavailable, match="apt-get install bubblewrap"):
        boundary.resolve("bwrap")


PROBE = (
    "import poise_extra_probe\n"
    "assert poise_extra_probe.VALUE == 61\n"
    "print('imported', poise_extra_probe.__file__)\n"
)


def test_a_package_on_the_engines_pythonpath_is_importable_in_the_sandbox(tmp_path, monkeypatch):
    """A PYTHONPATH install (torch outside site-packages, say) was neither bound nor on the child's
    path: every verification failed with ModuleNotFoundError inside the sandbox."""
    require_boundary()
    extra = tmp_path / "pylibs"
    extra.mkdir()
    (extra / "poise_extra_probe.py").write_text("VALUE = 61\n")
    monkeypatch.syspath_prepend(str(extra))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(extra), os.environ.get("PYTHONPATH", "")])
    )
    assert str(extra) in boundary.readonly_paths()
    res = run_sandboxed(
        "engine.sandbox.exec_source",
        ["{input}/probe.py"],
        limits=Limits(wall_s=30, memory_mb=512),
        inputs={"probe.py": PROBE.encode()},
    )
    assert res.ok, res.reason()
    assert f"imported {extra}/poise_extra_probe.py" in res.output_tail


def test_the_import_path_never_shows_the_working_directory_home_or_the_project(
    tmp_path, monkeypatch
):
    home, cwd = tmp_path / "home", tmp_path / "archive"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    for p in (str(cwd), str(home), "/", str(boundary.PROJECT), str(boundary.PROJECT / "tests")):
        monkeypatch.syspath_prepend(p)
    shown = boundary.import_path()
    for p in (str(cwd), str(home), "/", str(tmp_path)):
        assert p not in shown
    assert not any(
        p == str(boundary.PROJECT) or p.startswith(f"{boundary.PROJECT}/") for p in shown
    )
