"""Run a module in a sandboxed child and receive its frames over a channel the parent owns.

The parent creates the pipe, passes only its write end to the child, reads it incrementally (frame
by frame, size-limited, see ``engine.sandbox.channel``) together with the child's merged
stdout/stderr (of which it keeps a bounded tail), and enforces the wall clock and the deadlines a
receiver arms (e.g. one call into the candidate) by SIGKILLing the whole sandbox. Nothing the child
writes to a file is read back: its scratch is a tmpfs that vanishes with it.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from engine import secrets
from engine.sandbox import boundary as _boundary
from engine.sandbox import live
from engine.sandbox.channel import ChannelError, FrameReader, text
from engine.sandbox.env import candidate_env
from engine.sandbox.limits import Limits
from engine.scratch import SANDBOX_PREFIX, scratch_dir
from trainer_template.channel import FD_ENV

INPUT_TOKEN = "{input}"
POLL_S = 0.5
"""the longest a supervised child's reader waits before it looks again at the engine's stop flag"""
EXIT_DRAIN_S = 2.0
"""how long the pipes are still read once the child has exited: what it wrote is in the pipes'
buffers by then; a pipe still open after that is held by a descendant that detached itself (the weak
mode), which must hold the engine up no longer"""
_UID_BASE = 1_500_000_000
_uid_counter = 0
_uid_lock = threading.Lock()


class Feed:
    """Bytes for a child's stdin that arrive later: a child started early (its imports overlapping
    other work) blocks on stdin until :meth:`put`; ``put(None)`` closes stdin empty."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._data: bytes | None = None

    def put(self, data: bytes | None) -> None:
        """The first call wins; later ones do nothing."""
        if not self._ready.is_set():
            self._data = data
            self._ready.set()

    def get(self, timeout: float) -> bytes | None:
        self._ready.wait(timeout)
        return self._data


class Session:
    """What a frame receiver may do to the running child."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.deadline_reason = ""
        self.stop_reason = ""

    def arm(self, seconds: float, reason: str) -> None:
        """Kill the child unless :meth:`disarm` comes within ``seconds``."""
        self.deadline = time.monotonic() + seconds
        self.deadline_reason = reason

    def disarm(self) -> None:
        self.deadline = None

    def stop(self, reason: str) -> None:
        self.stop_reason = reason


@dataclass
class SandboxRun:
    returncode: int | None
    wall_s: float
    boundary: str
    killed: str = ""
    """why the parent killed the child ('' when it ended by itself)"""
    protocol_error: str = ""
    output_tail: str = ""
    output_bytes: int = 0
    frames: int = 0
    limits: dict = field(default_factory=dict)

    @property
    def timed_out(self) -> bool:
        return self.killed.startswith("exceeded the wall-clock limit")

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.killed and not self.protocol_error

    def signal_name(self) -> str | None:
        rc = self.returncode
        if rc is None:
            return None
        num = -rc if rc < 0 else (rc - 128 if self.boundary == "bwrap" and 128 < rc < 160 else 0)
        if num <= 0:
            return None
        try:
            return signal.Signals(num).name
        except ValueError:
            return f"signal {num}"

    def reason(self) -> str:
        """One line: how the child ended, when that is a failure."""
        if self.protocol_error:
            return f"sent a malformed message ({self.protocol_error})"
        if self.killed:
            return self.killed
        sig = self.signal_name()
        if sig:
            hint = {
                "SIGXCPU": " (CPU-time limit)",
                "SIGKILL": " (killed: a limit, or it killed itself)",
                "SIGXFSZ": " (file-size limit)",
            }.get(sig, "")
            return f"killed by {sig}{hint}"
        tail = [ln for ln in self.output_tail.strip().splitlines() if ln.strip()]
        if any("MemoryError" in ln or "can't allocate memory" in ln for ln in tail[-8:]):
            return "ran out of memory (memory limit)"
        # the child's own words, printed by the CLI and written into commit messages: printable
        # characters only (no terminal escape sequences that rewrite or hide what is shown)
        last = text(tail[-1], 300) if tail else ""
        status = f"exited with status {self.returncode}"
        return f"{status}: {last}" if last and self.returncode else status


def _next_uid() -> int:
    """A uid of its own for each child, also for children started at once from several threads
    (RLIMIT_NPROC counts the processes of a uid)."""
    global _uid_counter
    with _uid_lock:
        _uid_counter += 1
        return _UID_BASE + (os.getpid() * 1009 + _uid_counter) % 90_000_000


def run_sandboxed(
    module: str,
    args: list[str] | tuple[str, ...] = (),
    *,
    limits: Limits,
    inputs: Mapping[str, bytes | Path] | None = None,
    env: Mapping[str, str] | None = None,
    on_frame: Callable[[dict, Session], None] | None = None,
    boundary: _boundary.Boundary | None = None,
    stdin: Feed | None = None,
    preload: tuple[str, ...] = (),
) -> SandboxRun:
    """Run ``python -m module *args`` behind the boundary; frames go to ``on_frame`` in order.

    ``inputs``: files the child reads under ``{input}/NAME`` (``{input}`` in ``args`` is replaced by
    that directory); bytes are written by the parent, a Path is bound (or linked) read-only.
    ``stdin``: bytes delivered later (the child may start before they exist).
    ``on_frame`` may raise ChannelError (the child is killed, ``protocol_error`` says why).
    ``preload``: trusted modules ``module`` imports anyway (torch, pytest), imported by the launcher
    inside the boundary and under the limits before ``module`` runs, with the garbage collector off,
    then frozen (``engine.sandbox.launch``): the same imports, at less CPU."""
    b = boundary or _boundary.resolve()
    if live.stopping():
        return SandboxRun(None, 0.0, b.kind, killed="interrupted before it started")
    with scratch_dir(SANDBOX_PREFIX) as tmp:
        input_dir = Path(tmp) / "input"
        input_dir.mkdir()
        binds: list[str] = []
        for name, data in (inputs or {}).items():
            target = input_dir / name
            if ".." in Path(name).parts or Path(name).is_absolute():
                raise ValueError(f"bad sandbox input name {name!r}")
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            if isinstance(data, Path):
                if b.isolated:
                    target.touch()
                    binds += ["--ro-bind", str(data), f"{_boundary.INPUT}/{name}"]
                else:
                    target.symlink_to(data.resolve())
            else:
                target.write_bytes(data)
        os.chmod(input_dir, 0o755)
        for p in input_dir.rglob("*"):
            if not p.is_symlink():
                os.chmod(p, 0o755 if p.is_dir() else 0o644)
        if b.isolated:
            inside_input, home, cwd = _boundary.INPUT, _boundary.SCRATCH, "/"
        else:
            scratch = Path(tmp) / "scratch"
            scratch.mkdir(mode=0o700)
            inside_input, home, cwd = str(input_dir), str(scratch), str(scratch)
        read_fd, write_fd = os.pipe()
        extra = {k: v.replace(INPUT_TOKEN, inside_input) for k, v in (env or {}).items()}
        child_env = candidate_env(
            {**extra, FD_ENV: str(write_fd)}, home=home, pythonpath=_boundary.child_pythonpath()
        )
        spec = {
            "module": module,
            "args": [a.replace(INPUT_TOKEN, inside_input) for a in args],
            "rlimits": limits.rlimits(),
            "uid": _next_uid() if (b.isolated and os.geteuid() == 0) else None,
            "parent": None if b.isolated else os.getpid(),
            "preload": list(preload),
        }
        cmd = [sys.executable, "-s", "-B", "-m", "engine.sandbox.launch", json.dumps(spec)]
        if b.isolated:
            prefix = _boundary.bwrap_command(b, str(input_dir), limits.scratch_mb, gpu=limits.gpu)
            cmd = prefix[:-2] + binds + prefix[-2:] + cmd
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=child_env,
                cwd=cwd,
                pass_fds=(write_fd,),
                start_new_session=True,
            )
        finally:
            os.close(write_fd)
        live.add(proc)
        if stdin is not None:
            threading.Thread(
                target=_feed, args=(proc, stdin, limits.wall_s), daemon=True, name="poise-feed"
            ).start()
        try:
            if live.stopping():
                _kill(proc)
            run = _supervise(proc, read_fd, limits, on_frame, start, b)
        finally:
            _kill(proc)
            if not b.isolated:  # under bwrap the whole pid namespace died with its first process
                live.kill_pipe_holders([read_fd, proc.stdout.fileno()])
            os.close(read_fd)
            live.discard(proc)
    run.limits = limits.to_dict()
    return run


def _feed(proc: subprocess.Popen, feed: Feed, wait_s: float) -> None:
    data = feed.get(wait_s)
    try:
        if data:
            proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass


def _supervise(proc, read_fd: int, limits: Limits, on_frame, start: float, b) -> SandboxRun:
    out_fd = proc.stdout.fileno()
    os.set_blocking(read_fd, False)
    os.set_blocking(out_fd, False)
    sel = selectors.DefaultSelector()
    sel.register(read_fd, selectors.EVENT_READ, "channel")
    sel.register(out_fd, selectors.EVENT_READ, "output")
    reader = FrameReader(limits.channel_mb * 1024 * 1024)
    session = Session()
    keep = limits.output_kb * 1024
    tail = bytearray()
    out_bytes = frames = 0
    killed = protocol = ""
    wall_end = start + limits.wall_s
    drain_end: float | None = None
    while sel.get_map():
        now = time.monotonic()
        if not killed:
            if live.stopping():
                killed = "interrupted (the engine is stopping)"
            elif now >= wall_end:
                killed = f"exceeded the wall-clock limit ({limits.wall_s:g} s)"
            elif session.deadline is not None and now >= session.deadline:
                killed = session.deadline_reason
            elif session.stop_reason:
                killed = session.stop_reason
            if killed:
                _kill(proc)
                drain_end = now + 2.0
        if drain_end is None and proc.poll() is not None:
            drain_end = now + EXIT_DRAIN_S  # exited: read what it left in the pipes, then stop
        ends = [wall_end, session.deadline or wall_end]
        if drain_end is not None:
            if now >= drain_end:
                break
            ends.append(drain_end)
        # wake at least every POLL_S: a stop (live.stopping) must end the child even when the kill
        # that came with it left its pipes open (a descendant that escaped it)
        for key, _ in sel.select(min(max(0.0, min(ends) - now), POLL_S) + 0.001):
            try:
                data = os.read(key.fd, 1 << 16)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(key.fd)
                if key.data == "channel" and not protocol and not killed:
                    try:
                        reader.finish()
                    except ChannelError as exc:
                        protocol = str(exc)
                continue
            if key.data == "output":
                out_bytes += len(data)
                tail += data
                if len(tail) > keep:
                    del tail[: len(tail) - keep]
                continue
            if protocol or killed:
                continue  # drain and drop
            try:
                for frame in reader.feed(data):
                    frames += 1
                    if on_frame is not None:
                        on_frame(frame, session)
            except ChannelError as exc:
                protocol = secrets.scrub(str(exc))[:300]
                _kill(proc)
                drain_end = time.monotonic() + 2.0
    if read_fd in sel.get_map() and not protocol and not killed:
        try:  # a detached descendant still holds the channel: what the child sent must be whole
            reader.finish()
        except ChannelError as exc:
            protocol = str(exc)
    sel.close()
    try:
        rc = proc.wait(timeout=max(0.1, wall_end - time.monotonic()) if not killed else 5)
    except subprocess.TimeoutExpired:
        if not killed:
            killed = f"exceeded the wall-clock limit ({limits.wall_s:g} s)"
        _kill(proc)
        rc = proc.wait()
    return SandboxRun(
        returncode=rc,
        wall_s=time.monotonic() - start,
        boundary=b.kind,
        killed=killed,
        protocol_error=protocol,
        output_tail=secrets.scrub(bytes(tail).decode("utf-8", "replace")),
        output_bytes=out_bytes,
        frames=frames,
    )


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group and every descendant found (under bwrap the pid namespace
    dies with its first process; its members are killed too, should one outlive it)."""
    live.kill_sandbox_tree(proc.pid)
