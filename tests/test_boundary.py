"""The OS boundary, attacked directly: raw code run behind it as if the static check had missed it.

Every case is *contained*: the canary files of a fake $HOME, the archive (its refs, git fsck), the
engine's working directory, the project, the venv and /tmp on the host are unchanged; no canary
secret reaches the child's output or frames; the engine (this process) is alive; the limits held.
Each case costs one sandboxed Python start without torch (~0.2 s on an idle machine)."""

from __future__ import annotations

import os
import socket
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from conftest import require_boundary

from engine.archive.store import Archive
from engine.sandbox import boundary
from engine.sandbox.limits import Limits
from engine.sandbox.runner import run_sandboxed

CANARY = "canary-" + uuid.uuid4().hex
MARK = "poise-test-mark-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Canaries on the host: a fake $HOME with secrets, an archive, a working directory."""
    root = tmp_path_factory.mktemp("world")
    home = root / "home"
    for rel in (".ssh/id_rsa", ".aws/credentials", ".netrc", ".gitconfig", ".config/poise/key"):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(CANARY + "\n")
    arch = Archive.init(root / "archive")
    arch.spawn("grpo", "other")
    cwd = root / "cwd"
    cwd.mkdir()
    (cwd / "notes.txt").write_text(CANARY)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    mp = pytest.MonkeyPatch()
    mp.setenv("LLM_CRED", CANARY)
    mp.setenv("POISE_TEST_PLAIN_VAR", CANARY)
    mp.setenv("HOME", str(home))
    mp.chdir(cwd)
    ctx = {
        "home": str(home),
        "archive": str(arch.path),
        "cwd": str(cwd),
        "pid": os.getpid(),
        "port": srv.getsockname()[1],
        "project": str(boundary.PROJECT),
        "venv": sys.prefix,
        "refs": arch.git.text("for-each-ref"),
    }
    yield ctx
    mp.undo()
    srv.close()


def run(code: str, world: dict, limits: Limits | None = None, **kw):
    b = require_boundary()
    frames: list[dict] = []
    res = run_sandboxed(
        "engine.sandbox.exec_source",
        ["{input}/case.py"],
        limits=limits or Limits(wall_s=30, memory_mb=1024),
        inputs={"case.py": fill(code, world).encode()},
        env={"POISE_TEST_MARK": MARK, **kw.pop("env", {})},
        on_frame=lambda f, _s: frames.append(f),
        boundary=b,
        **kw,
    )
    return res, frames


def assert_contained(res, frames, world) -> None:
    """Nothing left the sandbox: no canary in what it sent, the host unchanged, no process left."""
    sent = res.output_tail + repr(frames)
    assert CANARY not in sent, sent[-2000:]
    home = Path(world["home"])
    assert sorted(p.name for p in home.rglob("*")) == sorted(
        ["id_rsa", ".ssh", "credentials", ".aws", ".netrc", ".gitconfig", "key", "poise", ".config"]
    )
    assert all(p.read_text() == CANARY + "\n" for p in home.rglob("*") if p.is_file())
    assert sorted(os.listdir(world["cwd"])) == ["notes.txt"]
    arch = Archive(world["archive"])
    assert arch.git.text("for-each-ref") == world["refs"] and arch.fsck()
    assert not list(Path("/tmp").glob(f"*{MARK}*"))
    for p in psutil.process_iter(["pid"]):
        try:
            assert MARK not in " ".join(f"{k}={v}" for k, v in p.environ().items()), p
        except (psutil.Error, OSError):
            continue


def reported(frames: list[dict], key: str = "result"):
    return [f.get(key) for f in frames if f.get("type") == "report"]


def fill(text: str, world: dict) -> str:
    for k, v in world.items():
        text = text.replace("{" + k + "}", str(v))
    return text


ATTEMPTS = {
    # reading secrets of the user and of the engine
    "read-ssh-key": "got = open('{home}/.ssh/id_rsa').read()",
    "read-aws-credentials": "got = open('{home}/.aws/credentials').read()",
    "read-netrc": "got = open('{home}/.netrc').read()",
    "list-home": "got = os.listdir('{home}')",
    "read-engine-cwd": "got = open('{cwd}/notes.txt').read()",
    "read-parent-environ": "got = open('/proc/{pid}/environ').read()",
    "read-parent-cmdline": "got = open('/proc/{pid}/cmdline').read()",
    "read-parent-mem": "got = open('/proc/{pid}/mem', 'rb').read(1)",
    "read-shadow": "got = open('/etc/shadow').read()",
    "list-archive-objects": "got = os.listdir('{archive}/.git/objects')",
    # the same, where running is allowed but nothing secret may come back
    "read-own-environ": "got = open('/proc/self/environ').read()",
    "read-pid1-environ": "got = open('/proc/1/environ').read()",
    "scan-all-environ": (
        "got = [open('/proc/%s/environ' % p).read() for p in os.listdir('/proc')"
        " if p.isdigit() and os.access('/proc/%s/environ' % p, os.R_OK)]"
    ),
    "os-environ": "got = dict(os.environ)",
    "getenv-by-name": "got = os.environ['LLM_CRED']",
    "ctypes-getenv": "got = __import__('ctypes').CDLL(None).getenv(b'LLM_CRED')",
    "list-root": "got = os.listdir('/')",
    # writing outside the scratch directory
    "write-archive-git": "open('{archive}/.git/refs/heads/poise/pwned', 'w').write('0' * 40)",
    "delete-other-branch": "os.unlink('{archive}/.git/refs/heads/poise/other')",
    "git-plumbing": (
        "subprocess.run(['git', '-C', '{archive}', 'update-ref', '-d', 'refs/heads/poise/other'],"
        " check=True)"
    ),
    "write-home": "open('{home}/.ssh/authorized_keys', 'w').write('x')",
    "write-engine-cwd": "open('{cwd}/pwned', 'w').write('x')",
    "write-project": "open('{project}/engine/__init__.py', 'a').write('# pwned')",
    "write-venv-pth": "open('{venv}/lib/python3.11/site-packages/pwned.pth', 'w').write('import os')",
    "write-host-tmp": "open('/tmp/{mark}', 'w').write('x'); got = os.listdir('/tmp')",
    "symlink-to-home": "os.symlink('{home}/.ssh/id_rsa', 'link'); got = open('link').read()",
    "symlink-scratch-escape": "os.symlink('/', 'up'); got = open('up{home}/.netrc').read()",
    "hardlink-archive": "os.link('{archive}/.git/HEAD', 'head')",
    # the network
    "connect-localhost": "socket.create_connection(('127.0.0.1', {port}), timeout=2)",
    "connect-outside": "socket.create_connection(('1.1.1.1', 53), timeout=2)",
    "dns-lookup": "got = socket.getaddrinfo('example.com', 80)",
    "unix-socket-dbus": "s = socket.socket(socket.AF_UNIX); s.connect('/run/dbus/system_bus_socket')",
    # the engine's processes and the kernel
    "kill-engine": "os.kill({pid}, signal.SIGKILL)",
    "stop-engine": "os.kill({pid}, signal.SIGSTOP)",
    "kill-parent": "os.kill(os.getppid(), signal.SIGKILL)",
    "kill-everything": "os.kill(-1, signal.SIGKILL)",
    "setuid-root": "os.setuid(0)",
    "new-user-namespace": "os.unshare(os.CLONE_NEWUSER | os.CLONE_NEWNS); got = open('{home}/.netrc').read()",
    "mount-proc": "subprocess.run(['mount', '-t', 'proc', 'proc', '/proc'], check=True)",
    "write-dev": "open('/dev/poise', 'w').write('x' * 10_000)",
}
MAY_RUN = {  # attempts that may succeed inside the sandbox; nothing secret may come back from them
    "read-own-environ", "read-pid1-environ", "scan-all-environ", "os-environ", "ctypes-getenv",
    "list-root", "kill-parent", "write-dev", "write-host-tmp",
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ATTEMPTS))
def test_attempt_is_contained(world, name):
    stmt = fill(ATTEMPTS[name], {**world, "mark": MARK})
    code = (
        "import os, signal, socket, subprocess\n"
        "got = None\n"
        "try:\n"
        f"    {stmt}\n"
        "    CHANNEL.send({'type': 'report', 'result': 'ran', 'got': repr(got)[:20000]})\n"
        "except BaseException as exc:\n"
        "    CHANNEL.send({'type': 'report', 'result': 'failed: ' + type(exc).__name__})\n"
    )
    res, frames = run(code, world)
    assert_contained(res, frames, world)
    outcome = reported(frames)
    assert outcome, (name, res.reason(), res.output_tail)
    if name not in MAY_RUN:
        assert outcome[0].startswith("failed"), (name, frames)


def test_fork_bomb_is_bounded_and_leaves_no_process(world):
    res, frames = run(
        "import os, time\n"
        "n = 0\n"
        "for i in range(1000):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "    except OSError:\n"
        "        break\n"
        "CHANNEL.send({'type': 'report', 'result': n})\n",
        world,
        Limits(wall_s=30, processes=32),
    )
    (n,) = reported(frames)
    assert 0 < n < 32, n  # RLIMIT_NPROC counts the sandbox's own uid only
    assert_contained(res, frames, world)  # and every sleeper died with the namespace


def test_a_spinning_fork_bomb_is_stopped_at_its_wall_clock_with_every_process(world):
    """Every process forks in a loop: the wall clock ends them all, within the limit plus a small
    grace (the kill of the namespace's first process takes its whole pid namespace)."""
    res, _ = run(
        "import os\n"
        "CHANNEL.send({'type': 'report', 'result': 'started'})\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        pass\n",
        world,
        Limits(wall_s=2, processes=16),
    )
    assert res.timed_out and res.wall_s < 2 + 3, (res.reason(), res.wall_s)
    assert_contained(res, [], world)  # no process carrying the run's mark is left


def test_thread_bomb_is_bounded(world):
    res, frames = run(
        "import threading, time\n"
        "n = 0\n"
        "try:\n"
        "    for i in range(1000):\n"
        "        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "        n += 1\n"
        "except RuntimeError:\n"
        "    pass\n"
        "CHANNEL.send({'type': 'report', 'result': n})\n",
        world,
        Limits(wall_s=30, processes=32),
    )
    assert 0 < reported(frames)[0] < 32
    assert_contained(res, frames, world)


def test_double_fork_daemon_does_not_outlive_the_sandbox(world):
    res, frames = run(
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(120)\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\n",
        world,
    )
    assert res.returncode == 0
    assert_contained(res, frames, world)


@pytest.mark.parametrize(
    "code,limits,why",
    [
        ("x = bytearray(8 * 1024 ** 3)", Limits(wall_s=30, memory_mb=512), "MemoryError"),
        (
            "fs = [open('/dev/null') for _ in range(100_000)]",
            Limits(wall_s=30, open_files=64),
            "Too many open files",
        ),
        (
            "open('big', 'wb').write(b'x' * (64 * 1024 ** 2))",
            Limits(wall_s=30, file_mb=8),
            "File too large",
        ),
        (
            "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * 1024 ** 2)\n    i += 1",
            Limits(wall_s=30, scratch_mb=16),
            "No space left",
        ),
        (
            "open('/dev/shm/x', 'wb').write(b'x' * (8 * 1024 ** 2))",
            Limits(wall_s=30),
            "No space left",
        ),
        ("while True:\n    pass", Limits(wall_s=30, cpu_s=2), "SIGXCPU"),
        ("sum(range(10 ** 12))", Limits(wall_s=3), "wall-clock"),
        ("import time\ntime.sleep(600)", Limits(wall_s=2), "wall-clock"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)", Limits(wall_s=2), "wall-clock"),
    ],
    ids=[
        "memory",
        "fds",
        "file-size",
        "scratch-full",
        "shm-full",
        "cpu",
        "c-loop",
        "sleep",
        "stop",
    ],
)
def test_limits_hold(world, code, limits, why):
    res, frames = run(code, world, limits)
    assert not res.ok and why in res.reason() + res.output_tail, (res.reason(), res.output_tail)
    assert res.wall_s < limits.wall_s + 10
    assert_contained(res, frames, world)


@pytest.mark.slow
def test_printing_2_gib_keeps_the_engine_small(world):
    rss0 = psutil.Process().memory_info().rss
    res, frames = run(
        "import os\nb = b'x' * (1 << 20)\nfor i in range(2048):\n    os.write(1, b)\n",
        world,
        Limits(wall_s=300),
    )
    assert res.ok and res.output_bytes == 2 * 1024**3
    assert len(res.output_tail) <= 64 * 1024
    assert psutil.Process().memory_info().rss - rss0 < 50 * 1024**2


@pytest.mark.parametrize(
    "code,why",
    [
        ("os.write(fd, b'\\x00\\x00\\x00\\x05hello')", "not JSON"),
        ("os.write(fd, b'\\x00\\x00\\x00\\x02[]')", "not a JSON object"),
        ("os.write(fd, b'\\x7f\\xff\\xff\\xff')", "exceeds the limit"),
        ("CHANNEL.send({'type': 'x', 'blob': 10 ** 12})", "exceeds the limit"),
        ("CHANNEL.send({'type': 'x', 'blob': -1})", "no valid size"),
        ("os.write(fd, b'\\x00\\x00\\x00\\x20{\"type\":')", "middle of a frame"),
        (
            'b = b\'{"type":"x","pad":"\' + b\'a\' * 1000000 + b\'"}\'\n'
            "for _ in range(40):\n    CHANNEL._write(b)",
            "more than",
        ),
        ("CHANNEL._write(b'{\"type\":\"x\",\"v\":' + b'9' * 5000 + b'}')", "not JSON"),
    ],
    ids=[
        "not-json",
        "not-object",
        "huge-length",
        "huge-blob",
        "negative-blob",
        "truncated",
        "flood",
        "integer-of-5000-digits",
    ],
)
def test_malformed_channel_messages_are_refused(world, code, why):
    res, frames = run(
        "import os\nfd = CHANNEL.fd\n" + code + "\nimport time\ntime.sleep(1)\n",
        world,
        Limits(wall_s=30, channel_mb=16),
    )
    assert res.protocol_error and why in res.protocol_error, (res.protocol_error, res.reason())
    assert "malformed" in res.reason() and res.wall_s < 10
    assert_contained(res, frames, world)


@pytest.mark.parametrize(
    "done,refused",
    [
        ("'timings': {'rl_s': 10 ** 400}, 'peak_rss_mb': 12", ""),
        ("'peak_rss_mb': 10 ** 400", "peak_rss_mb"),
        ("'peak_rss_mb': float('nan')", "peak_rss_mb"),
    ],
    ids=["in-metrics", "huge-peak-rss", "nan-peak-rss"],
)
def test_numbers_beyond_a_float_in_training_frames(world, done, refused):
    """JSON integers too large for a float, and NaN, reach the evaluation's receiver: a metric
    becomes None (as NaN does); the peak memory must be a finite number, else the message is
    malformed. Never an exception in the engine."""
    from engine.operators.evaluate_seed import _Training

    train = _Training(4)
    res = run_sandboxed(
        "engine.sandbox.exec_source",
        ["{input}/case.py"],
        limits=Limits(wall_s=30),
        inputs={
            "case.py": (
                "import os\n"
                "CHANNEL.send({'type': 'step', 'step': 0, 'row': {'loss': 10 ** 400, 'kl': 0.5}})\n"
                f"CHANNEL.send({{'type': 'done', 'status': 'ok', {done}}})\n"
                "os._exit(0)\n"
            ).encode()
        },
        on_frame=train,
        boundary=require_boundary(),
    )
    assert train.rows == {0: {"loss": None, "kl": 0.5}}
    if refused:
        assert refused in res.protocol_error and train.done is None, res.reason()
    else:
        assert res.ok, res.reason()
        assert train.done["timings"] == {"rl_s": None} and train.done["peak_rss_mb"] == 12.0
    assert_contained(res, [], world)


def test_the_reason_shows_no_terminal_escape_sequences(world):
    """The last line a failing child printed becomes its reason, which the CLI prints and commit
    messages keep: control characters are blanked, so it cannot rewrite, retitle or hide what the
    terminal shows."""
    res, frames = run(
        "import os\n"
        "os.write(2, b'\\x1b]0;title\\x07\\x1b[2K\\x1b[1Gseed 0: ok\\x1b[8m\\x9b0m\\r\\n')\n"
        "os._exit(3)\n",
        world,
    )
    reason = res.reason()
    assert reason.startswith("exited with status 3: ") and "seed 0: ok" in reason, reason
    assert all(c.isprintable() for c in reason), repr(reason)
    assert_contained(res, frames, world)


def test_a_benign_child_works_and_sees_only_its_inputs(world):
    res, frames = run(
        "import os, sys\n"
        "open('scratch.txt', 'w').write('ok')\n"
        "CHANNEL.send({'type': 'report', 'result': [os.getcwd(), os.environ['HOME'],\n"
        "    open('/input/case.py').read()[:6], open('scratch.txt').read(), os.getuid() != 0,\n"
        "    sorted(os.listdir('/input'))]}, blob=b'weights')\n",
        world,
    )
    assert res.ok, res.reason()
    assert reported(frames) == [["/scratch", "/scratch", "import", "ok", True, ["case.py"]]]
    assert frames[0]["_blob"] == b"weights" and frames[-1] == {"type": "done"}
    assert_contained(res, frames, world)


def test_a_stop_ends_a_running_child_without_waiting_for_its_pipes(world):
    """The engine's stop flag (set by an interrupt) ends a supervised child at the reader's next
    look, even when nothing closes its pipes: a 60 s child under a 60 s limit ends in seconds."""
    import threading

    from engine.sandbox import live

    timer = threading.Timer(1.5, live._stopping.set)
    timer.start()
    try:
        res, frames = run("import time\ntime.sleep(60)\n", world, Limits(wall_s=60))
    finally:
        timer.cancel()
        live._stopping.clear()
    assert "interrupted" in res.killed, res.killed
    assert res.wall_s < 20, res.wall_s
    assert_contained(res, frames, world)


def test_preloaded_modules_are_imported_under_the_limits_and_then_frozen(world):
    """``preload``: the launcher imports the named modules inside the boundary before the target runs,
    with the garbage collector off and their objects frozen; the target finds them imported and the
    collector on again (candidate code is collected as before). The limits already apply: a preload
    that needs more memory than the child may have fails the child, as the target's own import
    would."""
    code = (
        "import gc, sys\n"
        "CHANNEL.send({'type': 'report', 'result': ['decimal' in sys.modules, gc.isenabled(),\n"
        "    gc.get_freeze_count() > 1000]})\n"
    )
    res, frames = run(code, world, preload=("decimal",))
    assert res.ok, res.reason()
    assert reported(frames) == [[True, True, True]]
    assert_contained(res, frames, world)
    res, frames = run(code.replace("'decimal' in", "'decimal' not in"), world)
    assert res.ok, res.reason()
    assert reported(frames) == [[True, True, False]]  # nothing preloaded, nothing frozen
    res, frames = run(
        "CHANNEL.send({'type': 'report', 'result': 1})\n",
        world,
        Limits(wall_s=30, memory_mb=96),
        preload=("torch",),
    )
    assert not res.ok and reported(frames) == [], res.reason()
    tail = res.output_tail  # the launcher's import, over the address-space limit
    assert "in _preload" in tail and ("failed to map" in tail or "MemoryError" in tail), tail
    assert_contained(res, frames, world)
