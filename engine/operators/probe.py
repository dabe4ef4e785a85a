"""Calls into a candidate, in one of three modes (``$POISE_VERIFY_MODE``):

- ``record`` — the sandboxed child: every call runs the candidate and is streamed to the parent as a
  ``begin`` frame (key, input digest; the parent arms the per-call deadline) and an ``end`` frame
  (the raw output, the inputs it mutated, and for a scalar output that requires grad its gradients
  w.r.t. the inputs), all plain data (``probe_codec``). The candidate works on its own copies of
  the inputs, and the harness gets back what the replay rebuilds from the ``end`` frame, so the two
  modes' tests see the same values and no candidate object outlives its call's deadline;
- ``replay`` — the trusted side: the same suite runs against the recording (``$POISE_VERIFY_RECORDING``);
  no candidate code is loaded, so nothing the candidate patched in its own process reaches the checks;
- ``direct`` (default) — a manual ``pytest tests/`` in a checkout of a node: the candidate runs here.

A call is named by the current scope (the test's node id, ``fingerprint``...) and its index in it.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import types
from pathlib import Path
from typing import Any

import torch

from engine.operators import probe_codec as codec
from trainer_template.channel import Channel
from trainer_template.interface import RolloutBatch
from trainer_template.loader import load_algorithm, make_config

MODE_ENV = "POISE_VERIFY_MODE"
RECORDING_ENV = "POISE_VERIFY_RECORDING"


class CandidateError(Exception):
    """The candidate failed in this call (raised on the trusted side from the recording)."""


class NotRecorded(CandidateError):
    """The recording child never reached this call (it was stopped at an earlier one)."""


class _State:
    def __init__(self) -> None:
        self.mode = os.environ.get(MODE_ENV, "direct")
        self.scope = "session"
        self.counts: dict[str, int] = {}
        self.channel: Channel | None = None
        self.recording: dict[str, Any] | None = None
        self.ended: dict[str, str] = {}
        """why the recording stopped early, by scope ('' for every scope)"""
        self.module: Any = None
        self.modules: dict[int, tuple[Any, Any]] = {}
        """record mode: the harness's stand-in of a loaded module -> the module, by id"""
        self.configs: dict[int, tuple[Any, Any]] = {}
        """record mode: the harness's view of a config -> the candidate's real one, by id"""

    def key(self) -> str:
        i = self.counts.get(self.scope, 0)
        self.counts[self.scope] = i + 1
        return f"{self.scope}#{i}"


_S = _State()


def set_scope(scope: str) -> None:
    _S.scope = scope


def loaded() -> Any:
    """The candidate module the recording child loaded last (None before)."""
    return _S.module


def _channel() -> Channel:
    if _S.channel is None:
        _S.channel = Channel.from_env()
        if _S.channel is None:
            raise RuntimeError("record mode needs the channel ($POISE_CHANNEL_FD)")
    return _S.channel


def _recording() -> dict[str, Any]:
    if _S.recording is None:
        data = json.loads(Path(os.environ[RECORDING_ENV]).read_text(encoding="utf-8"))
        _S.recording = data.get("calls", {})
        # one reason for the whole recording, or one per scope (a recording child per source)
        ended = data.get("ended", "")
        ended = ended if isinstance(ended, dict) else {"": ended}
        _S.ended = {str(k): str(v) for k, v in ended.items()}
    return _S.recording


def _entry(key: str, dig: str | None = None) -> dict:
    rec = _recording().get(key)
    if rec is None:
        ended = _S.ended.get(key.split("#", 1)[0], _S.ended.get("", ""))
        why = f" ({ended})" if ended else ""
        raise NotRecorded(f"not run: the candidate's process was stopped at an earlier call{why}")
    if not isinstance(rec, dict):
        raise codec.RecordingError("a recorded call is malformed")
    if rec.get("error"):
        raise CandidateError(str(rec["error"])[:600])
    if dig is not None and rec.get("digest") != dig:
        raise codec.RecordingError("the recording does not match this call's inputs")
    return rec


def _describe(exc: BaseException) -> str:
    """'Type: message' of a candidate's exception (its __str__ is candidate code too)."""
    try:
        return f"{type(exc).__name__}: {exc}"[:600]
    except BaseException:  # noqa: BLE001
        return type(exc).__name__[:100]


def _private(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The inputs of a recorded call as the candidate gets them: its own copies of the harness's
    tensors and batches (aliases kept), its real ``Hyperparameters`` for the harness's view of it;
    other values as they are. The harness's objects change only as the recording says they did."""
    memo: dict[int, Any] = {}

    def one(v: Any) -> Any:
        if id(v) in memo:
            return memo[id(v)]
        if codec.is_tensor(v):
            c = v.detach().clone()
            out = c.requires_grad_(True) if v.requires_grad else c
        elif type(v) is RolloutBatch:
            out = object.__new__(RolloutBatch)
            out.__dict__.update({k: one(x) for k, x in v.__dict__.items()})
        elif id(v) in _S.configs and _S.configs[id(v)][0] is v:
            out = _S.configs[id(v)][1]
        else:
            return v
        memo[id(v)] = out
        return out

    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


def _run(fn, args: tuple, kwargs: dict, grad_leaves: set[str]) -> dict[str, Any]:
    """Call ``fn`` on private copies of its inputs (``_private``); what the ``end`` frame records:
    the encoded output, the inputs it mutated, the gradients of a scalar output w.r.t. the inputs
    that are leaves requiring grad (``grad_leaves``). Its objects are freed when this returns."""
    cargs, ckwargs = _private(args, kwargs)
    ins = codec.slots(cargs, ckwargs)
    before = {p: (id(t), codec.tensor_digest(t)) for p, t in ins.items()}
    out = fn(*cargs, **ckwargs)
    grads: dict[str, list] = {}
    outs = out if type(out) is tuple else (out,)
    leaves = [(p, t) for p, t in ins.items() if p in grad_leaves and t.requires_grad and t.is_leaf]
    for i, o in enumerate(outs):
        if codec.is_tensor(o) and o.requires_grad and o.numel() == 1 and leaves:
            g = torch.autograd.grad(o, [t for _, t in leaves], retain_graph=True, allow_unused=True)
            grads[str(i)] = [
                [p, None if x is None else codec.encode(x)] for (p, _), x in zip(leaves, g)
            ]
    after = codec.slots(cargs, ckwargs)
    mutated = {
        p: codec.encode(t)
        for p, t in after.items()
        if before.get(p) != (id(t), codec.tensor_digest(t))
    }
    return {"out": codec.encode(out), "mutated": mutated, "grads": grads}


def _record(key: str, target, args: tuple, kwargs: dict, name: str) -> Any:
    """Run ``target`` (a ``CandidateFunction``, or e.g. ``loss.backward``) in the recording child,
    bracketed by begin / end frames. The harness gets what the replay rebuilds from the ``end``
    frame (``_rebuild``): no candidate object reaches it after the call's deadline is off (pytest
    prints a failing assertion's values and a failing test's arguments, and a candidate's
    ``__repr__`` would run there unbounded); the candidate's objects are freed before the frame."""
    ch = _channel()
    grad_leaves = {p for p, t in codec.slots(args, kwargs).items() if t.requires_grad and t.is_leaf}
    ch.send({"type": "begin", "key": key, "fn": name, "digest": codec.digest(args, kwargs)})
    fn = target._fn if isinstance(target, CandidateFunction) else target
    try:
        end = {"type": "end", "key": key, **_run(fn, args, kwargs, grad_leaves)}
    except BaseException as exc:  # noqa: BLE001 - the failure is the recorded outcome
        end = {"type": "end", "key": key, "error": _describe(exc)}
    ch.send(end)
    if "error" in end:  # raised here, not in the handler: the candidate's exception is no context
        raise CandidateError(end["error"])
    return _rebuild(end, args, kwargs)


def _replay(key: str, args: tuple, kwargs: dict) -> Any:
    return _rebuild(_entry(key, codec.digest(args, kwargs)), args, kwargs)


def _rebuild(rec: dict, args: tuple, kwargs: dict) -> Any:
    """A recorded call's outcome for the harness, in both modes: its mutations applied to the
    inputs, its output decoded, with its recorded gradients w.r.t. the inputs."""
    for path, value in (rec.get("mutated") or {}).items():
        codec.set_slot(args, kwargs, str(path), codec.decode_value(value))
    out = codec.decode_value(rec.get("out"))
    grads = rec.get("grads") or {}
    if not isinstance(grads, dict):
        raise codec.RecordingError("recorded gradients are malformed")
    ins = codec.slots(args, kwargs)
    outs = list(out) if type(out) is tuple else [out]
    for idx, pairs in grads.items():
        i = int(idx) if str(idx).isdigit() else -1
        if not (0 <= i < len(outs)) or not codec.is_tensor(outs[i]) or not isinstance(pairs, list):
            raise codec.RecordingError("recorded gradients name no output")
        leaves, gs = [], []
        for pair in pairs:
            if not isinstance(pair, list) or len(pair) != 2 or pair[0] not in ins:
                raise codec.RecordingError("recorded gradients name no input")
            leaf = ins[pair[0]]
            g = None if pair[1] is None else codec.decode_value(pair[1])
            if g is not None and tuple(g.shape) != tuple(leaf.shape):
                raise codec.RecordingError("a recorded gradient has the wrong shape")
            leaves.append(leaf)
            gs.append(g)
        outs[i] = codec.with_grads(outs[i], leaves, gs)
    return tuple(outs) if type(out) is tuple else outs[0]


class CandidateFunction:
    """``mod.compute_advantages`` / ``mod.policy_loss`` in record or replay mode. Its signature says
    whether the real function takes ``state`` (``call_policy_loss`` reads it), nothing more."""

    def __init__(self, name: str, fn=None, takes_state: bool = False):
        self.__name__ = name
        self._fn = fn
        params = [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)]
        if takes_state:
            params.append(inspect.Parameter("state", inspect.Parameter.KEYWORD_ONLY, default=None))
        params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
        self.__signature__ = inspect.Signature(params)

    def __call__(self, *args, **kwargs):
        key = _S.key()
        if _S.mode == "record":
            return _record(key, self, args, kwargs, self.__name__)
        return _replay(key, args, kwargs)


def call(fn, *args, **kwargs) -> Any:
    """Call into candidate code: ``fn`` is a candidate function, or e.g. ``loss.backward``."""
    if _S.mode == "direct" or isinstance(fn, CandidateFunction):
        return fn(*args, **kwargs)
    key = _S.key()
    name = getattr(fn, "__name__", "call")
    if _S.mode == "record":
        return _record(key, fn, args, kwargs, name)
    _entry(key)  # a failure recorded for this call is raised here
    return fn(*args, **kwargs)  # e.g. backward through a replayed output: trusted code


def load_candidate(path: str | Path, key: str = "session") -> Any:
    """The candidate module (a recording or replaying stand-in outside ``direct`` mode)."""
    if _S.mode == "direct":
        return load_algorithm(Path(path).read_text(encoding="utf-8"), "candidate")
    if _S.mode == "record":
        source = Path(path).read_text(encoding="utf-8")
        fields = _within(f"{key}#load", "load", lambda: _load(source))
        module = fields.pop("module")
    else:
        fields = _entry(f"{key}#load").get("fields")
        fields = fields if isinstance(fields, dict) else {}
    takes = codec.decode_value(fields["takes_state"]) is True if "takes_state" in fields else False
    ns = types.SimpleNamespace(
        compute_advantages=CandidateFunction("compute_advantages"),
        policy_loss=CandidateFunction("policy_loss", None, takes),
        real=None,
    )
    if _S.mode == "record":  # the real functions stay out of the harness's sight
        ns.compute_advantages._fn = module.compute_advantages
        ns.policy_loss._fn = module.policy_loss
        _S.modules[id(ns)] = (ns, module)
        _S.module = ns
    return ns


def _load(source: str) -> dict[str, Any]:
    module = load_algorithm(source, "candidate")
    takes = _takes_state(module.policy_loss)
    return {"takes_state": {"t": "scalar", "v": takes}, "module": module}


def _within(key: str, name: str, work) -> dict[str, Any]:
    """``work()`` (candidate code) in the recording child, bracketed by begin / end frames; its
    ``fields`` (encoded, but for a ``module``, which stays in this process) go into the end frame."""
    ch = _channel()
    ch.send({"type": "begin", "key": key, "fn": name, "digest": ""})
    try:
        fields, error = work(), ""
    except BaseException as exc:  # noqa: BLE001 - the failure is the recorded outcome
        fields, error = {}, _describe(exc)
    if error:
        ch.send({"type": "end", "key": key, "error": error})
        raise CandidateError(error)  # outside the handler: the candidate's exception is no context
    sent = {k: v for k, v in fields.items() if k != "module"}
    ch.send({"type": "end", "key": key, "out": {"t": "scalar", "v": None}, "fields": sent})
    return fields


def _takes_state(fn) -> bool:
    """Whether ``policy_loss`` has a ``state`` parameter (as ``call_policy_loss`` decides)."""
    try:
        return "state" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def config(mod: Any, key: str = "session") -> Any:
    """The candidate's ``Hyperparameters()`` (its fields as plain data outside ``direct`` mode: in
    the recording child too, where the candidate's calls get the real object in its place)."""
    if _S.mode == "direct":
        return make_config(mod)
    if _S.mode == "record":
        known = _S.modules.get(id(mod))
        if known is None or known[0] is not mod:
            raise RuntimeError("config() needs the module load_candidate() returned")
        real: list = []
        fields = _within(f"{key}#config", "config", lambda: _config_fields(known[1], real))
    else:
        fields = _entry(f"{key}#config").get("fields") or {}
    if not isinstance(fields, dict) or len(fields) > codec.MAX_ITEMS:
        raise codec.RecordingError("the recorded hyperparameters are malformed")
    view = types.SimpleNamespace(
        **{str(k): codec.decode_value(v) for k, v in fields.items() if str(k).isidentifier()}
    )
    if _S.mode == "record":
        _S.configs[id(view)] = (view, real[0])
    return view


def _config_fields(module: Any, real: list) -> dict[str, Any]:
    cfg = make_config(module)
    real.append(cfg)
    if not dataclasses.is_dataclass(cfg):
        return {}
    return {f.name: codec.encode(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
