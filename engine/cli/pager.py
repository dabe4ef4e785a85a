"""Paging like git: long or wide output on a terminal goes through a pager; piped output never does.

The pager is ``$POISE_PAGER``, else ``$PAGER``, else ``less`` (empty or ``cat``: no pager); ``LESS``
defaults to ``FRSX`` (quit when one screen is enough, keep colours, chop long lines so that wide
tables scroll sideways, leave the screen as it was), as git does with ``FRX``. ``--no-pager`` turns
it off for one command.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys

from rich.console import RenderableType
from rich.measure import Measurement

from engine.cli import PIPE_WIDTH, console, visible_console


def pager_command() -> str | None:
    for var in ("POISE_PAGER", "PAGER"):
        if var in os.environ:
            cmd = os.environ[var].strip()
            return None if cmd in ("", "cat") else cmd
    return "less" if shutil.which("less") else None


def natural_width(renderable: RenderableType) -> int:
    """The columns ``renderable`` needs without wrapping or folding anything."""
    opts = console.options.update(width=PIPE_WIDTH, max_width=PIPE_WIDTH)
    return Measurement.get(console, opts, renderable).maximum


def show(renderable: RenderableType, *, no_pager: bool = False) -> None:
    """Print ``renderable`` at its natural width (nothing folded or cut); on a terminal, page it
    when it is taller or wider than the screen."""
    width = max(console.width, natural_width(renderable))
    cmd = None if no_pager or not console.is_terminal else pager_command()
    if cmd is None:
        saved = console.width  # Console.print(width=) cannot exceed the console's own width
        console.width = width
        try:
            console.print(renderable)
        finally:
            console.width = saved
        return
    buf = io.StringIO()
    visible_console(
        file=buf,
        width=width,
        force_terminal=True,
        color_system=console.color_system,
        legacy_windows=False,
    ).print(renderable)
    text = buf.getvalue()
    if text.count("\n") < console.height - 1 and width <= console.width:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    env = dict(os.environ)
    env.setdefault("LESS", "FRSX")
    sys.stdout.flush()
    proc = subprocess.Popen(cmd, shell=True, stdin=subprocess.PIPE, env=env)
    try:
        assert proc.stdin is not None
        proc.stdin.write(text.encode("utf-8"))
        proc.stdin.close()
    except BrokenPipeError:  # the user quit the pager early
        pass
    proc.wait()
