"""Subprocess entry points of the CPU proxy (started by engine.operators.evaluate).

    python -m trainer_template.proxy.worker warmstart --preset P [--cache-dir D]
    python -m trainer_template.proxy.worker train --algorithm A.py --warmstart W.pt --seed S [--preset P]
    python -m trainer_template.proxy.worker score --checkpoint C.pt|- --seed S [--preset P]
    python -m trainer_template.proxy.worker run --algorithm A.py --seed S --out R.json   (benchmarks)

``warmstart`` (trusted) builds or finds the cached warm start. ``train`` runs candidate code, behind
the engine's sandbox: it RL-trains the warm start with the candidate's ``compute_advantages`` and
``policy_loss`` and sends, over the engine's channel (``trainer_template.channel``), a ``step`` frame
per RL step (the advisory training trajectory), then a ``done`` frame (status, reason, timings,
device) with the trained weights as its blob. It never evaluates. ``score`` is the trusted side: it loads a
checkpoint with ``torch.load(weights_only=True)`` into the protocol's model (strict keys, shapes and
dtypes, finite values) in a process that never imports candidate code, runs the held-out evaluation
(``evalset.evaluate``) and sends ``{"type": "metrics", ...}`` (or ``{"type": "invalid", "reason"}``).
``run`` does train + score in one process and writes R.json; only the benchmarks use it, on the
published mechanisms.

``train``, ``score`` and ``run`` take ``--device cpu|cuda`` (default: the protocol's own
``device()``). The engine decides the device once, in its trusted process, and passes it to both
children; ``cuda`` in a process that sees no CUDA GPU is an error, never a silent CPU run.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import resource
import sys
import time
import traceback
from pathlib import Path

from trainer_template.channel import Channel
from trainer_template.loader import load_algorithm, make_config
from trainer_template.proxy.protocol import get_protocol

DEVICES = ("cpu", "cuda")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _clean(row: dict) -> dict:
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()
    }


def cmd_warmstart(args: argparse.Namespace) -> int:
    # lazy: torch is heavy (only this path needs it)
    from trainer_template.proxy.warmstart import ensure_warmstart, verify_warmstart

    protocol = get_protocol(args.preset)
    path = ensure_warmstart(
        protocol,
        args.cache_dir,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    import torch  # lazy: torch is heavy (only this path needs it)

    # the CPU kernels torch picks here (AVX2, AVX512...): some mechanisms' seed runs depend on them
    print(torch.backends.cpu.get_cpu_capability())
    print(verify_warmstart(protocol, path))  # the weights' content hash (the protocol's identity)
    print(protocol.device())
    print(path)  # last: the engine reads the checkpoint's path from the last line
    return 0


def usable_device(protocol, device: str | None = None) -> str:
    """``device`` (default: the protocol's own ``device()``), checked to exist in this process:
    RuntimeError for ``cuda`` when torch sees no CUDA GPU here."""
    import torch  # lazy: torch is heavy (only the training paths need it)

    device = device or protocol.device()
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r} (known: {', '.join(DEVICES)})")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "the protocol runs on cuda but this process sees no CUDA GPU "
            "(no /dev/nvidia* device nodes, no driver, or CUDA failed to initialise)"
        )
    return device


def warm_policy(
    protocol,
    warmstart: str | None = None,
    cache_dir: str | None = None,
    device: str | None = None,
):
    """The protocol's warm start, verified against its pinned content hash and loaded on ``device``
    (default: the protocol's own, see :func:`usable_device`), in a process limited to one torch
    thread (every seed run is single-threaded)."""
    import torch  # lazy: torch is heavy (only the training paths need it)

    torch.set_num_threads(1)
    # lazy: torch is heavy (only the training paths need it)
    from trainer_template.proxy.warmstart import ensure_warmstart, load_warmstart, verify_warmstart

    device = usable_device(protocol, device)
    path = warmstart or ensure_warmstart(protocol, cache_dir)
    verify_warmstart(protocol, path)  # the pinned weights, or WarmStartMismatch
    return load_warmstart(path, protocol.warmstart, device=device)


def configured_algorithm(source: str, name: str, overrides: dict | None = None):
    """(module, config) of an algorithm.py's source with its Hyperparameters overridden."""
    module = load_algorithm(source, name)
    return module, make_config(module, overrides)


def train_policy(
    protocol,
    source: str,
    name: str,
    seed: int,
    *,
    warmstart: str | None = None,
    cache_dir: str | None = None,
    overrides: dict | None = None,
    trajectory: dict[str, list] | None = None,
    device: str | None = None,
):
    """(model, reason): the warm start RL-trained at ``seed`` with ``source``'s mechanism under
    ``protocol`` on ``device`` (default: the protocol's own), as a seed run trains it, and why the
    run stopped early ('' when it did not: a collapse or a rejected step ends it, and the model is
    returned as trained so far, to be scored as a collapsed seed run is). For trusted code (the
    published mechanisms): other errors propagate."""
    from trainer_template.proxy import rl  # lazy: torch is heavy (only this path needs it)

    model = warm_policy(protocol, warmstart, cache_dir, device)
    module, cfg = configured_algorithm(source, name, overrides)
    try:
        rl.train(
            model,
            module,
            cfg,
            protocol.rl,
            seed,
            trajectory={} if trajectory is None else trajectory,
            task_settings=protocol.task,
        )
    except rl.CandidateFailure as exc:
        return model, str(exc)
    return model, ""


def _train(args: argparse.Namespace, on_row) -> tuple[object | None, str, dict]:
    """RL-train the warm start with the candidate: (model or None, failure reason or '', timings)."""
    from trainer_template.proxy import rl  # lazy: torch is heavy (only this path needs it)

    protocol = get_protocol(args.preset)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    model = warm_policy(protocol, args.warmstart, args.cache_dir, args.device)
    try:
        module, cfg = configured_algorithm(
            Path(args.algorithm).read_text(encoding="utf-8"),
            args.name,
            json.loads(args.overrides) if args.overrides else None,
        )
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}", timings
    timings["load_s"] = time.monotonic() - t0
    traj: dict[str, list] = {}
    t1 = time.monotonic()
    failure = ""
    try:
        rl.train(
            model,
            module,
            cfg,
            protocol.rl,
            args.seed,
            trajectory=traj,
            on_step=on_row(traj),
            task_settings=protocol.task,
        )
    except rl.CandidateFailure as exc:
        failure = str(exc)
    except Exception as exc:  # the harness, driven by a broken candidate into a state it rejects
        failure = f"RL step failed: {type(exc).__name__}: {exc}"
        traceback.print_exc()
    except BaseException as exc:  # SystemExit, KeyboardInterrupt... raised by the candidate
        failure = f"the candidate raised {type(exc).__name__}: {exc}"
    timings["rl_s"] = time.monotonic() - t1
    return model, failure, timings


def cmd_train(args: argparse.Namespace) -> int:
    import torch  # lazy: torch is heavy (only this path needs it)

    channel = Channel.from_env()
    if channel is None:
        raise SystemExit("train needs the engine's channel ($POISE_CHANNEL_FD)")

    def on_row(traj: dict):
        def send(step: int) -> None:
            row = {k: v[-1] for k, v in traj.items() if k != "step" and v}
            channel.send({"type": "step", "step": step, "row": _clean(row)})

        return send

    model, failure, timings = _train(args, on_row)
    blob = None
    if model is not None:
        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        blob = buf.getvalue()
    channel.send(
        {
            "type": "done",
            "status": "failed" if failure else "ok",
            "reason": failure,
            "timings": timings,
            "peak_rss_mb": _rss_mb(),
            "device": _device_of(model) if model is not None else "",
        },
        blob=blob,
    )
    return 0


def _device_of(model) -> str:
    return next(model.parameters()).device.type


def load_checkpoint(data: bytes, preset: str):
    """The protocol's model with ``data``'s weights; ValueError unless they fit it exactly."""
    import torch  # lazy: torch is heavy (only this path needs it)

    # lazy: torch is heavy (only this path needs it)
    from trainer_template.proxy.warmstart import build_model

    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"not a weights-only checkpoint ({type(exc).__name__})") from None
    model = build_model(get_protocol(preset).warmstart)
    expected = model.state_dict()
    if not isinstance(state, dict) or set(state) != set(expected):
        raise ValueError("its parameter names do not match the proxy's model")
    for name, ref in expected.items():
        t = state[name]
        if not isinstance(t, torch.Tensor) or t.shape != ref.shape or t.dtype != ref.dtype:
            raise ValueError(f"parameter {name!r} has the wrong type, shape or dtype")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"parameter {name!r} holds NaN/inf")
    model.load_state_dict(state, strict=True)
    return model


def _score(model, preset: str, seed: int) -> dict[str, float]:
    from trainer_template.proxy import evalset  # lazy: torch is heavy (only this path needs it)

    protocol = get_protocol(preset)
    return evalset.evaluate(model, protocol.eval, seed, protocol.task)


def cmd_score(args: argparse.Namespace) -> int:
    import torch  # lazy: torch is heavy (only this path needs it)

    torch.set_num_threads(1)
    # lazy: torch is heavy (only this path needs it)
    from trainer_template.proxy import evalset  # noqa: F401 - imported before the weights arrive

    # lazy: torch is heavy (only this path needs it)
    from trainer_template.proxy.warmstart import build_model  # noqa: F401

    channel = Channel.from_env()
    if channel is None:
        raise SystemExit("score needs the engine's channel ($POISE_CHANNEL_FD)")
    # "-": the engine starts the scorer early and writes the weights to stdin once they exist
    data = sys.stdin.buffer.read() if args.checkpoint == "-" else Path(args.checkpoint).read_bytes()
    if not data:
        return 0  # the training failed: nothing to score
    device = usable_device(get_protocol(args.preset), args.device)
    t0 = time.monotonic()
    try:
        model = load_checkpoint(data, args.preset)
    except ValueError as exc:
        channel.send({"type": "invalid", "reason": f"the trained checkpoint is refused: {exc}"})
        return 0
    metrics = _score(model.to(device), args.preset, args.seed)
    channel.send({"type": "metrics", "metrics": metrics, "eval_s": time.monotonic() - t0})
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Train and score in one process (benchmarks of the published mechanisms only)."""

    def on_row(_traj):
        return None

    t0 = time.monotonic()
    model, failure, timings = _train(args, on_row)
    metrics: dict[str, float] = {}
    if model is not None and (not failure or failure.startswith("collapsed")):
        t2 = time.monotonic()
        metrics = _score(model, args.preset, args.seed)
        timings["eval_s"] = time.monotonic() - t2
        if not all(math.isfinite(v) for v in metrics.values()):
            metrics, failure = {}, failure or "evaluation produced NaN/inf"
    timings["total_s"] = time.monotonic() - t0
    result = {
        "status": "failed" if failure else "ok",
        "reason": failure,
        "metrics": metrics,
        "timings": timings,
        "peak_rss_mb": _rss_mb(),
    }
    Path(args.out).write_text(json.dumps(result, allow_nan=False, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer_template.proxy.worker")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("warmstart", help="build (or find) the cached warm start")
    t = sub.add_parser("train", help="RL-train one seed of one candidate (candidate code)")
    s = sub.add_parser("score", help="evaluate a trained checkpoint (trusted)")
    r = sub.add_parser("run", help="train and score in one process (benchmarks)")
    for p in (w, t, s, r):
        p.add_argument("--preset", default="default")
        p.add_argument("--cache-dir", default=None)
    for p in (t, r):
        p.add_argument("--algorithm", required=True, help="path of the candidate's algorithm.py")
        p.add_argument("--warmstart", default=None, help="the warm-start checkpoint to train")
        p.add_argument("--name", default="candidate")
        p.add_argument("--overrides", default=None, help="JSON object of Hyperparameters overrides")
    for p in (t, s, r):
        p.add_argument("--seed", type=int, default=0)
        p.add_argument(
            "--device", choices=DEVICES, default=None, help="default: the protocol's own device"
        )
    s.add_argument("--checkpoint", required=True)
    r.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    return {"warmstart": cmd_warmstart, "train": cmd_train, "score": cmd_score, "run": cmd_run}[
        args.cmd
    ](args)


if __name__ == "__main__":
    sys.exit(main())
