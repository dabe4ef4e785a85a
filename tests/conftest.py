"""Shared fixtures. tests/ is not a package (verl installs a top-level `tests` package)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Under ``-n N`` every core already has a worker: torch's own thread pool in a worker (two threads
# on two cores) then waits on a core the other worker holds, and the tests that train or sample in
# process ran 5-25 times slower in the suite than alone. One thread per worker, as the engine gives
# each sandboxed child; subprocesses the tests start inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


# Without bubblewrap the engine refuses candidate code unless the weak mode is chosen explicitly; a
# test run on such a machine (outside CI, which must have it) chooses it here, as a user would, so
# that the tests of everything else still run. The boundary's own tests skip (require_boundary).
if not os.environ.get("CI") and "POISE_SANDBOX" not in os.environ:
    from engine.sandbox import boundary as _boundary

    if _boundary._bwrap()[1]:
        os.environ["POISE_SANDBOX"] = "none"


# Ray puts a session directory under $RAY_TMPDIR/ray (default /tmp/ray) for every instance it
# starts and never removes it: the Ray tests (a private Ray per `--ray local` run, the verl smoke's)
# left one in the machine's /tmp per run. The run's Rays get a directory of their own instead, made
# by the first process (xdist's controller, whose workers inherit it) and removed by it at the end.
# Short, for Ray's socket paths. A RAY_TMPDIR set by the caller is left as it is.
_RAY_TMP_OWNER = "POISE_TEST_RAY_TMPDIR_OWNER"
if "RAY_TMPDIR" not in os.environ:
    import tempfile

    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="poise-rt-")
    os.environ[_RAY_TMP_OWNER] = str(os.getpid())


def _remove_ray_tmp() -> None:
    if os.environ.get(_RAY_TMP_OWNER) == str(os.getpid()):
        import shutil

        shutil.rmtree(os.environ["RAY_TMPDIR"], ignore_errors=True)


# Paths a test run may leave in the checkout: Python's and the tools' own caches.
_RUN_CACHES = ("__pycache__/", ".pytest_cache/", ".ruff_cache/")


def _checkout_state() -> set[str] | None:
    """``git status --porcelain --ignored`` of the checkout as a set of lines (None outside git)."""
    try:
        p = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--ignored", "--untracked-files=all"],
            capture_output=True,
            text=True,
        )
    except OSError:  # no git on this machine
        return None
    if p.returncode != 0:
        return None
    return {ln for ln in p.stdout.splitlines() if not any(c in ln for c in _RUN_CACHES)}


def pytest_sessionstart(session):
    session.config._checkout_before = _checkout_state()
    session.config._scratch_before = _scratch_dirs()


def _scratch_dirs() -> set[str]:
    import tempfile

    from engine.scratch import SCRATCH_PREFIXES

    root = tempfile.gettempdir()
    try:
        return {os.path.join(root, n) for n in os.listdir(root) if n.startswith(SCRATCH_PREFIXES)}
    except OSError:
        return set()


def _remove_left_scratch(before: set[str]) -> None:
    """The engine's temporary directories that processes this run killed with SIGKILL left behind,
    as a real kill does (``poise-git gc`` removes those): removed, so that a test run leaves nothing
    in the machine's temporary directory. One a live process holds is kept, and so is one whose
    lock file is missing or a few seconds old: the temporary directory is shared with other test
    sessions, and a directory another process is making has no lock, or an unlocked one, until it
    takes it (a dead process's lock file was made before it was killed)."""
    import shutil
    import time

    from engine.scratch import IN_USE, in_use

    for path in sorted(_scratch_dirs() - before):
        try:
            age = time.time() - os.stat(os.path.join(path, IN_USE)).st_mtime
        except OSError:  # not locked yet, or being removed: another process's to finish
            continue
        if age > 5.0 and not in_use(path):
            shutil.rmtree(path, ignore_errors=True)


def pytest_sessionfinish(session, exitstatus):
    """Tests leave nothing in the checkout: every file they write goes under tmp_path (archives,
    MLflow stores and artifacts, caches). A file the run added fails the session."""
    if not hasattr(session.config, "workerinput"):  # once, after every xdist worker has finished
        _remove_left_scratch(getattr(session.config, "_scratch_before", set()))
        _remove_ray_tmp()
    before = getattr(session.config, "_checkout_before", None)
    after = _checkout_state()
    if before is None or after is None:
        return
    added = sorted(after - before)
    if added:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        msg = "the test run left files in the checkout:\n  " + "\n  ".join(added)
        if tr is not None:
            tr.write_line(msg, red=True, bold=True)
        else:
            print(msg, file=sys.stderr)
        session.exitstatus = 1


# The files whose tests take minutes, longest first. They start first, so that under
# ``-n N --dist loadfile`` no worker begins a long file when the others are nearly done. The files
# that mostly wait come before them all, one after the other on one worker: the two-node Ray
# cluster (about 2 min of wall time on 1 CPU-minute: its nodes starting, a node's death being
# noticed) and the waits' tests (4 min on 1 CPU-minute, a run waiting for a slow hand evaluation).
# xdist gives a worker its next file once two of its tests are left: the cluster's two tests take
# the first worker and queue the waits behind them there, while the second worker starts the verl
# smoke and the loop, whose processes then have the first worker's idle core too. Either waiting
# file second would start both workers waiting, with the cores idle.
_LONG_FILES = (
    "test_ray_cluster.py",
    "test_verl_smoke.py",
    "test_loop_waits.py",
    "test_loop.py",
    "test_benchmarks.py",
    "test_hostile.py",
    "test_loop_inprocess.py",
    "test_confirm.py",
    "test_proxy.py",
    "test_evaluate.py",
    "test_verify.py",
    "test_hostile_flows.py",
    "test_propose.py",
)


def _long_first(items) -> None:
    """Reorder ``items`` in place: the files of ``_LONG_FILES`` first (in that order), then the rest
    in collection order. Every worker sorts the same collection the same way."""
    rank = {name: i for i, name in enumerate(_LONG_FILES)}
    order = {id(it): i for i, it in enumerate(items)}
    items.sort(key=lambda it: (rank.get(it.path.name, len(rank)), order[id(it)]))


def pytest_configure(config):
    """Under ``--dist loadfile`` xdist hands out files in collection order only when told not to
    reorder them by their number of tests (its default since 3.6 would start the four-test verl
    smoke near the end)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    _long_first(items)
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def run_cli(
    *args: str,
    cwd: Path | None = None,
    env: dict | None = None,
    timeout: float = 600,
    input: str | None = None,
):
    """Run the real `poise-git` entry point (``python -m engine``) and return the CompletedProcess."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("COLUMNS", "200")
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "engine", *args],
        cwd=cwd or REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
    )


class _Captured(io.StringIO):
    """stdout / stderr of an in-process run: a pipe as the CLI sees one (not a terminal)."""

    encoding = "utf-8"

    def isatty(self) -> bool:
        return False


def run_cli_inprocess(
    *args: str,
    cwd: Path | None = None,
    env: dict | None = None,
    timeout: float = 600,
    input: str | None = None,
):
    """``poise-git ARGS`` through the real entry point (:func:`engine.cli.main`: secret scrubbing,
    exit codes, signal handlers) in this process, without a Python start-up and the engine's imports
    (about a second a call); returns what :func:`run_cli` returns. Everything the call changes in
    this process (environment, working directory, streams, signal handlers, the CLI's loggers) is
    put back. ``timeout`` is accepted for :func:`run_cli`'s signature; a hang shows as the test's.

    Tests of what only a separate process shows (real pipes, terminal width from ``COLUMNS``,
    signals) call :func:`run_cli`."""
    import logging
    import signal
    import tempfile

    from engine.cli import main
    from engine.cli.logs import PACKAGES, QUIET

    saved_env = dict(os.environ)
    saved_tempdir = tempfile.tempdir  # cached from $TMPDIR at first use
    saved_cwd = os.getcwd()
    saved_streams = (sys.stdin, sys.stdout, sys.stderr)
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    saved_handlers = {s: signal.getsignal(s) for s in sigs}
    loggers = [logging.getLogger(n) for n in (*PACKAGES, *QUIET)]
    saved_loggers = [(lg, lg.level, list(lg.handlers), lg.propagate) for lg in loggers]
    out, err = _Captured(), _Captured()
    code: int | str | None = 0
    try:
        os.environ.setdefault("COLUMNS", "200")
        os.environ.update(env or {})
        tempfile.tempdir = None
        if cwd is not None:
            os.chdir(cwd)
        sys.stdin, sys.stdout, sys.stderr = io.StringIO(input or ""), out, err
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        tempfile.tempdir = saved_tempdir
        for s, h in saved_handlers.items():
            signal.signal(s, h)
        for lg, level, handlers, propagate in saved_loggers:
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate = propagate
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): Python prints it and exits 1
        err.write(f"{code}\n")
        code = 1
    return subprocess.CompletedProcess(
        ["poise-git", *args], code, stdout=out.getvalue(), stderr=err.getvalue()
    )


@pytest.fixture
def cli():
    """The CLI in this process (:func:`run_cli_inprocess`); :func:`run_cli` runs it as a process."""
    return run_cli_inprocess


@pytest.fixture
def sweep(monkeypatch):
    """``benchmarks/bench_protocol_sweep.py`` as a module, imported afresh from the benchmarks dir."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    sys.modules.pop("bench_protocol_sweep", None)
    import bench_protocol_sweep

    return bench_protocol_sweep


@pytest.fixture
def archive(tmp_path):
    from engine.archive.store import Archive

    return Archive.init(tmp_path / "exp")


def scratch_left_by_a_killed_process(tmp: Path) -> Path:
    """A sandbox scratch directory made in ``tmp`` the way the engine makes one, by a process then
    SIGKILLed inside it: its lock file is there and no process holds it."""
    code = (
        "import sys, time\n"
        "from engine.scratch import SANDBOX_PREFIX, scratch_dir\n"
        "with scratch_dir(SANDBOX_PREFIX, dir=sys.argv[1]) as d:\n"
        "    print(d, flush=True)\n"
        "    time.sleep(600)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with subprocess.Popen(
        [sys.executable, "-c", code, str(tmp)], stdout=subprocess.PIPE, text=True, env=env
    ) as proc:
        left = Path(proc.stdout.readline().strip())
        proc.kill()
    return left


def mark_verified(archive, name: str) -> None:
    """Record a passing verification.json for ``name``'s current algorithm.py without running it:
    what a candidate that behaves during verification (or a static-check miss) would get."""
    import hashlib
    import json

    src = archive.algorithm(name)
    rec = {"ok": True, "reason": "", "algorithm_sha256": hashlib.sha256(src.encode()).hexdigest()}
    archive.commit_files(
        name,
        {"verification.json": json.dumps(rec) + "\n"},
        subject=f"poise: {name} verified (test)",
        status="verified",
    )


def require_boundary():
    """The OS boundary (bubblewrap), or skip — except under CI (``$CI`` set), where its absence fails.

    Tests that run hostile code need it: in the weak mode such code can reach this very process."""
    from engine.sandbox import boundary

    try:
        b = boundary.resolve(os.environ.get("POISE_TEST_FORCE_MODE", "auto"))
    except boundary.SandboxUnavailable as exc:
        note = str(exc)
    else:
        if b.isolated or os.environ.get("POISE_TEST_FORCE_MODE"):
            return b
        note = b.note
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the boundary's tests under bubblewrap: {note}")
    pytest.skip(f"needs bubblewrap (ci/setup.sh installs it): {note}")


_HOLD_NODE = """
import sys
from engine.archive.store import Archive
from engine.operators.evaluation_lock import node_evaluation
with node_evaluation(Archive(sys.argv[1]), sys.argv[2]):
    print("held", flush=True)
    sys.stdin.readline()
"""


def node_lock_holder(path, node: str = "grpo") -> subprocess.Popen:
    """Another process holding ``node``'s evaluation lock in the archive at ``path`` until a line
    reaches its stdin (or it is killed); returned once it holds it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD_NODE, str(path), node],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "held"
    return proc
