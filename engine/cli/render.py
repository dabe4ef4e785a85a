"""Output helpers shared by the verbs: framed sections on a terminal, plain text when piped.

Piped or redirected output (``| less``, ``> file``) is never cut to 80 columns: tables keep their
natural width (``engine.cli.PIPE_WIDTH``), text is written as is, and nothing is framed or wrapped.
"""

from __future__ import annotations

import sys

from rich.markdown import Markdown
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from engine.cli import console
from engine.untrusted import visible


def piped() -> bool:
    return not console.is_terminal


def raw(text: str) -> None:
    """Write ``text`` as written (no markup, emoji codes, highlighting or wrapping), its control
    characters made visible (:func:`engine.untrusted.visible`)."""
    text = visible(text)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def section(title: str, text: str, kind: str = "text") -> None:
    """A titled block: a panel on a terminal (``kind`` markdown | diff | text), plain when piped."""
    if piped():
        raw(f"== {title} ==")
        raw(text.rstrip("\n"))
        raw("")
        return
    if kind == "markdown":
        body = Markdown(text)
    elif kind == "diff":
        body = Syntax(text, "diff", theme="ansi_dark", word_wrap=True)
    else:
        body = Text(text)
    console.print(Panel(body, title=title))
