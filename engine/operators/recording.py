"""The parent's side of a recording child: pair its begin / end frames, arm the per-call deadline,
and turn how the child ended into the recording the trusted replay reads.

The recording is data the candidate's process produced; it is checked here for shape (one open call
at a time, each key once, bounded sizes) and decoded strictly on the trusted side. The verdict is
computed there, never received.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from engine import secrets
from engine.sandbox.channel import ChannelError, expect, text
from engine.sandbox.runner import SandboxRun, Session

MAX_CALLS = 20_000
RECORDING_CHANNEL_MB = 64
"""what a recording child may send in all (a verification's recording is about 40 KB, a source's
fingerprint recording about 8 KB): the engine holds the whole recording in memory, several times
its size as Python objects, so the sandbox's general 256 MiB would let a child make it take gigabytes"""
_FIELDS = ("out", "mutated", "grads", "fields")


class Recorder:
    """``on_frame`` for a recording child. With ``scope`` every call's key must be ``<scope>#...``:
    the child recorded that one scope (one source) and may not send the calls of another."""

    def __init__(self, call_s: float, scope: str = ""):
        self.call_s = call_s
        self.scope = scope
        self.calls: dict[str, dict] = {}
        self.open: str | None = None
        self.done = False

    def __call__(self, frame: dict, session: Session) -> None:
        kind = frame["type"]
        if kind == "begin":
            if self.open is not None:
                raise ChannelError("a call began before the previous one ended")
            key = expect(frame, "key", str)
            if len(key) > 400 or key in self.calls:
                raise ChannelError("a call key is too long or was recorded twice")
            if self.scope and not key.startswith(f"{self.scope}#"):
                raise ChannelError(f"the call {text(key, 60)!r} is not one of {self.scope}'s")
            if len(self.calls) >= MAX_CALLS:
                raise ChannelError(f"more than {MAX_CALLS} calls")
            digest = frame.get("digest", "")
            fn = text(frame.get("fn", "call"), 40)
            if not isinstance(digest, str) or len(digest) > 64:
                raise ChannelError("begin: bad digest")
            self.calls[key] = {"digest": digest, "fn": fn}
            self.open = key
            session.arm(
                self.call_s, f"a call into the candidate ({fn}) took longer than {self.call_s:g} s"
            )
        elif kind == "end":
            if self.open is None or frame.get("key") != self.open:
                raise ChannelError("a call ended that had not begun")
            entry = self.calls[self.open]
            if "error" in frame:
                entry["error"] = secrets.scrub(text(frame["error"], 600)) or "failed"
            else:
                for k in _FIELDS:
                    if k in frame:
                        entry[k] = frame[k]
            self.open = None
            session.disarm()
        elif kind == "done":
            if self.open is not None:
                raise ChannelError("done while a call was open")
            self.done = True
        else:
            raise ChannelError(f"unexpected frame type {text(kind, 40)!r}")

    def finish(self, run: SandboxRun) -> str:
        """Close the recording after the child ended; returns '' or why it stopped early."""
        if self.open is not None:
            if run.killed.startswith("a call into the candidate"):
                why = run.killed
            else:
                why = f"the candidate's process ended during this call: {run.reason()}"
            self.calls[self.open]["error"] = why
            self.open = None
            return why
        if self.done and run.returncode == 0:
            return ""
        return f"the candidate's process ended early: {run.reason()}"

    def to_json(self, ended: str) -> str:
        return recording_json(self.calls, ended)


def recording_json(calls: Mapping[str, dict], ended: str | Mapping[str, str]) -> str:
    """The recording a replay child reads (``engine.operators.probe``): the calls by key, and why the
    recording stopped early, one reason, or one per scope (``fp<i>``), '' for none."""
    return json.dumps({"calls": dict(calls), "ended": ended}, allow_nan=True)
