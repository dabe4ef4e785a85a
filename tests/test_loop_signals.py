"""A signal to `poise-git run` while its workers evaluate: the run stops with the signal's exit
status, and the temporary directories its workers made are gone when it exits (not left for the
next run or `gc`). Real runs on the tiny preset, real signals."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--preset", "tiny", "--seeds", "1", "--proposer", "offline", "--eval-timeout", "240"]

pytestmark = pytest.mark.slow  # `poise-git run` end to end (a minute on 2 cores)


def _env(tmpdir: Path) -> dict:
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=pythonpath, TMPDIR=str(tmpdir))


@pytest.fixture(scope="module")
def evaluated_root(tmp_path_factory):
    """An archive whose root is evaluated on the tiny preset, copied by each test."""
    base = tmp_path_factory.mktemp("root")
    path, tmpdir = base / "exp", base / "tmp"
    tmpdir.mkdir()
    for args in (
        ["init", str(path)],
        ["evaluate", "grpo", "-C", str(path), "--preset", "tiny", "--seeds", "1"],
    ):
        p = subprocess.run(
            [sys.executable, "-m", "engine", *args],
            cwd=REPO,
            env=_env(tmpdir),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return path


def _worker_training(run: psutil.Process) -> bool:
    """Whether one of the run's evaluation workers has started a sandboxed child (a seed)."""
    for worker in run.children(recursive=True):
        try:
            if "engine.loop.executor" in " ".join(worker.cmdline()) and worker.children():
                return True
        except psutil.Error:
            continue
    return False


@pytest.mark.parametrize(
    "sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_a_signal_during_evaluation_leaves_no_temporary_directory(
    evaluated_root, tmp_path, sig, code
):
    exp = tmp_path / "exp"
    shutil.copytree(evaluated_root, exp, symlinks=True)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    cmd = [sys.executable, "-m", "engine", "run", "-C", str(exp), "--rounds", "1"]
    cmd += ["--parents", "1", "--population", "1", "--no-report", *SMALL]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=_env(tmpdir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    sent = False
    try:
        run = psutil.Process(proc.pid)
        deadline = time.time() + 400
        while time.time() < deadline and proc.poll() is None:
            if _worker_training(run):
                time.sleep(1)
                if any(p.name.startswith("poise-sbx-") for p in tmpdir.iterdir()):
                    kids = run.children(recursive=True)
                    proc.send_signal(sig)  # to the run alone, as a terminal's Ctrl-C or `kill`
                    sent = True
                    break
            time.sleep(0.2)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert sent, "the run never reached an evaluation: " + err[-2000:]
    assert proc.returncode == code, (proc.returncode, err[-3000:])
    assert "interrupted" in err and "Traceback" not in err, err[-3000:]
    _, alive = psutil.wait_procs(kids, timeout=10)
    assert not alive, f"left running: {alive}"
    left = [p.name for p in tmpdir.iterdir() if p.name.startswith("poise-")]
    assert not left, f"left in $TMPDIR: {left}"


def test_the_run_lock_is_held_through_the_held_out_confirmation(evaluated_root, tmp_path):
    """The confirmation after the rounds is part of the run: a second `run --resume` started while
    it measures is refused (before, the lock was released when the rounds ended, and the second
    run measured and recorded the same confirmation again)."""
    exp = tmp_path / "exp"
    shutil.copytree(evaluated_root, exp, symlinks=True)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(_env(tmpdir), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "engine", "run", "-C", str(exp), "--rounds", "1"]
    cmd += ["--parents", "1", "--population", "1", "--confirm-seeds", "1", "--no-report", *SMALL]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    second = None
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "held-out seeds" in line:
                second = subprocess.run(
                    [sys.executable, "-m", "engine", "run", "-C", str(exp), "--resume"],
                    cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                )  # fmt: skip
                break
        rest, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(lines) + (rest or "")
    assert second is not None, "the run never confirmed: " + out[-3000:]
    assert second.returncode == 1, second.stdout[-2000:] + second.stderr[-2000:]
    assert "another `poise-git run` is running" in second.stderr, second.stderr
    assert proc.returncode == 0, out[-3000:]
    assert out.count("held-out confirmation:") == 1, out[-3000:]
    log = subprocess.run(
        ["git", "-C", str(exp), "log", "--all", "--format=%s"], capture_output=True, text=True
    ).stdout
    assert log.count("held-out confirmation of") == 1, log
