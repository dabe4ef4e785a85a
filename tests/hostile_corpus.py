"""The hostile corpus as data (tests/test_hostile.py runs it): edits the static check must reject with a
reason, candidates verification must reject at runtime (with and without the static check), and
benign edits that must pass. Each case: (name, edit, a substring of the expected reason)."""

from __future__ import annotations

from engine.operators.verify import VerifyLimits
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
    # getattr / hasattr / type used as values, or with a banned name
    ("getattr-torch-save", adv("f = getattr(torch, 'save')\n" + OK), "getattr() needs"),
    ("getattr-alias", adv("g = getattr\nf = g(torch, 'save')\n" + OK), "not used as a value"),
    ("getattr-walrus", adv("f = (g := getattr)(torch, 'zeros')\n" + OK), "not used as a value"),
    (
        "getattr-reduce",
        adv(
            "f = functools.reduce(getattr, ['nn', 'functional'], torch)\n" + OK,
            "import functools\n",
        ),
        "not used as a value",
    ),
    (
        "getattr-starmap",
        adv("f = list(itertools.starmap(getattr, [(torch, 'os')]))\n" + OK, "import itertools\n"),
        "not used as a value",
    ),
    (
        "getattr-partial",
        adv("f = functools.partial(getattr, torch)\n" + OK, "import functools\n"),
        "not used as a value",
    ),
    ("getattr-default-arg", adv("f = getattr(torch, 'x', getattr)\n" + OK), "not used as a value"),
    ("hasattr-dynamic", adv("k = 'load'\nh = hasattr(torch, k)\n" + OK), "hasattr() needs"),
    ("type-three-args", adv("T = type('T', (), {})\n" + OK), "type() may only"),
    ("type-alias", adv("t = type\n" + OK), "not used as a value"),
    # banned names through from-imports and module attributes
    ("from-torch-save", adv(OK, "from torch import save as x\n"), "'from torch import save'"),
    ("from-torch-load", adv(OK, "from torch import load\n"), "'from torch import load'"),
    ("from-torch-os", adv(OK, "from torch import os\n"), "'from torch import os'"),
    ("from-typing-sys", adv(OK, "from typing import sys\n"), "'from typing import sys'"),
    ("from-dataclasses-inspect", adv(OK, "from dataclasses import inspect\n"), "import inspect'"),
    ("torch-os", adv("torch.os.system('id')\n" + OK), "torch.os"),
    ("torch-builtins", adv("b = torch.builtins\n" + OK), "torch.builtins is not allowed"),
    ("torch-importlib", adv("m = torch.importlib.import_module('os')\n" + OK), "torch.importlib"),
    ("torch-ctypes", adv("c = torch.ctypes.CDLL(None)\n" + OK), "torch.ctypes is not allowed"),
    ("typing-sys", adv("m = typing.sys.modules\n" + OK, "import typing\n"), "typing.sys"),
    ("enum-bltns", adv("b = enum.bltns.open\n" + OK, "import enum\n"), "enum.bltns"),
    (
        "dataclasses-sys",
        adv("m = dataclasses.sys\n" + OK, "import dataclasses\n"),
        "dataclasses.sys",
    ),
    ("torch-serialization", adv("s = torch.serialization\n" + OK), "torch.serialization"),
    ("torch-overrides", adv("m = torch.overrides\n" + OK), "torch.overrides"),
    (
        "functools-singledispatch",
        adv(OK, "from functools import singledispatch\n"),
        "singledispatch",
    ),
    (
        "typing-get-type-hints",
        adv("h = typing.get_type_hints(compute_advantages)\n" + OK, "import typing\n"),
        "get_type_hints",
    ),
    # numpy file writes
    ("numpy-tofile", adv("batch.rewards.numpy().tofile('/tmp/x')\n" + OK), "tofile"),
    ("numpy-dump", adv("batch.rewards.numpy().dump('/tmp/x')\n" + OK), "dump"),
    ("numpy-ctypes", adv("p = batch.rewards.numpy().ctypes\n" + OK), "ctypes"),
    # frames and code objects
    (
        "generator-frame",
        adv("g = (x for x in [1])\nm = g.gi_frame.f_globals\n" + OK),
        "gi_frame",
    ),
    ("frame-back", adv("g = (x for x in [1])\nf = g.gi_frame\n" + OK), "gi_frame"),
    ("coroutine-frame", adv("f = compute_advantages.func_globals\n" + OK), "func_globals"),
    (
        "traceback-frame",
        adv("try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    f = e.__traceback__\n" + OK),
        "dunder",
    ),
    (
        "tb-frame-attr",
        adv("try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    f = e.tb_frame\n" + OK),
        "tb_frame",
    ),
    ("mro", adv("m = type(cfg).mro()\n" + OK), "mro"),
    # match class patterns and str.format traversal
    (
        "match-class-pattern",
        adv("match batch:\n    case object(gi_frame=f):\n        pass\n" + OK),
        "match statements",
    ),
    ("format-traversal", adv("s = '{0.gi_frame}'.format(batch)\n" + OK), "format is not allowed"),
    ("format-dunder", adv("s = '{0.__class__}'.format(batch)\n" + OK), "not allowed"),
    ("format-map", adv("s = '{x}'.format_map({'x': 1})\n" + OK), "format_map"),
    ("dunder-string", adv("n = '__globals__'\n" + OK), "dunder attributes"),
    # swallowing the limits
    (
        "except-tuple-base",
        adv("try:\n    pass\nexcept (BaseException,):\n    pass\n" + OK),
        "not allowed",
    ),
    ("except-alias", adv("E = BaseException\n" + OK), "'BaseException'"),
    (
        "except-systemexit",
        adv("try:\n    pass\nexcept SystemExit:\n    pass\n" + OK),
        "SystemExit' is not allowed",
    ),
    (
        "except-expression",
        adv("try:\n    pass\nexcept (lambda: ValueError)():\n    pass\n" + OK),
        "must name exception classes",
    ),
    (
        "return-in-finally",
        adv("try:\n    x = 1\nfinally:\n    return batch.rewards.float()\n" + OK),
        "inside 'finally'",
    ),
    (
        "break-in-finally",
        adv("while True:\n    try:\n        pass\n    finally:\n        break\n" + OK),
        "inside 'finally'",
    ),
    # monkeypatching allowed modules and shared objects
    (
        "patch-isfinite",
        adv("torch.isfinite = lambda t: torch.ones_like(t, dtype=torch.bool)\n" + OK),
        "no monkeypatching",
    ),
    ("patch-tensor-all", adv("torch.Tensor.all = lambda self: True\n" + OK), "no monkeypatching"),
    # issue 61: `self` was exempt by name, so rebinding it made any assignment a monkeypatch
    (
        "self-is-torch",
        adv("self = torch\nself.randint = lambda *a, **k: 0\n" + OK),
        "'self' may only name the first parameter",
    ),
    (
        "self-loop-variable",
        adv("for self in (torch,):\n    self.isfinite = lambda t: True\n" + OK),
        "'self' may only name the first parameter",
    ),
    (
        "self-second-parameter",
        "def helper(x, self):\n    self.randint = x\n\n\n" + adv(OK),
        "'self' may only name the first parameter",
    ),
    (
        "self-in-a-plain-method",
        "class Patch:\n    def run(self):\n        self.randint = 1\n\n\n" + adv(OK),
        "only self.NAME in a class's __init__",
    ),
    ("patch-allclose", adv("torch.allclose = lambda *a, **k: True\n" + OK), "no monkeypatching"),
    ("patch-via-alias", adv("m = torch\nm.isfinite = abs\n" + OK), "no monkeypatching"),
    (
        "patch-functional",
        adv("F.softmax = abs\n" + OK, "import torch.nn.functional as F\n"),
        "no monkeypatching",
    ),
    ("patch-interface", adv("RolloutBatch.size = 3\n" + OK), "no monkeypatching"),
    ("patch-cfg", adv("cfg.eps = 0.0\n" + OK), "no monkeypatching"),
    ("delete-module-attr", adv("del torch.isfinite\n" + OK), "no monkeypatching"),
    ("augassign-module", adv("torch.pi += 1\n" + OK), "no monkeypatching"),
    ("module-item-assign", adv("torch.testing_x[0] = 1\n" + OK), "no monkeypatching"),
    # code that runs at import time
    (
        "default-factory",
        "@dataclass\nclass Extra:\n    x: list = field(default_factory=print)\n\n\n" + adv(OK),
        "default_factory",
    ),
    (
        "default-factory-call",
        "@dataclass\nclass Extra:\n    x: list = field(default_factory=functools.partial(list))\n\n\n"
        + adv(OK),
        "default_factory must be one of",
    ),
    (
        "decorator-call",
        "@dataclass(frozen=print('x'))\nclass Extra:\n    x: int = 1\n\n\n" + adv(OK),
        "constant keywords",
    ),
    (
        "decorator-lambda",
        "@(lambda f: f)\ndef helper():\n    return 1\n\n\n" + adv(OK),
        "decorator",
    ),
    (
        "default-argument",
        "def helper(x=print('at import')):\n    return x\n\n\n" + adv(OK),
        "default argument",
    ),
    (
        "kw-default-argument",
        "def helper(*, x=torch.zeros(3)):\n    return x\n\n\n" + adv(OK),
        "default argument",
    ),
    (
        "class-body-call",
        "class Extra:\n    x = print('at import')\n\n\n" + adv(OK),
        "class attribute",
    ),
    (
        "class-body-statement",
        "class Extra:\n    for i in range(3):\n        pass\n\n\n" + adv(OK),
        "class body",
    ),
    (
        "init-subclass",
        "class Extra:\n    def __init_subclass__(cls):\n        pass\n\n\n" + adv(OK),
        "__init_subclass__",
    ),
    ("metaclass", "class Extra(metaclass=type):\n    pass\n\n\n" + adv(OK), "metaclass"),
    ("class-base-call", "class Extra(type('B', (), {})):\n    pass\n\n\n" + adv(OK), "plain name"),
    ("module-level-call", "X = torch.zeros(3)\n\n\n" + adv(OK), "may not call torch.zeros"),
    ("module-level-walrus", "X = (y := 3)\n\n\n" + adv(OK), "only compute a constant"),
    ("annotation-call", "X: print('a') = 3\n\n\n" + adv(OK), "annotation"),
    (
        "arg-annotation-call",
        "def helper(x: print('a')):\n    return x\n\n\n" + adv(OK),
        "annotation",
    ),
    ("dunder-del", "class Extra:\n    def __del__(self):\n        pass\n\n\n" + adv(OK), "__del__"),
    (
        "dunder-getattr",
        "class Extra:\n    def __getattr__(self, k):\n        pass\n\n\n" + adv(OK),
        "__getattr__",
    ),
    # other ways out
    ("exit-call", adv("exit(0)\n" + OK), "'exit'"),
    ("raise-systemexit", adv("raise SystemExit(0)"), "'SystemExit'"),
    ("keyboard-interrupt", adv("raise KeyboardInterrupt"), "'KeyboardInterrupt'"),
    ("breakpoint", adv("breakpoint()\n" + OK), "'breakpoint'"),
    ("classes-ops", adv("torch.classes.load_library('x')\n" + OK), "torch.classes"),
    ("torch-library", adv("lib = torch.library.Library('aten', 'IMPL')\n" + OK), "torch.library"),
    ("torch-jit", adv("f = torch.jit.script(compute_advantages)\n" + OK), "torch.jit"),
    ("torch-fx", adv("g = torch.fx.symbolic_trace\n" + OK), "torch.fx"),
    (
        "storage-from-file",
        adv("s = torch.UntypedStorage.from_file('/etc/passwd')\n" + OK),
        "not allowed",
    ),
    ("set-num-threads", adv("torch.set_num_threads(64)\n" + OK), "set_num_threads"),
    (
        "make-dataclass",
        adv("D = dataclasses.make_dataclass('D', ['a'])\n" + OK, "import dataclasses\n"),
        "make_dataclass",
    ),
    ("relative-import", adv(OK, "from . import algorithm\n"), "import from '.'"),
    ("import-numpy", adv(OK, "import numpy\n"), "import of 'numpy'"),
    ("import-operator", adv(OK, "import operator\n"), "import of 'operator'"),
    ("private-import", adv(OK, "from trainer_template.interface import _check_1d\n"), "_check_1d"),
    # parser bounds (checked before LibCST or ast see the code)
    ("nested-parentheses", adv("x = " + "(" * 1500 + "1" + ")" * 1500 + "\n" + OK), "deeper than"),
    ("nested-lists", adv("x = " + "[" * 1500 + "1" + "]" * 1500 + "\n" + OK), "deeper than"),
    (
        "nested-blocks",
        adv("".join("    " * i + "if True:\n" for i in range(60)) + "    " * 60 + "pass\n" + OK),
        "deeper than",
    ),
    (
        "operator-chain",
        adv("x = " + "+".join(["1"] * 3000) + "\n" + OK),
        "operators in one statement",
    ),
    (
        "attribute-chain",
        adv("x = batch" + ".rewards" * 400 + "\n" + OK),
        "operators in one statement",
    ),
    ("nul-byte", adv("x = 1\x00\n" + OK), "NUL byte"),
    ("surrogates", adv("x = '\ud800'\n" + OK), "not valid UTF-8"),
    ("too-large", adv("x = 1\n" * 30_000 + OK), "larger than"),
]
BENIGN = {
    # must pass the static check AND verification: a sandbox that refuses everything fails here
    "dr-grpo": adv(
        "scores = batch.rewards.to(torch.float32)\n"
        "stats = group_stats(scores, batch.group)\n"
        "return scores - torch.where(stats.count < 2, torch.zeros_like(scores), stats.mean)"
    ),
    "rloo-with-helper": (
        "def _leave_one_out(scores: torch.Tensor, group: torch.Tensor) -> torch.Tensor:\n"
        '    """Mean of the other members of each group (0 for singletons)."""\n'
        "    stats = group_stats(scores, group)\n"
        "    n = stats.count.to(torch.float32)\n"
        "    loo = (stats.mean * n - scores) / (n - 1).clamp(min=1.0)\n"
        "    return torch.where(n > 1, loo, torch.zeros_like(scores))\n\n\n"
        + adv(
            "scores = batch.rewards.to(torch.float32)\nreturn scores - _leave_one_out(scores, batch.group)"
        )
    ),
    "clipped-with-getattr-default": adv(
        "bound = getattr(cfg, 'adv_clip', 5.0)\n"
        "scores = batch.rewards.to(torch.float32)\n"
        "stats = group_stats(scores, batch.group)\n"
        "adv = (scores - stats.mean) / (stats.unbiased_std() + cfg.eps)\n"
        "adv = torch.where(stats.count < 2, torch.zeros_like(adv), adv)\n"
        "return adv.clamp(-bound, bound)"
    ),
    "math-and-constants": (
        "import math\n\nLOG2 = math.log(2.0)\nTEMPERATURE = 1.5\n\n\n"
        + adv(
            "scores = batch.rewards.to(torch.float32)\n"
            "stats = group_stats(scores, batch.group)\n"
            "centred = scores - torch.where(stats.count < 2, torch.zeros_like(scores), stats.mean)\n"
            "return torch.tanh(centred * TEMPERATURE) / LOG2"
        )
    ),
    "try-except-valueerror": adv(
        "scores = batch.rewards.to(torch.float32)\n"
        "try:\n"
        "    stats = group_stats(scores, batch.group)\n"
        "except (ValueError, RuntimeError):\n"
        "    return torch.zeros_like(scores)\n"
        "finally:\n"
        "    pass\n"
        "return scores - torch.where(stats.count < 2, torch.zeros_like(scores), stats.mean)"
    ),
    "dataclass-with-factory": (
        "@dataclass\nclass Hyperparameters:\n"
        "    eps: float = 1e-6\n    clip_ratio_low: float = 0.2\n    clip_ratio_high: float = 0.28\n"
        "    clip_ratio_c: float = 3.0\n    loss_agg_mode: str = 'token-mean'\n    kl_coef: float = 0.0\n"
        "    kl_type: str = 'low_var_kl'\n    entropy_coef: float = 0.0\n    norm_adv_by_std: bool = True\n"
        "    weights: list = field(default_factory=list)\n\n\n"
        + adv(
            "scores = batch.rewards.to(torch.float32)\n"
            "stats = group_stats(scores, batch.group)\n"
            "return scores - torch.where(stats.count < 2, torch.zeros_like(scores), stats.mean)",
            "from dataclasses import field\n",
        )
    ),
}
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
RUNTIME_MORE = [  # the same, slow-marked: the fast tier keeps the first group
    ("c-level-loop", adv("x = sum(range(10 ** 11))\n" + OK), "longer than"),
    (
        "infinite-recursion",
        "def spin(n):\n    return spin(n + 1)\n\n\n" + adv("spin(0)\n" + OK),
        "RecursionError",
    ),
    ("returns-list", adv("return [0.0] * batch.size"), "TypeError"),
    ("returns-int-dtype", adv("return batch.correct.to(torch.long)"), "dtype"),
    (
        "returns-tensor-subclass",
        "class Sneaky(torch.Tensor):\n    pass\n\n\n"
        + adv("return (batch.rewards.float() - batch.rewards.float().mean()).as_subclass(Sneaky)"),
        "'Sneaky' object",
    ),
    (
        "nan-gradient",
        "class NanGrad(torch.autograd.Function):\n"
        "    @staticmethod\n    def forward(ctx, x):\n        return x.clone()\n\n"
        "    @staticmethod\n    def backward(ctx, g):\n        return g * float('nan')\n\n\n"
        + loss_edit("    return NanGrad.apply(loss), {}\n"),
        "not finite",
    ),
    ("metric-tensor", loss_edit("    return loss, {'pg': loss}\n"), "not a finite number"),
    ("loss-not-scalar", loss_edit("    return pg, {}\n"), "scalar"),
    ("mutates-log-prob", loss_edit("    old_log_prob.mul_(2.0)\n    return loss, {}\n"), "mutated"),
    (
        "print-flood",
        adv("for i in range(10 ** 8):\n    print('x' * 200)\n" + OK),
        "longer than|file too large",
    ),
]
LIMITS = VerifyLimits(timeout_s=60, cpu_s=60, memory_mb=1500, call_s=1.0)

# The static check is bypassed for these (the candidate reached the sandbox anyway): the trusted
# side must still reject them with a reason.
CANARY = "sk-canary-0123456789"
NAN = "s = batch.rewards.to(torch.float32)\nreturn (s - s.mean()) / (s.std() * 0.0)"


def _raw(body: str, head: str = "") -> tuple[str, str]:
    """(module-level code placed before the mechanism, the body of compute_advantages)."""
    return head, body


BYPASS = [
    (
        "patched-isfinite",
        _raw(NAN, "torch.isfinite = lambda t: torch.ones_like(t, dtype=torch.bool)\n"),
        "non-finite",
    ),
    (
        "patched-tensor-all",
        _raw(NAN, "torch.Tensor.all = lambda self, *a, **k: torch.tensor(True)\n"),
        "non-finite",
    ),
    (
        "patched-allclose",
        _raw(
            "s = batch.rewards.to(torch.float32)\nreturn s * torch.arange(s.numel())",
            "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n",
        ),
        "depend",
    ),
    (
        "patched-pytest",
        _raw(
            NAN,
            "import sys\nimport _pytest.outcomes\n"
            "sys.modules['_pytest.outcomes'].fail = lambda *a, **k: None\n"
            "sys.modules['pytest'].main = lambda *a, **k: 0\n",
        ),
        "non-finite",
    ),
    (
        "forged-result-file",
        _raw(
            OK,
            "import json, os\n"
            "json.dump({'returncode': 0, 'tests': [], 'fingerprint': [0.0]}, open('result.json', 'w'))\n"
            "os._exit(0)\n",
        ),
        "process ended during this call",
    ),
    (
        "forged-done-frame",
        _raw(
            OK,
            "import json, os, struct\nm = json.dumps({'type': 'done'}).encode()\n"
            "os.write(int(os.environ['POISE_CHANNEL_FD']), struct.pack('>I', len(m)) + m)\n",
        ),
        "malformed",
    ),
    (
        "forged-end-frame",
        _raw(
            OK,
            "from trainer_template.channel import Channel\n"
            "Channel.from_env().send({'type': 'end', 'key': 'session#load', 'out': {'t': 'scalar', 'v': None}})\n",
        ),
        "malformed",
    ),
    (
        "kill-parent-verifying",
        _raw(
            "import os, signal\n"
            "for pid in (os.getppid(), 1):\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n"
            "    except OSError:\n"
            "        pass\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n" + OK
        ),
        "killed by SIGKILL",
    ),
    (
        "stop-self",
        _raw("import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n" + OK),
        "longer than",
    ),
    ("exit-at-import", _raw(OK, "import os\nos._exit(0)\n"), "process ended during this call"),
    ("systemexit-in-call", _raw("raise SystemExit(0)"), "SystemExit"),
    (
        "swallows-everything",
        _raw(
            "while True:\n    try:\n        sum(range(10 ** 9))\n    except BaseException:\n        pass"
        ),
        "longer than",
    ),
    (
        "return-in-finally",
        _raw("try:\n    while True:\n        pass\nfinally:\n    return batch.rewards.float()"),
        "longer than",
    ),
    (
        "slow-calls-timing",
        _raw("import time\ntime.sleep(0.9)\n" + OK),
        "wall-clock",
    ),
    (
        "reads-secrets",
        _raw(
            "got = [repr(dict(os.environ))]\n"
            "for p in ('/proc/1/environ', '/proc/self/environ', os.path.expanduser('~/.ssh/id_rsa')):\n"
            "    try:\n"
            "        got.append(open(p).read())\n"
            "    except OSError as e:\n"
            "        got.append(str(e))\n"
            "raise ValueError(' '.join(got))",
            "import os\n",
        ),
        "ValueError: {",
    ),
    (
        "git-plumbing",
        _raw(
            "import subprocess\nsubprocess.run(['git', 'update-ref', 'refs/heads/poise/forged', 'HEAD'], check=True)\n"
            + OK
        ),
        "CalledProcessError",
    ),
]
