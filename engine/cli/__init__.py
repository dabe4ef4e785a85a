"""``poise-git``: a thin typer + rich layer over the engine library (the library never imports this).

Each ``*_cmds`` module registers its verbs on :data:`app`; heavy imports (torch, mlflow) stay inside
the commands so ``poise-git log`` starts instantly.
"""

from __future__ import annotations

import signal
import sys

import typer
from rich.console import Console

from engine.errors import PoiseError

app = typer.Typer(
    name="poise-git",
    help="poise-git: a git-native evolution engine for discovering RL (policy-optimization) algorithms for LLMs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
)
console = Console()
err_console = Console(stderr=True)

ArchiveOpt = typer.Option(
    ".", "--archive", "-C", help="The experiment repository (like `git -C`).", show_default=True
)


def _register() -> None:
    import importlib
    import pkgutil

    import engine.cli as pkg

    for mod in sorted(
        m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name.endswith("_cmds")
    ):
        importlib.import_module(f"engine.cli.{mod}").register(app)


def _interrupt(signum, _frame) -> None:
    """SIGINT / SIGTERM / SIGHUP: kill every sandboxed child first (they run in sessions of their own
    and never see the terminal's signal), then unwind so that nodes are left resumable."""
    from engine.sandbox.live import kill_all

    kill_all()
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> None:
    from engine.secrets import ScrubbedStream

    sys.stdout, sys.stderr = ScrubbedStream(sys.stdout), ScrubbedStream(sys.stderr)
    _register()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        app(args=argv, standalone_mode=True)
    except PoiseError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        sys.exit(130)
