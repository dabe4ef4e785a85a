"""A corpus of hostile / broken candidates that verification must reject, each with the right reason.

Static cases never execute; runtime cases run the generated suite in the limited subprocess."""

from __future__ import annotations

import pytest

from engine.errors import PoiseError
from engine.operators.implement import build_source
from engine.operators.verify import VerifyLimits, verify_source
from trainer_template import ALGORITHM_FILE

ROOT = ALGORITHM_FILE.read_text()
SIG = "def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:\n"


def adv(body: str, head: str = "") -> str:
    """An edit replacing compute_advantages with ``body`` (indented), after ``head`` (top-level lines)."""
    lines = "".join(f"    {ln}\n" for ln in body.strip("\n").splitlines())
    return head + SIG + lines


def loss_edit(tail: str) -> str:
    return (
        "def policy_loss(log_prob, old_log_prob, advantages, response_mask, cfg,\n"
        "                ref_log_prob=None, entropy=None, state=None):\n"
        "    pg, _ = ppo_clip_loss(log_prob, old_log_prob, advantages, cfg.clip_ratio_low, cfg.clip_ratio_high)\n"
        "    loss = agg_loss(pg, response_mask, cfg.loss_agg_mode)\n" + tail
    )


OK = "return batch.rewards.to(torch.float32) - batch.rewards.to(torch.float32).mean()"
STATIC = [
    ("import-os", adv(OK, "import os\n"), "import of 'os'"),
    ("import-subprocess", adv(OK, "import subprocess\n"), "import of 'subprocess'"),
    ("import-socket", adv(OK, "import socket\n"), "import of 'socket'"),
    ("from-os", adv(OK, "from os import path\n"), "import from 'os'"),
    ("import-importlib", adv(OK, "import importlib\n"), "import of 'importlib'"),
    ("import-sys", adv(OK, "import sys\n"), "import of 'sys'"),
    ("import-ctypes", adv(OK, "import ctypes\n"), "import of 'ctypes'"),
    ("import-pickle", adv(OK, "import pickle\n"), "import of 'pickle'"),
    ("import-builtins", adv(OK, "import builtins\n"), "import of 'builtins'"),
    (
        "torch-multiprocessing",
        adv(OK, "import torch.multiprocessing\n"),
        "import of 'torch.multiprocessing'",
    ),
    (
        "loader-import",
        adv(OK, "from trainer_template import loader\n"),
        "import from 'trainer_template'",
    ),
    ("star-import", adv(OK, "from math import *\n"), "from math import *"),
    ("dunder-import", adv("m = __import__('os')\n" + OK), "'__import__'"),
    ("eval", adv("x = eval('1')\n" + OK), "'eval'"),
    ("exec", adv("exec('x = 1')\n" + OK), "'exec'"),
    ("compile", adv("c = compile('1', 'f', 'eval')\n" + OK), "'compile'"),
    ("open-file", adv("open('/etc/passwd').read()\n" + OK), "'open'"),
    ("getattr-private", adv("c = getattr(torch, '_C')\n" + OK), "getattr() needs a constant"),
    (
        "getattr-dynamic",
        adv("name = 'rewards'\nr = getattr(batch, name)\n" + OK),
        "getattr() needs a constant",
    ),
    ("globals", adv("g = globals()\n" + OK), "'globals'"),
    ("setattr", adv("setattr(cfg, 'eps', 0.0)\n" + OK), "'setattr'"),
    ("vars", adv("v = vars(cfg)\n" + OK), "'vars'"),
    (
        "subclasses-escape",
        adv("s = ().__class__.__bases__[0].__subclasses__()\n" + OK),
        "dunder attribute",
    ),
    ("builtins-name", adv("b = __builtins__\n" + OK), "'__builtins__'"),
    ("torch-load", adv("w = torch.load('weights.pt')\n" + OK), "torch.load is not allowed"),
    ("torch-save", adv("torch.save(batch.rewards, 'x.pt')\n" + OK), "torch.save is not allowed"),
    ("torch-hub", adv("m = torch.hub.load('a/b', 'c')\n" + OK), "torch.hub"),
    ("torch-from-file", adv("t = torch.from_file('/dev/zero', size=10)\n" + OK), "torch.from_file"),
    ("load-library", adv("torch.ops.load_library('x.so')\n" + OK), "torch.ops"),
    ("cpp-extension", adv("torch.utils.cpp_extension.load_inline('x', '')\n" + OK), "torch.utils"),
    ("global-state", adv("torch.set_default_dtype(torch.float64)\n" + OK), "set_default_dtype"),
    ("manual-seed", adv("torch.manual_seed(0)\n" + OK), "manual_seed"),
    ("storage", adv("s = batch.rewards.untyped_storage()\n" + OK), "untyped_storage"),
    ("global-stmt", adv("global STATE\nSTATE = 1\n" + OK), "global / nonlocal"),
    ("module-level-code", "print('side effect at import')\n" + adv(OK), "and assignments"),
    ("bare-except", adv("try:\n    pass\nexcept:\n    pass\n" + OK), "swallow the sandbox"),
    (
        "base-exception",
        adv("try:\n    pass\nexcept BaseException:\n    pass\n" + OK),
        "swallow the sandbox",
    ),
    ("foreign-decorator", "@some_decorator\n" + adv(OK), "decorator"),
    ("async", "async def helper():\n    return 1\n\n\n" + adv(OK), "async"),
    (
        "signature-changed",
        "def compute_advantages(batch, cfg, extra=1):\n    return batch.rewards\n",
        "signature",
    ),
    (
        "loss-signature-changed",
        "def policy_loss(log_prob, advantages, cfg):\n    return log_prob.sum(), {}\n",
        "signature",
    ),
    ("syntax-error", "def compute_advantages(batch, cfg):\n    return (\n", "syntax error"),
    ("huge-constant", adv("x = '" + "a" * 20_500 + "'\n" + OK), "longer than 20 kB"),
]
RUNTIME = [
    (
        "nan",
        adv("s = batch.rewards.to(torch.float32)\nreturn (s - s.mean()) / (s.std() * 0.0)"),
        "non-finite",
    ),
    ("infinite-loop", adv("while True:\n    pass"), "longer than"),
    (
        "swallowed-loop",
        adv("while True:\n    try:\n        pass\n    except Exception:\n        pass"),
        "longer than",
    ),
    (
        "unbounded-allocation",
        adv("chunks = []\nwhile True:\n    chunks.append(torch.empty(2 ** 26))"),
        "memory",
    ),
    ("mutates-input", adv("batch.rewards.mul_(2.0)\n" + OK), "mutated"),
    ("wrong-shape", adv("return batch.rewards.to(torch.float32).unsqueeze(0)"), "shape"),
    (
        "non-deterministic",
        adv("s = batch.rewards.to(torch.float32)\nreturn s - s.mean() + 1e-3 * torch.rand_like(s)"),
        "not deterministic",
    ),
    ("detached-loss", loss_edit("    return loss.detach(), {}\n"), "not differentiable"),
    ("raises", adv("raise ValueError('boom: unsupported batch')"), "boom"),
]
LIMITS = VerifyLimits(timeout_s=60, cpu_s=60, memory_mb=1500, call_s=1.0)


def rejection(edit: str) -> str:
    try:
        src = build_source(ROOT, edit)
    except PoiseError as exc:
        return str(exc)
    res = verify_source(src, ROOT, ("correct_above_wrong",), LIMITS)
    assert not res.ok, "a hostile candidate was verified"
    return res.reason


def test_corpus_size():
    assert len(STATIC) + len(RUNTIME) >= 30


@pytest.mark.parametrize("edit,why", [c[1:] for c in STATIC], ids=[c[0] for c in STATIC])
def test_static_rejection(edit, why):
    reason = rejection(edit)
    assert why.lower() in reason.lower(), reason


@pytest.fixture(scope="module")
def runtime_reasons():
    """Every runtime case verified once, three sandboxes at a time (each pays a torch import)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip([c[0] for c in RUNTIME], pool.map(rejection, [c[1] for c in RUNTIME])))


@pytest.mark.slow  # every runtime case in its own sandbox, ~25 s of CPU
@pytest.mark.parametrize("case,why", [(c[0], c[2]) for c in RUNTIME], ids=[c[0] for c in RUNTIME])
def test_runtime_rejection(runtime_reasons, case, why):
    reason = runtime_reasons[case]
    assert why.lower() in reason.lower() or (why == "memory" and "allocate" in reason.lower()), (
        reason
    )


def test_the_baseline_itself_passes():
    res = verify_source(ROOT, ROOT, ("correct_above_wrong", "rare_success_larger"), LIMITS)
    assert res.ok, res.reason
    assert len(res.report["fingerprint"]) > 100


@pytest.mark.parametrize(
    "tail", ["print('at import')\n", "for i in range(3):\n    pass\n", "if True:\n    import os\n"]
)
def test_whole_file_module_level_code_is_rejected(tail):
    from engine.operators.static_check import StaticCheckError, static_check

    with pytest.raises(StaticCheckError, match="module level"):
        static_check(ROOT + "\n" + tail, ROOT)
