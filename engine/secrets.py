"""Secret values (API keys) that must never reach git, MLflow, a file or the CLI's output.

The configured key variable (``[llm].api_key_env``, whatever its name) is registered when a config is
loaded or an LLM client is built; variables whose names look secret (``*API_KEY*``, ``*TOKEN*``,
``*SECRET*``, ``*PASSWORD*``, ``*CRED*``) are registered from the environment on first use, and so
is the password of any URI in the environment (``MLFLOW_TRACKING_URI=https://user:pass@host/``). Every
git object the archive writes, every MLflow param / tag and every text received from a sandboxed
child is scrubbed by value (:func:`scrub`), and no registered variable is passed to a child process.
"""

from __future__ import annotations

import os
import threading
import urllib.parse

REDACTED = "[redacted]"
MIN_LEN = 6
"""shorter values are not treated as secrets (they would redact ordinary words)"""
_PATTERNS = ("API_KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CRED", "PRIVATE_KEY")
_names: set[str] = set()
_values: set[str] = set()
_lock = threading.Lock()
_scanned = False


def looks_secret(name: str) -> bool:
    n = name.upper()
    return any(p in n for p in _PATTERNS) or n.startswith("AWS_")


def register_env(name: str | None) -> None:
    """Treat environment variable ``name`` as secret: never passed on, its value scrubbed."""
    if not name:
        return
    with _lock:
        _names.add(name)
        value = os.environ.get(name)
        if value and len(value) >= MIN_LEN:
            _values.add(value)


def register_value(value: str | None) -> None:
    if value and len(value) >= MIN_LEN:
        with _lock:
            _values.add(value)


def _uri_credentials(value: str) -> list[str]:
    """The password of a URI with one (``https://user:pass@host/``) and its ``user:pass``."""
    if "://" not in value:
        return []
    try:
        parts = urllib.parse.urlsplit(value)
    except ValueError:
        return []
    userinfo, at, _ = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return []
    return [userinfo, userinfo.partition(":")[2]]


def _scan() -> None:
    global _scanned
    if _scanned:
        return
    for name in list(os.environ):
        if looks_secret(name):
            register_env(name)
    _scanned = True


def names() -> set[str]:
    """Registered secret variable names and every environment name that looks secret (their
    current values are registered too)."""
    _scan()
    with _lock:
        registered = set(_names)
    found = {n for n in os.environ if looks_secret(n)} | registered
    for n in found:
        register_value(os.environ.get(n))
    for value in list(os.environ.values()):  # a tracking URI with a password, and the like
        for part in _uri_credentials(value):
            register_value(part)
    return found


def _current() -> list[str]:
    names()
    with _lock:
        return sorted(_values, key=len, reverse=True)


def scrub(text: str) -> str:
    """``text`` with every registered secret value replaced by ``[redacted]``."""
    if not text:
        return text
    for v in _current():
        if v in text:
            text = text.replace(v, REDACTED)
    return text


def scrub_bytes(data: bytes) -> bytes:
    if not data:
        return data
    for v in _current():
        b = v.encode("utf-8", "surrogateescape")
        if b in data:
            data = data.replace(b, REDACTED.encode())
    return data


class ScrubbedStream:
    """A text stream that scrubs every write (the CLI wraps stdout and stderr in it)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(scrub(text))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
