"""Hostile candidates through the real flows: evaluation on the smoke proxy, verification, signals.

Candidates that would not pass the static check get a passing verification record directly
(``mark_verified``: a static-check miss, or a candidate that behaves while it is verified); the
boundary and the trusted scorer must still leave the node ``failed`` with its reason, or record
honest numbers. Each evaluation fails at its first RL step, so a case costs three process starts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import REPO, mark_verified, require_boundary

from engine.archive.store import Archive
from trainer_template import ALGORITHM_FILE

ROOT = ALGORITHM_FILE.read_text()
BODY_AT = "    scores = batch.rewards.to(torch.float32)\n"


def hostile(head: str = "", first: str = "") -> str:
    """The root's algorithm.py with module-level ``head`` and ``first`` run at the top of
    compute_advantages only when the batch is a training batch (16 prompts x 8 = 128 samples)."""
    src = ROOT.replace("# ALGO LOGIC", head + "\n\n# ALGO LOGIC", 1)
    if first:
        block = "".join(f"        {ln}\n" for ln in first.strip("\n").splitlines())
        src = src.replace(BODY_AT, "    if batch.size == 128:\n" + block + BODY_AT, 1)
    return src


# a replacement of the harness's training loop that trains nothing but sends every step frame the
# engine counts (a seed reporting success before its last RL step fails), so that the defences
# after training are the ones tested
FAKE_STEPS = (
    "def _fake_steps(rl_settings, on_step):\n"
    "    for s in range(rl_settings.steps):\n"
    "        on_step(s)\n"
)

CASES = {
    "forged-result-then-systemexit": (
        hostile(
            "import json, os, sys",
            "for p in ('seed0.json', '/tmp/seed0.json', os.path.expanduser('~/seed0.json')):\n"
            "    try:\n"
            "        json.dump({'status': 'ok', 'metrics': {'overall': 0.99}}, open(p, 'w'))\n"
            "    except OSError:\n"
            "        pass\n"
            "raise SystemExit(0)",
        ),
        "SystemExit",
    ),
    "kill-parent": (
        hostile(
            "import os, signal",
            "for pid in (os.getppid(), 1):\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n"
            "    except OSError:\n"
            "        pass\n"
            "os.kill(os.getpid(), signal.SIGKILL)",
        ),
        "killed by SIGKILL",
    ),
    "stop-parent-and-self": (
        hostile(
            "import os, signal",
            "for pid in (os.getppid(), 1):\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGSTOP)\n"
            "    except OSError:\n"
            "        pass\n"
            "os.kill(os.getpid(), signal.SIGSTOP)",
        ),
        "wall-clock limit",
    ),
    "exit-0-without-result": (hostile("import os", "os._exit(0)"), "exited without a result"),
    "malformed-frame": (
        hostile(
            "import os", "os.write(int(os.environ['POISE_CHANNEL_FD']), b'\\x00\\x00\\x00\\x03abc')"
        ),
        "malformed message",
    ),
    "forged-metrics-frame": (
        hostile(
            "from trainer_template.channel import Channel",
            "Channel.from_env().send({'type': 'metrics', 'metrics': {'overall': 0.99}})",
        ),
        "malformed message",
    ),
    "nan-weights": (
        hostile(
            "import sys\n"
            + FAKE_STEPS
            + "def _poison(model, module, cfg, rl, seed, *a, on_step, **k):\n"
            "    _fake_steps(rl, on_step)\n"
            "    for p in model.parameters():\n"
            "        p.data.fill_(float('nan'))\n"
            "    return model\n"
            "sys.modules['trainer_template.proxy.rl'].train = _poison"
        ),
        "holds NaN/inf",
    ),
    "pickle-payload-checkpoint": (
        hostile(
            "import sys\n"
            "class _Boom:\n"
            "    def __reduce__(self):\n"
            "        return (print, ('pwned',))\n"
            "_torch = sys.modules['torch']\n"
            "_save = _torch.save\n"
            "_torch.save = lambda obj, f, *a, **k: _save({'x': _Boom()}, f)\n"
            + FAKE_STEPS
            + "def _skip(model, module, cfg, rl, seed, *a, on_step, **k):\n"
            "    _fake_steps(rl, on_step)\n"
            "    return model\n"
            "sys.modules['trainer_template.proxy.rl'].train = _skip"
        ),
        "not a weights-only checkpoint",
    ),
    "defeat-device-nan-in-training": (
        hostile("", "return batch.rewards.to(torch.float32) / 0.0"),
        "NaN",
    ),
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    require_boundary()
    mp = pytest.MonkeyPatch()
    mp.setenv("POISE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    arch = Archive.init(tmp_path_factory.mktemp("lab") / "exp")
    for name, (src, _) in CASES.items():
        arch.spawn("grpo", name, algorithm=src)
        mark_verified(arch, name)
    arch.spawn(
        "grpo",
        "patched-harness",
        algorithm=hostile(
            "import sys\n"
            "import trainer_template.proxy.evalset\n"
            "_m = sys.modules\n"
            "_m['trainer_template.proxy.evalset'].evaluate = lambda *a, **k: {'overall': 0.99}\n"
            + FAKE_STEPS
            + "def _skip(model, module, cfg, rl, seed, *a, on_step, **k):\n"
            "    _fake_steps(rl, on_step)\n"
            "    return model\n"
            "_m['trainer_template.proxy.rl'].train = _skip"
        ),
    )
    mark_verified(arch, "patched-harness")
    yield arch
    mp.undo()


@pytest.fixture(scope="module")
def outcomes(lab):
    from concurrent.futures import ThreadPoolExecutor

    from engine.operators.evaluate import evaluate_node

    def one(name):
        return evaluate_node(lab, name, seeds=1, preset="smoke", timeout_s=25)

    names = [*CASES, "patched-harness"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(names, pool.map(one, names)))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_evaluation_leaves_the_node_failed_with_its_reason(lab, outcomes, name):
    result = outcomes[name]
    node = Archive(lab.path).nodes("proxy/smoke")[name]
    assert result.status == "failed" and CASES[name][1] in result.reason, result.reason
    assert node.status == "failed" and CASES[name][1] in node.trailer("Poise-Reason")
    assert not result.metrics and node.overall is None
    assert all(n.status != "evaluating" for n in Archive(lab.path).nodes().values())
    assert lab.fsck()


@pytest.mark.slow
def test_patched_harness_changes_no_number(lab, outcomes):
    """The candidate replaced the harness's own evaluation (and skipped training, sending every
    step frame) in its process: the numbers are the trusted scorer's, of the untrained warm start."""
    result = outcomes["patched-harness"]
    assert result.status == "evaluated", result.reason
    m = result.metrics
    assert m["overall"] != 0.99 and 0.0 < m["overall"] < 0.9 and "hard/pass@8" in m
    assert not list(REPO.glob("seed*.json")) and not os.path.exists("/tmp/seed0.json")


@pytest.mark.slow
def test_defeat_device_passes_verification_but_not_evaluation(lab):
    """Static-clean code that behaves on the verifier's batches: verification cannot see it; the
    evaluation (trusted numbers) fails it. Verification here is real."""
    from engine.operators.verify import verify_source

    res = verify_source(CASES["defeat-device-nan-in-training"][0], ROOT)
    assert res.ok, res.reason


def _wait_for_sandboxes(pid: int, n: int, timeout: float = 180.0) -> bool:
    """Wait until ``pid`` has ``n`` sandboxed launchers among its descendants."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = 0
        for c in psutil.Process(pid).children(recursive=True):
            try:
                found += "engine.sandbox.launch" in " ".join(c.cmdline())
            except psutil.Error:
                pass
        if found >= n:
            return True
        time.sleep(0.5)
    return False


def _descendants_gone(pid_list, timeout=10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        alive = [
            p for p in pid_list if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
        ]
        if not alive:
            return True
        time.sleep(0.2)
    return False


def _communicate_or_dump(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """``proc.communicate``; a command still running after ``timeout`` is asked for its threads'
    stacks (SIGUSR1), killed, and the test fails with them."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        for c in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                c.kill()
        proc.kill()
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"still running {timeout:g} s after the signal; its stacks:\n{err}\n{out}")


def _signal_a_thread(pid: int, sig: int) -> None:
    """Deliver ``sig`` to a thread of ``pid`` other than its main one (``tgkill``), as the kernel may
    deliver a signal sent to the process."""
    import ctypes
    import platform

    number = {"x86_64": 234, "aarch64": 131}.get(platform.machine())
    if number is None:
        pytest.skip(f"no tgkill number known for {platform.machine()}")
    tid = next(t.id for t in psutil.Process(pid).threads() if t.id != pid)
    assert ctypes.CDLL(None, use_errno=True).syscall(number, pid, tid, int(sig)) == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, to_thread",
    [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGTERM, True)],
    ids=["SIGTERM", "SIGINT", "SIGTERM-to-a-thread"],
)
def test_signal_to_evaluate_stops_every_child_and_leaves_the_node_resumable(
    tmp_path, sig, to_thread
):
    """Also when the kernel hands the signal to a thread other than the main one: the main thread,
    waiting on the seeds' threads, must still wake and run the handler."""
    require_boundary()
    arch = Archive.init(tmp_path / "exp")
    arch.spawn("grpo", "slow", algorithm=hostile("import time", "time.sleep(600)"))
    mark_verified(arch, "slow")
    env = dict(os.environ, PYTHONPATH=str(REPO), POISE_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", "evaluate", "slow", "--preset", "smoke", "--seeds", "2",
         "-C", str(arch.path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert _wait_for_sandboxes(proc.pid, 2), "the training children never started"
    assert arch.node("slow").status == "evaluating"
    kids = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    if to_thread:
        _signal_a_thread(proc.pid, sig)
    else:
        proc.send_signal(sig)
    out, err = _communicate_or_dump(proc, 60)
    assert proc.returncode == 128 + sig, out + err  # 130 (SIGINT), 143 (SIGTERM)
    assert "Traceback" not in err
    assert _descendants_gone(kids), "orphaned children"
    node = Archive(arch.path).node("slow")
    assert node.status == "verified" and "interrupted" in node.trailer("Poise-Reason")
    assert arch.fsck()


@pytest.mark.slow
def test_sigterm_to_verify_leaves_no_orphan(tmp_path):
    require_boundary()
    arch = Archive.init(tmp_path / "exp")
    r = subprocess.run(
        [sys.executable, "-m", "engine", "spawn", "grpo", "--name", "loops", "--no-verify",
         "--edit", str(_write(tmp_path / "e.py", _LOOP_EDIT)), "-C", str(arch.path)],
        env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    env = dict(os.environ, PYTHONPATH=str(REPO), POISE_VERIFY_CALL_S="600")
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", "verify", "loops", "-C", str(arch.path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert _wait_for_sandboxes(proc.pid, 1)
    time.sleep(2)
    kids = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGTERM)
    out, err = _communicate_or_dump(proc, 60)
    assert proc.returncode == 143 and "Traceback" not in err, out + err
    assert _descendants_gone(kids)
    assert Archive(arch.path).node("loops").status == "spawned" and arch.fsck()


@pytest.mark.slow
def test_ctrl_c_during_spawn_verification_says_how_to_resume(tmp_path):
    """`spawn --edit` commits the node, then verifies it: interrupted there, the node stays
    spawned (unverified) and the message says which command finishes the job."""
    require_boundary()
    arch = Archive.init(tmp_path / "exp")
    env = dict(os.environ, PYTHONPATH=str(REPO), POISE_VERIFY_CALL_S="600")
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", "spawn", "grpo", "--name", "loops",
         "--edit", str(_write(tmp_path / "e.py", _LOOP_EDIT)), "-C", str(arch.path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert _wait_for_sandboxes(proc.pid, 1)
    kids = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGINT)
    out, err = _communicate_or_dump(proc, 60)
    assert proc.returncode == 130 and "Traceback" not in err, out + err
    assert "`poise-git verify loops` verifies it" in " ".join(err.split()), err
    assert _descendants_gone(kids)
    assert Archive(arch.path).node("loops").status == "spawned" and arch.fsck()


_LOOP_EDIT = (
    "def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:\n"
    "    while True:\n"
    "        pass\n"
)


def _write(path, text):
    path.write_text(text)
    return path
