"""Prompt sizes in tokens: tiktoken when it is installed and its encoding loads, else an estimate.

The estimate splits text the way GPT-style byte-pair tokenizers pre-split it (runs of letters, groups
of at most three digits, runs of other symbols, line breaks) and counts one token per piece, plus one
per further 6 letters of a long word and per further 3 symbols of a symbol run. It is a heuristic: its
error against a real tokenizer was not measured (no tokenizer files are available offline here);
``benchmarks/bench_prompt.py`` prints it next to the characters / 4 rule of thumb. With tiktoken
installed and its encoding cached (``TIKTOKEN_CACHE_DIR``) the real count is used.
``count_tokens(text) -> int``; ``method() -> str`` says which one is in use.
"""

from __future__ import annotations

import functools
import os
import re

_PIECES = re.compile(r"[A-Za-z]+|[0-9]{1,3}|[^\sA-Za-z0-9]+|\s+")
ENCODING = os.environ.get("POISE_TIKTOKEN_ENCODING", "o200k_base")


@functools.lru_cache(maxsize=1)
def _tiktoken():
    try:
        import tiktoken  # lazy: optional dependency (tiktoken is not installed here)

        return tiktoken.get_encoding(ENCODING)
    except Exception:  # noqa: BLE001 - not installed, or its encoding cannot be fetched offline
        return None


def estimate_tokens(text: str) -> int:
    """The piece-count estimate described in the module docstring."""
    n = 0
    for m in _PIECES.finditer(text):
        p = m.group()
        c = p[0]
        if c.isspace():
            n += 1 if "\n" in p or len(p) > 1 else 0  # a single space joins the next word's token
        elif c.isalpha():
            n += 1 + (len(p) - 1) // 6
        elif c.isdigit():
            n += 1
        else:
            n += 1 + (len(p) - 1) // 3
    return n


def count_tokens(text: str) -> int:
    enc = _tiktoken()
    return len(enc.encode(text)) if enc is not None else estimate_tokens(text)


def method() -> str:
    return (
        f"tiktoken {ENCODING}" if _tiktoken() is not None else "estimate (engine.operators.tokens)"
    )
