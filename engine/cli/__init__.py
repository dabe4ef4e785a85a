"""``poise-git``: a thin typer + rich layer over the engine library (the library never imports this).

Each ``*_cmds`` module registers its verbs on :data:`app`; heavy imports (torch, mlflow) stay inside
the commands so ``poise-git log`` starts instantly.

Exit codes (stable; README "Exit codes"): 0 success, 1 error (bad input, unknown node, failed
endpoint...), 2 usage error (unknown option, missing argument), 3 the candidate was rejected
(verification or screening), 4 the candidate failed its evaluation, 130 interrupted (Ctrl-C, SIGINT),
143 stopped by SIGTERM (129 by SIGHUP): 128 + the signal's number, as a shell reports a process the
signal killed.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import shlex
import signal
import sys

import typer
from rich.console import Console
from rich.markup import escape
from rich.segment import Segment
from typer.core import TyperCommand, TyperGroup

from engine import __version__
from engine.archive.gitio import GitError
from engine.cli.help import EXAMPLES, ROOT_EPILOG
from engine.cli.logs import setup_logging
from engine.errors import PoiseError
from engine.secrets import ScrubbedStream
from engine.untrusted import visible

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_REJECTED = 3
EXIT_FAILED = 4
EXIT_INTERRUPTED = 130
"""SIGINT (Ctrl-C); another stopping signal exits 128 + its number (:func:`interrupted_code`)"""
EXIT_TERMINATED = 143
"""SIGTERM (``kill``, a scheduler's stop)"""

PIPE_WIDTH = 4096
"""columns of the rendering when stdout is not a terminal: tables keep their natural width, nothing a
user may copy (node names, paths, diffs) is cut or wrapped at 80 columns"""


def plain(value: object) -> str:
    """``value`` as text inside rich markup: a path, URI or file name may hold ``[...]``, which
    markup would read as a tag (dropped, or an error), so it is escaped."""
    return escape(str(value))


def shell_arg(value: object) -> str:
    """``value`` quoted for a command the user may copy (a path with spaces or ``[...]``), then
    escaped for markup."""
    return plain(shlex.quote(str(value)))


def _flags_without_type(params: list) -> list:
    """A flag takes no value: show no ``<bool>`` type in its help row (typer's rich panel would);
    nor does a counted one (``-v``, ``-vv``), which would read ``<int>`` and ``[default: 0]``."""
    for p in params:
        if getattr(p, "is_flag", False) and getattr(p, "metavar", "") is None:
            p.metavar = ""
        if getattr(p, "count", False):
            p.metavar = ""
            p.show_default = False
    return params


class _Command(TyperCommand):
    """A poise-git verb: flags rendered without a type; engine errors and Ctrl-C become one line on
    stderr and a documented exit code (also under typer's CliRunner)."""

    def get_params(self, ctx):
        return _flags_without_type(super().get_params(ctx))

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except PoiseError as exc:
            fail(str(exc))
        except GitError as exc:  # git itself failed (a corrupt repository, a full disk...)
            fail(f"git: {exc}")
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/]", highlight=False)
            raise typer.Exit(interrupted_code()) from None


class _Group(TyperGroup):
    def get_params(self, ctx):
        return _flags_without_type(super().get_params(ctx))


class VisibleConsole(Console):
    """The display boundary of archive text: a rich Console whose every rendered segment (node
    names, reasons, code, diffs, proposals, trailers, metric names, whatever their source, inside
    panels, tables, Markdown, live status lines and log records) reaches the terminal with its
    control characters made visible (:func:`engine.untrusted.visible`). rich's own control
    segments (a live display's cursor moves) and its styles pass as they are."""

    def render_str(self, text: str, **kwargs):
        # strings become visible before they are measured: a table's column fits the escapes
        return super().render_str(visible(text), **kwargs)

    def render(self, renderable, options=None):
        for seg in super().render(renderable, options):
            if seg.control or not seg.text:
                yield seg
            else:
                text = visible(seg.text)
                yield seg if text == seg.text else Segment(text, seg.style)


def visible_console(**kwargs) -> Console:
    """A rich Console that shows control characters as escapes (:class:`VisibleConsole`)."""
    return VisibleConsole(**kwargs)


app = typer.Typer(
    name="poise-git",
    cls=_Group,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
)
console = visible_console()
err_console = visible_console(stderr=True)

ArchiveOpt = typer.Option(
    ".", "--archive", "-C", help="The experiment repository (like `git -C`).", show_default=True
)


def fail(message: str, code: int = EXIT_ERROR) -> None:
    """Print ``error: message`` on stderr (one line, never wrapped, its text as written: a
    ``[select]`` in it is not markup) and exit with ``code``."""
    err_console.print(
        f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False, soft_wrap=True
    )
    raise typer.Exit(code)


def setup_output() -> None:
    """Render for the terminal when there is one; piped or redirected, render wide and unwrapped."""
    for c in (console, err_console):
        if not c.is_terminal:
            c.width = PIPE_WIDTH
            c.soft_wrap = True


def _version() -> str:
    try:
        # lazy: keeps `poise-git --help` fast
        from importlib.metadata import PackageNotFoundError, version

        return version("poise-git")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return __version__


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"poise-git {_version()}")
        raise typer.Exit(EXIT_OK)


@app.callback(epilog=ROOT_EPILOG)
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        "-V",
        help="Print the version and exit.",
        callback=_version_callback,
        is_eager=True,
    ),
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
    setup_output()
    setup_logging(verbose, err_console)


def _register() -> None:
    import engine.cli as pkg  # lazy: imports engine.cli itself, still loading at module level

    if app.registered_commands:
        return
    for mod in sorted(
        m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name.endswith("_cmds")
    ):
        importlib.import_module(f"engine.cli.{mod}").register(app)
    for info in app.registered_commands:
        name = info.name or info.callback.__name__.replace("_", "-")
        if info.cls in (None, TyperCommand):
            info.cls = _Command
        if info.help is None:
            info.help = _help_text(info.callback)
        if info.epilog is None and name in EXAMPLES:
            info.epilog = EXAMPLES[name]


def _help_text(fn) -> str:
    """The docstring with each paragraph on one line (rich mode would keep the source's breaks)."""
    doc = inspect.getdoc(fn) or ""
    return "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n") if p.strip())


_received: list[int] = []
"""the stopping signals this process received, first first"""


def interrupted_code() -> int:
    """The exit status of an interrupted command: 128 + the number of the first signal that stopped
    it (SIGINT 130, SIGTERM 143, SIGHUP 129), as a shell reports a process the signal killed, so
    that a scheduler's SIGTERM reads as one; 130 for a KeyboardInterrupt no signal raised."""
    return 128 + _received[0] if _received else EXIT_INTERRUPTED


def _interrupt(signum, _frame) -> None:
    """SIGINT / SIGTERM / SIGHUP: kill every sandboxed child first (they run in sessions of their own
    and never see the terminal's signal), then unwind so that nodes are left resumable."""
    from engine.sandbox.live import kill_all  # lazy: keeps `poise-git --help` fast

    _received.append(signum)
    kill_all()
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _stack_dumps() -> None:
    """SIGUSR1 writes every thread's Python stack to stderr and lets the command go on: where a
    long run is, or what a stuck one waits on (file, line and function names only, no values)."""
    import faulthandler  # lazy: keeps `poise-git --help` fast

    err = sys.__stderr__
    if err is not None and hasattr(signal, "SIGUSR1"):
        try:
            faulthandler.register(signal.SIGUSR1, file=err, all_threads=True)
        except (ValueError, OSError, AttributeError):  # stderr has no file descriptor
            pass


def main(argv: list[str] | None = None) -> None:
    sys.stdout, sys.stderr = ScrubbedStream(sys.stdout), ScrubbedStream(sys.stderr)
    _register()
    _received.clear()  # a command run in-process after another (the tests) starts afresh
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    _stack_dumps()
    try:
        app(args=argv, prog_name="poise-git", standalone_mode=True)
    except PoiseError as exc:  # raised outside a command (e.g. while parsing)
        err_console.print(
            f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True
        )
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        sys.exit(interrupted_code())
