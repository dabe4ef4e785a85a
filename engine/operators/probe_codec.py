"""Plain-data encoding of what a candidate's function received and returned.

``encode`` turns a value into JSON-ready data (tensors as dtype, shape and a flat list of numbers;
NaN / inf kept), ``decode_value`` rebuilds it on the trusted side with strict checks, ``digest`` names the
content of a call's inputs, and ``slots`` lists the tensors a call could mutate. In the recording
child the tensor accessors are the C methods captured at import (they cannot be replaced from Python);
a candidate that subverts its own interpreter can still misreport its own outputs, which only
changes its own verdict (docs/security.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from typing import Any

import torch

from trainer_template.interface import RolloutBatch

_TB = torch._C.TensorBase
_tolist, _detach, _reshape, _numel = _TB.tolist, _TB.detach, _TB.reshape, _TB.numel
_type, _isinstance, _len, _float = type, isinstance, len, float
_NO_TF = torch._C.DisableTorchFunction
DTYPES = {
    str(d): d
    for d in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    )
}
MAX_NUMEL = 200_000
MAX_ITEMS = 256
MAX_DEPTH = 6
_NAME = re.compile(r"[^A-Za-z0-9_]")


class RecordingError(ValueError):
    """A recorded value is malformed (the recording child sent something no encoder produces)."""


def is_tensor(x: Any) -> bool:
    return _type(x) is torch.Tensor or _type(x) is torch.nn.Parameter


def _tensor_data(t: torch.Tensor) -> tuple[str, list[int], list]:
    with _NO_TF():
        flat = _reshape(_detach(t), (-1,))
        return str(t.dtype), [int(s) for s in t.shape], _tolist(flat)


def encode(x: Any, depth: int = 0) -> dict:
    """JSON-ready data for ``x``; unknown objects keep only their type's name."""
    tp = _type(x)
    if depth > MAX_DEPTH:
        return {"t": "object", "type": "too-deep"}
    if is_tensor(x):
        if str(x.dtype) not in DTYPES or x.layout != torch.strided:
            return {"t": "object", "type": f"Tensor[{x.dtype}]"}
        if _numel(x) > MAX_NUMEL:
            return {"t": "object", "type": f"Tensor[{_numel(x)} elements]"}
        dtype, shape, data = _tensor_data(x)
        return {
            "t": "tensor",
            "dtype": dtype,
            "shape": shape,
            "data": data,
            "grad": bool(x.requires_grad),
        }
    if x is None or tp in (bool, int, float):
        if tp is int and abs(x) >= 2**63:
            return {"t": "object", "type": "int"}
        return {"t": "scalar", "v": x}
    if tp is str:
        return {"t": "str", "v": x[:1000]}
    if tp in (tuple, list):
        return {"t": tp.__name__, "items": [encode(v, depth + 1) for v in x[:MAX_ITEMS]]}
    if tp is dict:
        items = list(x.items())[:MAX_ITEMS]
        return {
            "t": "dict",
            "items": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in items],
        }
    return {
        "t": "object",
        "type": _NAME.sub("_", getattr(tp, "__name__", "object"))[:80] or "object",
    }


class Opaque:
    """Stands in for a returned object that is neither a tensor nor plain data."""


def _opaque(name: Any) -> Any:
    name = _NAME.sub("_", str(name))[:80] or "object"
    return type(name if name[0].isalpha() else "obj_" + name, (Opaque,), {})()


def decode_value(d: Any, depth: int = 0) -> Any:
    """The value ``encode`` described (tensors without grad; see ``with_grads``)."""
    if not isinstance(d, dict) or depth > MAX_DEPTH + 1:
        raise RecordingError("a recorded value is not an encoded object")
    t = d.get("t")
    if t == "tensor":
        dtype, shape, data = d.get("dtype"), d.get("shape"), d.get("data")
        if dtype not in DTYPES or not isinstance(shape, list) or not isinstance(data, list):
            raise RecordingError("a recorded tensor lacks dtype, shape or data")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in shape):
            raise RecordingError("a recorded tensor has a bad shape")
        n = math.prod(shape)
        if n != len(data) or n > MAX_NUMEL:
            raise RecordingError("a recorded tensor's data does not match its shape")
        if any(isinstance(v, bool) and dtype != "torch.bool" for v in data[:1]):
            raise RecordingError("a recorded tensor's data has the wrong type")
        if not all(isinstance(v, (int, float)) for v in data):
            raise RecordingError("a recorded tensor holds something other than numbers")
        try:
            return torch.tensor(data, dtype=DTYPES[dtype]).reshape(shape)
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            raise RecordingError(f"a recorded tensor cannot be rebuilt: {exc}") from None
    if t == "scalar":
        v = d.get("v")
        if v is not None and type(v) not in (bool, int, float):
            raise RecordingError("a recorded scalar is not a number")
        return v
    if t == "str":
        if not isinstance(d.get("v"), str):
            raise RecordingError("a recorded string is not a string")
        return d["v"]
    if t in ("tuple", "list"):
        items = d.get("items")
        if not isinstance(items, list) or len(items) > MAX_ITEMS:
            raise RecordingError("a recorded sequence is malformed")
        vals = [decode_value(v, depth + 1) for v in items]
        return tuple(vals) if t == "tuple" else vals
    if t == "dict":
        items = d.get("items")
        if not isinstance(items, list) or len(items) > MAX_ITEMS:
            raise RecordingError("a recorded dict is malformed")
        out = {}
        for pair in items:
            if not isinstance(pair, list) or len(pair) != 2:
                raise RecordingError("a recorded dict item is malformed")
            k = decode_value(pair[0], depth + 1)
            if not isinstance(k, (str, int, float, bool, type(None))):
                raise RecordingError("a recorded dict key is not plain data")
            out[k] = decode_value(pair[1], depth + 1)
        return out
    if t == "object":
        return _opaque(d.get("type", "object"))
    raise RecordingError(f"unknown recorded kind {str(t)[:40]!r}")


def slots(args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
    """The tensors a call receives, by path: ``a0``, ``k:entropy``, ``a0.rewards`` (batch fields)."""
    out: dict[str, torch.Tensor] = {}
    items = [(f"a{i}", v) for i, v in enumerate(args)] + [(f"k:{k}", v) for k, v in kwargs.items()]
    for path, v in items:
        if is_tensor(v):
            out[path] = v
        elif _type(v) is RolloutBatch:
            for f in dataclasses.fields(RolloutBatch):
                fv = v.__dict__.get(f.name)
                if is_tensor(fv):
                    out[f"{path}.{f.name}"] = fv
    return out


def _plain(v: Any, depth: int = 0) -> Any:
    if is_tensor(v):
        return ["T", *_tensor_data(v)]
    if v is None or _type(v) in (bool, int, float, str):
        return v
    if _type(v) is RolloutBatch:
        return ["B"] + [_plain(v.__dict__.get(f.name), depth + 1) for f in dataclasses.fields(v)]
    if _type(v) in (tuple, list) and depth < 3:
        return [_plain(x, depth + 1) for x in v]
    return "obj"


def digest(args: tuple, kwargs: dict) -> str:
    """sha256 of a call's inputs (tensor contents, batch fields, plain values; other objects: 'obj')."""
    blob = json.dumps(
        [_plain(a) for a in args] + [[k, _plain(v)] for k, v in sorted(kwargs.items())],
        allow_nan=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def tensor_digest(t: torch.Tensor) -> str:
    return hashlib.sha256(json.dumps(_tensor_data(t), allow_nan=True).encode()).hexdigest()[:32]


def set_slot(args: tuple, kwargs: dict, path: str, value: torch.Tensor) -> None:
    """Apply a recorded mutation on the trusted side (in place when the shapes agree)."""
    head, _, field = path.partition(".")
    if head.startswith("a") and head[1:].isdigit() and int(head[1:]) < len(args):
        obj = args[int(head[1:])]
    elif head.startswith("k:") and head[2:] in kwargs:
        obj = kwargs[head[2:]]
    else:
        raise RecordingError(f"a recorded mutation names no input ({path[:60]!r})")
    if field:
        if _type(obj) is not RolloutBatch or field not in {
            f.name for f in dataclasses.fields(RolloutBatch)
        }:
            raise RecordingError(f"a recorded mutation names no batch field ({path[:60]!r})")
        obj.__dict__[field] = value
        return
    if not is_tensor(obj):
        raise RecordingError(f"a recorded mutation names no tensor ({path[:60]!r})")
    with torch.no_grad():
        if obj.shape == value.shape:
            obj.copy_(value.to(obj.dtype))
        else:
            obj.data = value


def with_grads(value: torch.Tensor, leaves: list[torch.Tensor], grads: list) -> torch.Tensor:
    """``value`` as the output of a recorded function whose gradient w.r.t. ``leaves`` is ``grads``."""
    pairs = [(leaf, g) for leaf, g in zip(leaves, grads) if g is not None]
    if not pairs:
        return value.clone().requires_grad_(value.is_floating_point())

    class Recorded(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            return value.clone()

        @staticmethod
        def backward(ctx, g):
            return tuple(g * gr.to(g.dtype) for _, gr in pairs)

    return Recorded.apply(*[leaf for leaf, _ in pairs])
