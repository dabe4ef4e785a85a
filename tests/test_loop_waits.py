"""A run's worker that finds its node being evaluated by another process (a hand `poise-git
evaluate`): it waits without its own wall clock running, then takes the other's result when it is
this evaluation's, and the run's log says whose result it is. On Ray (`run --ray`), neither the
task's own limit nor the driver's backstop counts the wait."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, mark_verified

from engine.archive.store import Archive

SLEEP_S = 6.0  # per training step of the tiny preset (4 steps): the hand evaluation takes ~25 s
RAY_SLEEP_S = 48.0  # on Ray: ~195 s; the wait must pass ~92 s: ~100 s left for Ray's start-up
RAY_BACKSTOP_S = 1 + 2 * (0.25 + 15) + 60
"""the Ray driver's backstop for --eval-timeout 1: the limit plus twice the grace plus 60 s"""


def _slow_root(tmp_path: Path, cli, sleep_s: float = SLEEP_S) -> Archive:
    """An archive whose root trains like GRPO but sleeps ``sleep_s`` at every step (no CPU spent)."""
    src = (REPO / "trainer_template" / "algorithm.py").read_text()
    src = src.replace(
        "from dataclasses import dataclass\n", "import time\nfrom dataclasses import dataclass\n", 1
    )
    body = "    return grpo_advantages(batch, cfg)\n\n\ndef entropy_coefficient("
    assert body in src
    src = src.replace(body, f"    time.sleep({sleep_s})\n" + body, 1)
    (tmp_path / "slow.py").write_text(src)
    r = cli("init", str(tmp_path / "exp"), "--root", str(tmp_path / "slow.py"))
    assert r.returncode == 0, r.stdout + r.stderr
    arch = Archive(tmp_path / "exp")
    mark_verified(arch, "root")
    return arch


def _hand_evaluation(arch: Archive, *args: str) -> subprocess.Popen:
    """`poise-git evaluate root` in a process of its own, returned once it holds the node's lock."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "engine",
            "evaluate",
            "root",
            "--preset",
            "tiny",
            *args,
            "-C",
            str(arch.path),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lock = arch.path / ".git" / "poise-eval" / "root.lock"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if lock.exists() and lock.read_text().startswith(f"pid {proc.pid},"):
            return proc
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the hand evaluation never took the node's lock")


def _subjects(arch: Archive) -> list[str]:
    return subprocess.run(
        ["git", "-C", str(arch.path), "log", "--format=%s", "poise/root"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()


def _run_beside(cli, arch: Archive, hand: subprocess.Popen, *extra: str):
    """`poise-git run` of one round without candidates (the root alone, at seed 0) while ``hand``
    evaluates the root: the run's result, its own wall time, and the hand evaluation's output."""
    try:
        t0 = time.monotonic()
        r = cli(
            "run",
            "-C",
            str(arch.path),
            "--rounds",
            "1",
            "--budget",
            "candidates=0",
            "--seeds",
            "1",
            "--preset",
            "tiny",
            *extra,
            "--workers",
            "1",
            "--proposer",
            "offline",
        )
        run_s = time.monotonic() - t0
        hand_out = hand.communicate(timeout=300)[0]
    finally:
        hand.kill()
        hand.wait()
    return r, run_s, hand_out


@pytest.mark.slow  # a hand evaluation of ~25 s and a run waiting for it
def test_a_run_waiting_for_a_slow_hand_evaluation_is_not_timed_out_by_the_wait(
    tmp_path, cli, monkeypatch
):
    """The run's worker waited for the lock inside its own wall-clock limit (--eval-timeout plus
    the grace, armed when the worker started): a hand evaluation slower than that limit got the
    node recorded failed by the run before the hand result landed. The wait does not count."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    arch = _slow_root(tmp_path, cli)
    hand = _hand_evaluation(arch, "--seeds", "1")
    r, waited, hand_out = _run_beside(cli, arch, hand, "--eval-timeout", "1")
    assert hand.returncode == 0, hand_out
    assert r.returncode == 0, r.stdout + r.stderr
    # the limit it would have hit: 1 s + min(60 s, 25%) + 15 s from the worker's start
    assert waited > 1 + 0.25 + 15, (waited, r.stdout)
    assert "root failed" not in r.stdout, r.stdout
    assert not [s for s in _subjects(arch) if "failed" in s], _subjects(arch)
    node = arch.node("root")
    assert node.status == "evaluated"
    assert node.results["proxy/tiny"].status == "evaluated"
    # the run's log says whose result it is (before: the usual "evaluated: U … (N s)")
    line = next(ln for ln in r.stdout.splitlines() if "root evaluated" in ln)
    assert "(recorded by another process, which this run waited " in line, line
    assert " s for)" in line, line
    assert "recorded by another process" in (arch.path / ".poise" / "run.log").read_text()


@pytest.mark.slow  # a hand evaluation at 2 seeds, then the run's own at 1
def test_a_run_that_waited_for_another_seed_set_says_it_evaluated_again(tmp_path, cli, monkeypatch):
    """When the result the other process recorded is not this evaluation's (other seeds), the run's
    worker evaluates the node itself, and the log line says so and why."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    r = cli("init", str(tmp_path / "exp"), "--root-name", "root")
    assert r.returncode == 0, r.stdout + r.stderr
    arch = Archive(tmp_path / "exp")
    hand = _hand_evaluation(arch, "--seeds", "2")
    r, _, hand_out = _run_beside(cli, arch, hand)
    assert hand.returncode == 0, hand_out
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "root evaluated" in ln)
    assert (
        "waited " in line and " s for another process's evaluation and evaluated it again: " in line
    ), line
    assert "its result is at seeds [0, 1], not [0]" in line, line
    took = re.search(r"root evaluated: U [\d.]+ \((\d+) s; waited (\d+) s for", line)
    assert took and int(took[1]) >= 1 and int(took[2]) >= 1, line  # its own time, then the wait
    assert list(arch.node("root").results["proxy/tiny"].seeds) == [0]


@pytest.mark.slow  # Ray's start-up, then a wait of more than the driver's backstop (~92 s)
def test_a_ray_task_waiting_for_a_slow_hand_evaluation_is_timed_out_by_neither_clock(
    tmp_path, cli, monkeypatch
):
    """On Ray the wait is left out of two clocks: the task's own limit (as in the worker pool) and
    the driver's backstop for a lost task, which adds the wait the task reports to the executor's
    start clock. The wait here outlasts both; the node is the hand evaluation's, recorded once."""
    pytest.importorskip("ray")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    arch = _slow_root(tmp_path, cli, RAY_SLEEP_S)
    hand = _hand_evaluation(arch, "--seeds", "1")
    r, _, hand_out = _run_beside(cli, arch, hand, "--eval-timeout", "1", "--ray", "local")
    assert hand.returncode == 0, hand_out
    assert r.returncode == 0, r.stdout + r.stderr
    assert "on Ray local" in r.stdout, r.stdout
    assert "root failed" not in r.stdout and "Ray task failed" not in r.stdout, r.stdout
    line = next(ln for ln in r.stdout.splitlines() if "root evaluated" in ln)
    waited = re.search(r"\(recorded by another process, which this run waited (\d+) s for\)", line)
    assert waited, line
    assert int(waited[1]) > RAY_BACKSTOP_S, line  # past both limits, had the wait counted
    subjects = _subjects(arch)
    assert not [s for s in subjects if "failed" in s], subjects
    assert subjects.count("poise: results for root (proxy/tiny)") == 1, subjects
    node = arch.node("root")
    assert node.status == "evaluated"
    assert node.results["proxy/tiny"].status == "evaluated"
    assert "recorded by another process" in (arch.path / ".poise" / "run.log").read_text()
