"""The child's end of the channel to the engine: length-prefixed frames on an inherited pipe.

A frame is a 4-byte big-endian length followed by that many bytes: a UTF-8 JSON object, or the raw
bytes a JSON frame announced with ``{"blob": n, ...}``. The engine created the pipe, reads it
incrementally with size limits and checks every frame against the schema of the child it started
(``engine.sandbox.channel``); nothing a child writes into files is ever read back.
"""

from __future__ import annotations

import json
import os
import struct

FD_ENV = "POISE_CHANNEL_FD"
HEADER = struct.Struct(">I")
MAX_FRAME = 16 * 1024 * 1024
"""bytes of one JSON frame"""
MAX_BLOB = 256 * 1024 * 1024
"""bytes of one blob (a checkpoint); the engine may accept less"""


class ChannelClosed(RuntimeError):
    """The engine's end of the channel is gone."""


class Channel:
    """Writes frames to the file descriptor named by ``$POISE_CHANNEL_FD``."""

    def __init__(self, fd: int):
        self.fd = fd

    @classmethod
    def from_env(cls) -> Channel | None:
        raw = os.environ.get(FD_ENV)
        return cls(int(raw)) if raw and raw.isdigit() else None

    def _write(self, data: bytes) -> None:
        view = memoryview(HEADER.pack(len(data)) + data)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            raise ChannelClosed(f"the channel to the engine is closed: {exc}") from None

    def send(self, message: dict, blob: bytes | None = None) -> None:
        """One JSON frame (NaN / inf allowed: Python's json reads them back), then the blob if any."""
        if blob is not None:
            message = {**message, "blob": len(blob)}
        data = json.dumps(message, separators=(",", ":")).encode("utf-8")
        if len(data) > MAX_FRAME or (blob is not None and len(blob) > MAX_BLOB):
            raise ValueError("a frame is larger than the channel allows")
        self._write(data)
        if blob is not None:
            self._write(blob)
