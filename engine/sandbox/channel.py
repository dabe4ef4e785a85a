"""The parent's end of a child's channel: incremental frame parsing with size limits and schema checks.

Frames are ``trainer_template.channel``'s: a 4-byte big-endian length, then a JSON object or the
blob the previous JSON frame announced (``"blob": n``). Anything else — a frame over the size limit,
bytes that are not a JSON object, a blob larger than announced, more bytes in all than allowed —
is a :class:`ChannelError`, and the parent kills the child.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from engine import secrets
from trainer_template.channel import HEADER, MAX_BLOB, MAX_FRAME


class ChannelError(Exception):
    """The child broke the channel's protocol (the message says how)."""


class FrameReader:
    """Feed it bytes as they arrive; it yields complete frames (dicts; a blob is under ``"_blob"``)."""

    def __init__(self, max_total: int, max_blob: int = MAX_BLOB):
        self.buf = bytearray()
        self.total = 0
        self.max_total = max_total
        self.max_blob = min(max_blob, MAX_BLOB)
        self._pending: dict | None = None  # a JSON frame waiting for its blob

    def feed(self, data: bytes) -> Iterator[dict]:
        self.total += len(data)
        if self.total > self.max_total:
            raise ChannelError(f"sent more than {self.max_total // (1024 * 1024)} MiB")
        self.buf += data
        while len(self.buf) >= HEADER.size:
            (n,) = HEADER.unpack_from(self.buf)
            limit = self._pending["blob"] if self._pending is not None else MAX_FRAME
            if n > limit:
                raise ChannelError(f"a frame of {n} bytes exceeds the limit ({limit})")
            if len(self.buf) < HEADER.size + n:
                return
            body = bytes(self.buf[HEADER.size : HEADER.size + n])
            del self.buf[: HEADER.size + n]
            if self._pending is not None:
                frame, self._pending = self._pending, None
                if len(body) != frame["blob"]:
                    raise ChannelError("a blob is shorter than announced")
                frame["_blob"] = body
                yield frame
                continue
            frame = _decode(body)
            blob = frame.get("blob")
            if blob is not None:
                if isinstance(blob, bool) or not isinstance(blob, int) or blob < 0:
                    raise ChannelError("a frame announces a blob of no valid size")
                if blob > self.max_blob:
                    raise ChannelError(
                        f"a blob of {blob} bytes exceeds the limit ({self.max_blob})"
                    )
                self._pending = frame
                continue
            yield frame

    def finish(self) -> None:
        """At end of stream: a partial frame or a missing blob is a protocol error."""
        if self.buf or self._pending is not None:
            raise ChannelError("the channel ended in the middle of a frame")


def _decode(body: bytes) -> dict:
    try:
        frame = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # also an integer of more than 4300 digits
        raise ChannelError(f"a frame is not JSON ({type(exc).__name__})") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise ChannelError("a frame is not a JSON object with a 'type'")
    return frame


# -- schema helpers the receivers share ---------------------------------------------------------
_KEY = re.compile(r"^[A-Za-z0-9_./@-]{1,64}$")


def expect(frame: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = frame.get(key)
    if isinstance(value, bool) and kind not in (bool, (bool,)):
        raise ChannelError(f"{frame.get('type')}: {key!r} has the wrong type")
    if not isinstance(value, kind):
        raise ChannelError(f"{frame.get('type')}: {key!r} is missing or has the wrong type")
    return value


def text(value: Any, limit: int = 500) -> str:
    """A printable, bounded one-line string from untrusted input."""
    s = value if isinstance(value, str) else repr(value)
    s = "".join(c if c.isprintable() else " " for c in s[: 4 * limit])
    return secrets.scrub(" ".join(s.split()))[:limit]


def finite_number(v: int | float) -> bool:
    """Whether a number from a frame is a finite float (an integer beyond a float's range is not)."""
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def metric_map(value: Any, *, max_keys: int = 64, allow_none: bool = False) -> dict[str, Any]:
    """``{name: finite float}`` with safe names (MLflow's and git's rules), or ChannelError."""
    if not isinstance(value, dict) or len(value) > max_keys:
        raise ChannelError(f"metrics must be an object of at most {max_keys} entries")
    out: dict[str, Any] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not _KEY.match(k) or secrets.scrub(k) != k:
            raise ChannelError(f"bad metric name {text(k, 80)!r}")
        if v is None and allow_none:
            out[k] = None
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ChannelError(f"metric {k!r} is not a number")
        if not finite_number(v):
            if allow_none:
                out[k] = None
                continue
            raise ChannelError(f"metric {k!r} is not finite")
        out[k] = float(v)
    return out


def plain_data(
    value: Any,
    name: str = "the value",
    *,
    max_items: int = 256,
    max_depth: int = 4,
    max_text: int = 1000,
) -> Any:
    """``value`` when it is plain JSON data: null, booleans, finite numbers, printable strings of at
    most ``max_text`` characters, and lists / objects (string keys) of them, at most ``max_depth``
    deep and ``max_items`` values in all; else ChannelError saying what is not (``name`` says what
    the value is)."""
    count = 0

    def check(v: Any, depth: int, where: str) -> None:
        nonlocal count
        count += 1
        if count > max_items:
            raise ChannelError(f"more than {max_items} values")
        if v is None or isinstance(v, bool):
            return
        if isinstance(v, (int, float)):
            if not finite_number(v):
                raise ChannelError(f"{where} is not a finite number")
            return
        if isinstance(v, str):
            if len(v) > max_text or not v.isprintable():
                raise ChannelError(
                    f"{where} is not printable text of at most {max_text} characters"
                )
            return
        if depth >= max_depth:
            raise ChannelError(f"{where} is nested more than {max_depth} deep")
        if isinstance(v, list):
            for i, item in enumerate(v):
                check(item, depth + 1, f"{where}[{i}]")
            return
        if isinstance(v, dict):
            for k, item in v.items():
                if not isinstance(k, str) or len(k) > max_text or not k.isprintable():
                    raise ChannelError(f"{where} has a key that is not printable text")
                check(item, depth + 1, f"{where}[{text(k, 40)!r}]")
            return
        raise ChannelError(f"{where} is not JSON data")

    check(value, 0, name)
    return value
