"""The proxy on a GPU: the engine decides the device, the sandbox lets the GPU in only when asked.

The first tests run everywhere: the sandbox's GPU settings (rlimits, the device nodes bound into the
child's /dev) and the worker refusing cuda where no GPU is visible. The ``gpu`` tests train and score
the tiny preset on cuda, in this process and behind the sandbox (skipped without a CUDA GPU).

Imports only the project's own packages, torch and the standard library: a GPU machine needs nothing
else to run this file."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_boundary

from engine.sandbox import boundary
from engine.sandbox.limits import MB, Limits
from engine.sandbox.runner import run_sandboxed

REPO = Path(__file__).resolve().parents[1]
ROOT_ALGORITHM = REPO / "trainer_template" / "algorithm.py"
FAKE_NODES = ("nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1", "nvidiactl")


def _bwrap() -> boundary.Boundary:
    return boundary.Boundary("bwrap", bwrap=shutil.which("bwrap") or "bwrap")


@pytest.fixture
def fake_dev(tmp_path):
    """A /dev stand-in with NVIDIA-like nodes (plain files), nvidia-caps/ and unrelated entries."""
    for name in (*FAKE_NODES, "null", "sda", "nvme0"):
        (tmp_path / name).write_text("")
    (tmp_path / "nvidia-caps").mkdir()
    (tmp_path / "nvidia-caps" / "nvidia-cap1").write_text("")
    (tmp_path / "nvidia-other").mkdir()  # a directory that is not nvidia-caps: not bound
    return tmp_path


def test_gpu_limits_bound_the_data_segment_instead_of_the_address_space():
    plain = Limits(memory_mb=2048).rlimits()
    gpu = Limits(memory_mb=2048, gpu=True).rlimits()
    assert plain["RLIMIT_AS"] == (2048 * MB, 2048 * MB) and "RLIMIT_DATA" not in plain
    assert gpu["RLIMIT_DATA"] == (2048 * MB, 2048 * MB) and "RLIMIT_AS" not in gpu
    same = set(plain) - {"RLIMIT_AS"}
    assert {k: gpu[k] for k in same} == {k: plain[k] for k in same}
    assert Limits().gpu is False


def test_gpu_device_nodes_are_the_nvidia_nodes_and_the_caps_directory(fake_dev):
    got = boundary.gpu_device_nodes(str(fake_dev))
    assert got == sorted(str(fake_dev / n) for n in (*FAKE_NODES, "nvidia-caps"))
    assert boundary.gpu_device_nodes(str(fake_dev / "nvidia-other")) == []


def test_bwrap_binds_the_gpu_nodes_into_dev_only_when_asked(fake_dev):
    plain = boundary.bwrap_command(_bwrap(), None, 16, dev_root=str(fake_dev))
    assert "--dev-bind-try" not in plain
    cmd = boundary.bwrap_command(_bwrap(), None, 16, gpu=True, dev_root=str(fake_dev))
    binds = [tuple(cmd[i + 1 : i + 3]) for i, a in enumerate(cmd) if a == "--dev-bind-try"]
    names = sorted((*FAKE_NODES, "nvidia-caps"))
    assert binds == [(str(fake_dev / n), f"/dev/{n}") for n in names]
    first = cmd.index("--dev-bind-try")
    assert cmd.index("--dev") < first
    assert first + 3 * len(names) == cmd.index("--remount-ro")  # the binds, then /dev read-only
    assert cmd[:first] == plain[:first] and cmd[first + 3 * len(names) :] == plain[first:]
    # the real /dev: one bind per node this machine has (none on a CPU machine)
    real = boundary.bwrap_command(_bwrap(), None, 16, gpu=True)
    assert real.count("--dev-bind-try") == len(boundary.gpu_device_nodes())


def test_bubblewrap_shows_the_bound_nodes_in_a_read_only_dev(fake_dev):
    b = require_boundary()
    probe = (
        "import os\n"
        "print(sorted(n for n in os.listdir('/dev') if n.startswith('nvidia')))\n"
        "print(sorted(os.listdir('/dev/nvidia-caps')))\n"
        "try:\n"
        "    open('/dev/planted', 'w')\n"
        "except OSError:\n"
        "    print('read-only')\n"
    )
    cmd = boundary.bwrap_command(b, None, 16, gpu=True, dev_root=str(fake_dev))
    out = subprocess.run(
        [*cmd, sys.executable, "-S", "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        env={},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        repr(sorted((*FAKE_NODES, "nvidia-caps"))),
        repr(["nvidia-cap1"]),
        "read-only",
    ]


def test_a_gpu_child_gets_the_data_limit_and_the_host_nodes():
    b = require_boundary()
    frames: list[dict] = []
    code = (
        "import os, resource\n"
        "CHANNEL.send({'type': 'report', 'result': [resource.getrlimit(resource.RLIMIT_DATA)[0],\n"
        "    resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY,\n"
        "    sorted(n for n in os.listdir('/dev') if n.startswith('nvidia'))]})\n"
    )
    run = run_sandboxed(
        "engine.sandbox.exec_source",
        ["{input}/case.py"],
        limits=Limits(wall_s=30, memory_mb=1024, gpu=True),
        inputs={"case.py": code.encode()},
        on_frame=lambda f, _s: frames.append(f),
        boundary=b,
    )
    assert run.ok, run.reason()
    host = sorted(Path(p).name for p in boundary.gpu_device_nodes())
    assert frames[0]["result"] == [1024 * MB, True, host]


def test_the_worker_refuses_cuda_where_no_gpu_is_visible(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer_template.proxy.worker", "run", "--preset", "tiny"]
        + ["--device", "cuda", "--algorithm", str(ROOT_ALGORITHM), "--seed", "0"]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode != 0 and not out.exists(), (proc.returncode, proc.stdout)
    assert "runs on cuda but this process sees no CUDA GPU" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.gpu
def test_tiny_preset_trains_and_scores_on_cuda_in_process():
    from trainer_template.proxy import evalset
    from trainer_template.proxy.protocol import get_protocol
    from trainer_template.proxy.worker import train_policy

    cpu = get_protocol("tiny")
    auto = dataclasses.replace(cpu, accelerator="auto")
    assert auto.device() == "cuda" and auto.hash() != cpu.hash()
    source = ROOT_ALGORITHM.read_text(encoding="utf-8")
    for protocol, device in ((auto, None), (cpu, "cuda")):  # the explicit device wins
        model, reason = train_policy(protocol, source, "grpo", 0, device=device)
        assert not reason, reason
        assert all(p.is_cuda for p in model.parameters())
        metrics = evalset.evaluate(model, protocol.eval, 0)
        assert metrics and all(math.isfinite(v) for v in metrics.values()), metrics


def _cuda_seed(mode: str, gpu: bool) -> dict:
    """One tiny-preset seed of the root through the sandboxed ``run_seed``, told to use cuda, under
    the boundary ``mode`` (skipped where it cannot run) with ``Limits(gpu=gpu)``. The tiny preset's
    accelerator is "cpu": the engine's device decides."""
    from engine.operators.evaluate_seed import run_seed
    from trainer_template.proxy.protocol import get_protocol
    from trainer_template.proxy.warmstart import ensure_warmstart

    try:
        b = boundary.resolve(mode)
    except boundary.SandboxUnavailable as exc:
        pytest.skip(str(exc))
    protocol = get_protocol("tiny")
    return run_seed(
        ROOT_ALGORITHM.read_text(encoding="utf-8"),
        "grpo",
        0,
        "tiny",
        protocol.rl.steps,
        ensure_warmstart(protocol).resolve(),
        Limits(wall_s=300, cpu_s=450, memory_mb=4096, gpu=gpu),
        boundary=b,
        device="cuda",
    )


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_a_sandboxed_seed_trains_and_scores_on_cuda(mode):
    data = _cuda_seed(mode, gpu=True)
    assert data["status"] == "ok", data["reason"]
    assert data["device"] == "cuda"
    assert data["metrics"] and all(math.isfinite(v) for v in data["metrics"].values())


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_a_seed_fails_loudly_when_the_sandbox_hides_the_gpu(mode):
    """Without ``gpu``, bubblewrap's /dev has no NVIDIA nodes and RLIMIT_AS stops CUDA's start: the
    child names cuda and fails instead of training on the CPU."""
    data = _cuda_seed(mode, gpu=False)
    assert data["status"] == "failed" and not data["metrics"]
    assert "runs on cuda but this process sees no CUDA GPU" in data["reason"], data["reason"]


@pytest.mark.gpu
def test_a_cuda_result_names_the_gpu_model_it_trained_on():
    import torch

    from engine.operators.evaluate import device_model
    from engine.sandbox.process import trusted_env

    model = device_model("cuda", trusted_env())
    assert model == f"cuda:{torch.cuda.get_device_name(0)}" and model != "cuda:unknown"
    assert device_model("cpu", trusted_env()) == "cpu"
