"""The library logs through module loggers; ``poise-git -v`` shows those records on stderr (rich),
``-vv`` the debug ones too; without ``-v`` only warnings show and stdout never carries the log."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys

import pytest
from rich.console import Console

from engine.cli.logs import PACKAGES, QUIET, setup_logging


@pytest.fixture
def restore_loggers():
    names = (*PACKAGES, *QUIET)
    saved = {
        n: (
            logging.getLogger(n).level,
            list(logging.getLogger(n).handlers),
            logging.getLogger(n).propagate,
        )
        for n in names
    }
    yield
    for n, (level, handlers, propagate) in saved.items():
        logger = logging.getLogger(n)
        logger.setLevel(level)
        logger.handlers[:] = handlers
        logger.propagate = propagate


@pytest.mark.parametrize(
    ("verbosity", "shown", "hidden"),
    [
        (0, ["a warning"], ["an info", "a debug"]),
        (1, ["a warning", "an info"], ["a debug"]),
        (2, ["a warning", "an info", "a debug"], []),
    ],
)
def test_verbosity_sets_what_the_engine_shows(restore_loggers, verbosity, shown, hidden):
    out = io.StringIO()
    setup_logging(verbosity, Console(file=out, width=200))
    for pkg in PACKAGES:
        log = logging.getLogger(f"{pkg}.somewhere")
        log.warning("a warning from %s", pkg)
        log.info("an info from %s", pkg)
        log.debug("a debug from %s", pkg)
    text = out.getvalue()
    for pkg in PACKAGES:
        for what in shown:
            assert f"{what} from {pkg}" in text
        for what in hidden:
            assert f"{what} from {pkg}" not in text
    # MLflow announces every schema migration at INFO: quiet below -vvv
    assert logging.getLogger("mlflow").getEffectiveLevel() == logging.WARNING


@pytest.mark.parametrize(("verbosity", "level"), [(0, "WARNING"), (2, "WARNING"), (3, "DEBUG")])
def test_mlflow_imported_later_stays_quiet(restore_loggers, monkeypatch, verbosity, level):
    # importing mlflow resets its logger to $MLFLOW_LOGGING_LEVEL (INFO when unset), and the
    # commands import it after the logging is set up: the variable carries the level
    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "unset")
    monkeypatch.delenv("MLFLOW_LOGGING_LEVEL")
    setup_logging(verbosity, Console(file=io.StringIO()))
    assert os.environ["MLFLOW_LOGGING_LEVEL"] == level


def test_a_users_mlflow_logging_level_is_kept(restore_loggers, monkeypatch):
    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "ERROR")
    setup_logging(0, Console(file=io.StringIO()))
    assert os.environ["MLFLOW_LOGGING_LEVEL"] == "ERROR"


@pytest.mark.slow
def test_a_new_tracking_store_is_not_announced(tmp_path):
    # end to end, in a fresh process: set up as the CLI does, then import mlflow and create a
    # SQLite tracking store, which MLflow announces at INFO ("Creating initial MLflow database
    # tables...") unless the level reached it
    script = (
        "import sys\n"
        "from rich.console import Console\n"
        "from engine.cli.logs import setup_logging\n"
        "setup_logging(int(sys.argv[2]), Console(stderr=True))\n"
        "from mlflow.tracking import MlflowClient\n"
        "MlflowClient(tracking_uri=f'sqlite:///{sys.argv[1]}/mlflow.db').search_experiments()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_LOGGING_LEVEL"}
    for verbosity, announced in ((0, False), (3, True)):
        where = tmp_path / str(verbosity)
        where.mkdir()
        proc = subprocess.run(
            [sys.executable, "-c", script, str(where), str(verbosity)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=True,
        )
        assert ("Creating initial MLflow database tables" in proc.stderr) is announced, proc.stderr


def test_the_cli_logs_on_stderr_only_with_v(archive, tmp_path, cli):
    edit = tmp_path / "edit.py"
    edit.write_text("def helper_scale() -> float:\n    return 1.0\n")
    where = ("-C", str(archive.path))
    quiet = cli("spawn", "grpo", "--name", "a", "--edit", str(edit), "--no-verify", *where)
    assert quiet.returncode == 0, quiet.stderr
    assert "spawned a from grpo (" not in quiet.stderr + quiet.stdout
    edit.write_text("def helper_scale() -> float:\n    return 2.0\n")  # another mechanism
    loud = cli("-v", "spawn", "grpo", "--name", "b", "--edit", str(edit), "--no-verify", *where)
    assert loud.returncode == 0, loud.stderr
    assert "spawned b from grpo (" in loud.stderr and "spawned b from grpo (" not in loud.stdout
    # a record commit is a DEBUG record: -vv shows it, -v does not
    results = tmp_path / "r.json"
    results.write_text('{"overall": 0.5}')
    v = cli("-v", "record", "a", "--results", str(results), *where)
    assert v.returncode == 0, v.stderr
    assert "poise: results for a" not in v.stderr
    vv = cli("-vv", "record", "b", "--results", str(results), *where)
    assert vv.returncode == 0, vv.stderr
    assert "poise: results for b" in vv.stderr and "poise: results for b" not in vv.stdout


@pytest.mark.parametrize("terminal", [True, False])
def test_log_lines_are_not_padded_to_a_wide_console(restore_loggers, terminal):
    out = io.StringIO()
    setup_logging(0, Console(file=out, width=4096, force_terminal=terminal))
    logging.getLogger("engine.somewhere").warning("skipping an edit of %s", "grpo")
    lines = [ln for ln in out.getvalue().splitlines() if "skipping an edit of grpo" in ln]
    assert len(lines) == 1 and "WARNING" in lines[0]
    if not terminal:  # a file or a pipe: one plain line, no blanks up to 4,096 columns
        assert lines[0] == lines[0].rstrip() and len(lines[0]) < 80
