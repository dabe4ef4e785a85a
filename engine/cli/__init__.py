"""``poise-git``: a thin typer + rich layer over the engine library (the library never imports this).

Each ``*_cmds`` module registers its verbs on :data:`app`; heavy imports (torch, mlflow) stay inside
the commands so ``poise-git log`` starts instantly.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from engine.cli.logs import setup_logging
from engine.errors import PoiseError

app = typer.Typer(
    name="poise-git",
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


@app.callback()
def _root(
    verbose: int = typer.Option(
        0,
        "--verbose",
        "-v",
        count=True,
        help="Show the engine's log on stderr: -v what each step does, -vv every detail.",
    ),
) -> None:
    """poise-git: a git-native evolution engine for discovering RL (policy-optimization) algorithms
    for LLMs. Every candidate algorithm is a branch poise/NODE of an experiment repository."""
    setup_logging(verbose, err_console)


def _register() -> None:
    import importlib
    import pkgutil

    import engine.cli as pkg

    for mod in sorted(
        m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name.endswith("_cmds")
    ):
        importlib.import_module(f"engine.cli.{mod}").register(app)


def main(argv: list[str] | None = None) -> None:
    _register()
    try:
        app(args=argv, standalone_mode=True)
    except PoiseError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        sys.exit(130)
