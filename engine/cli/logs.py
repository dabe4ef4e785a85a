"""The library's ``logging`` records on stderr, rendered with rich: ``-v`` shows the engine's INFO
records (what each operator does), ``-vv`` DEBUG (every git record, every loop event), ``-vvv`` also
the libraries' own (MLflow, Optuna...). Without ``-v`` only warnings and errors show.

The library only creates module loggers (``logging.getLogger(__name__)``); handlers are set here.
Redirected to a file or a pipe, records are plain lines (``[12:00:00] WARNING  message``): rich's
handler would pad each one with blanks to the console's width, which is wide there.
"""

from __future__ import annotations

import logging
import os

from rich.logging import RichHandler

from engine.untrusted import visible

PACKAGES = ("engine", "trainer_template", "evaluators")
"""the project's top-level packages: their loggers are the ones ``-v`` opens"""
QUIET = ("mlflow", "alembic", "optuna", "urllib3", "httpx", "git")
"""third-party loggers kept at WARNING below ``-vvv`` (MLflow announces every schema migration)"""


def level_for(verbosity: int) -> int:
    """WARNING with no ``-v``, INFO with one, DEBUG with two or more."""
    return (logging.WARNING, logging.INFO)[verbosity] if verbosity < 2 else logging.DEBUG


class _VisibleFormatter(logging.Formatter):
    """A record may quote archive text (a ref's name, a reason): its control characters are shown
    as escapes (:func:`engine.untrusted.visible`); on a terminal the console's hook does that."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))


def setup_logging(verbosity: int, console) -> logging.Handler:
    """Route the project's log records to the rich ``console`` (the CLI's stderr) at the level
    ``verbosity`` asks for; returns the handler (it replaces one an earlier call installed)."""
    level = level_for(verbosity)
    if console.is_terminal:
        handler = RichHandler(
            console=console,
            show_path=verbosity >= 2,
            markup=False,
            rich_tracebacks=False,
            log_time_format="[%X]",
        )
    else:
        handler = logging.StreamHandler(console.file)  # the stream of this invocation
        where = " %(name)s:%(lineno)d" if verbosity >= 2 else ""
        handler.setFormatter(
            _VisibleFormatter(f"[%(asctime)s] %(levelname)-8s %(message)s{where}", "%X")
        )
    handler.setLevel(level)
    handler.set_name(_NAME)
    for name in PACKAGES:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.handlers[:] = [h for h in logger.handlers if h.get_name() != _NAME] + [handler]
        logger.propagate = False  # one line per record, whatever the root logger does
    quiet = logging.DEBUG if verbosity >= 3 else logging.WARNING
    for name in QUIET:
        logging.getLogger(name).setLevel(quiet)
    # importing mlflow sets its logger to $MLFLOW_LOGGING_LEVEL (INFO when unset), whatever was set
    # above: the commands import it lazily, after this, and it would announce its schema migrations
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", logging.getLevelName(quiet))
    return handler


_NAME = "poise-cli"
