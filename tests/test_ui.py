"""``poise-git ui``: serves the archive's own MLflow store; Ctrl-C (or a `kill`, or a closed terminal)
stops every process it started (the MLflow server and its workers) and frees the port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_is_free(port: int) -> bool:
    """Nothing listens on ``port`` (a new server, binding with SO_REUSEADDR as servers do, gets it)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.slow  # starts an MLflow server (~10 s of CPU each)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_ui_serves_the_archive_and_stops_everything_it_started(archive, sig):
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", "ui", "-C", str(archive.path), "--port", str(port)],
        cwd=archive.path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the test signals the CLI alone, as a terminal's Ctrl-C would first
    )
    started: list[psutil.Process] = []
    try:
        deadline, up = time.time() + 120, False
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    up = r.status == 200
                    break
            except OSError:
                time.sleep(0.5)
        assert up, f"the MLflow UI did not come up (exit status {proc.poll()})"
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/experiments/search?max_results=10",
            timeout=10,
        ) as r:
            assert r.status == 200
        started = psutil.Process(proc.pid).children(recursive=True)
        assert started, "the UI started no server process"
        proc.send_signal(sig)  # to the CLI alone: it must take its children down itself
        assert proc.wait(timeout=60) == 0
        gone, alive = psutil.wait_procs(started, timeout=30)
        assert not alive, f"still running after Ctrl-C: {[p.pid for p in alive]}"
        assert _port_is_free(port)
        assert (archive.path / "mlflow.db").is_file()  # the archive's own store served
    finally:
        for p in [*started, psutil.Process(proc.pid)] if proc.poll() is None else started:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        proc.wait(timeout=30)


def test_a_port_in_use_is_one_error_line_not_a_url_that_serves_something_else(archive):
    """Another server on the port: `ui` says so and exits 1 before starting MLflow (which would log
    the bind failure and exit 0 after the URL of the other server was printed)."""
    from conftest import run_cli

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        start = time.monotonic()
        p = run_cli("ui", "--port", str(port), "-C", str(archive.path), timeout=120)
        took = time.monotonic() - start
    assert p.returncode == 1, (p.stdout, p.stderr)
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and f"127.0.0.1:{port}" in err[0], p.stderr
    assert "--port" in err[0] and "http://" not in p.stdout
    assert took < 20  # no MLflow server was started
