"""Answer extraction and grading (math-verify, gold first). Minimal core; the evaluators issue extends it."""

from __future__ import annotations


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces; None if absent."""
    if not text:
        return None
    best = None
    for marker in ("\\boxed", "\\fbox"):
        start = text.rfind(marker)
        if start > (best[0] if best else -1):
            best = (start, marker)
    if best is None:
        return None
    i = best[0] + len(best[1])
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
        j += 1
    return None


def is_equivalent(gold: str, prediction: str) -> bool:
    """math-verify equivalence, gold first. Call from a process's main thread (it uses SIGALRM)."""
    from math_verify import parse, verify

    if prediction is None:
        return False
    g = parse(_wrap(gold))
    p = parse(_wrap(prediction))
    if not g or not p:
        return False
    return bool(verify(g, p))


def _wrap(s: str) -> str:
    s = str(s).strip()
    if s.startswith("$") or "\\boxed" in s:
        return s
    return f"${s}$"
