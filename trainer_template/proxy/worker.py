"""Per-seed subprocess entry point (run by engine.operators.evaluate inside engine.sandbox.process limits).

    python -m trainer_template.proxy.worker warmstart --preset default [--cache-dir D]
    python -m trainer_template.proxy.worker run --algorithm A.py --seed 0 --out R.json [--preset P]

``run`` loads the candidate's source as a fresh module (trainer_template.loader), RL-trains the cached
warm start with it and evaluates; it writes R.json atomically: ``{"status": "ok"|"failed", "reason",
"metrics", "trajectory", "timings", "peak_rss_mb"}`` (a partial file with status "running" every few
steps, so a killed run still leaves its last trajectory).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
import traceback
from pathlib import Path

from trainer_template.loader import load_algorithm, make_config
from trainer_template.proxy.protocol import get_protocol


def _write(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, allow_nan=False, default=str))
    os.replace(tmp, path)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _clean(traj: dict) -> dict:
    return {
        k: [None if isinstance(v, float) and not math.isfinite(v) else v for v in vals]
        for k, vals in traj.items()
    }


def cmd_warmstart(args: argparse.Namespace) -> int:
    # lazy: torch is heavy (only this path needs it)
    from trainer_template.proxy.warmstart import ensure_warmstart

    path = ensure_warmstart(
        get_protocol(args.preset),
        args.cache_dir,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(path)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import torch  # lazy: torch is heavy (only this path needs it)

    torch.set_num_threads(1)
    from trainer_template.proxy import evalset, rl  # lazy: torch is heavy (only this path needs it)

    # lazy: torch is heavy (only this path needs it)
    from trainer_template.proxy.warmstart import ensure_warmstart, load_warmstart

    out = Path(args.out)
    protocol = get_protocol(args.preset)
    traj: dict[str, list] = {}
    timings: dict[str, float] = {}
    result = {
        "status": "failed",
        "reason": "",
        "metrics": {},
        "trajectory": traj,
        "timings": timings,
    }
    t0 = time.monotonic()
    try:
        module = load_algorithm(Path(args.algorithm).read_text(encoding="utf-8"), args.name)
        cfg = make_config(module, json.loads(args.overrides) if args.overrides else None)
    except Exception as exc:
        result["reason"] = f"{type(exc).__name__}: {exc}"
        _write(out, result)
        return 0
    model = load_warmstart(ensure_warmstart(protocol, args.cache_dir), protocol.warmstart)
    timings["load_s"] = time.monotonic() - t0

    def checkpoint(step: int) -> None:
        if step % 10 == 9:
            _write(
                out,
                {
                    "status": "running",
                    "reason": "",
                    "metrics": {},
                    "trajectory": _clean(traj),
                    "timings": timings,
                    "peak_rss_mb": _rss_mb(),
                },
            )

    t1 = time.monotonic()
    failure = None
    try:
        rl.train(model, module, cfg, protocol.rl, args.seed, trajectory=traj, on_step=checkpoint)
    except rl.CandidateFailure as exc:
        failure = str(exc)
    except (
        Exception
    ) as exc:  # the harness itself, driven by a broken candidate into a state it rejects
        failure = f"RL step failed: {type(exc).__name__}: {exc}"
        traceback.print_exc()
    timings["rl_s"] = time.monotonic() - t1
    t2 = time.monotonic()
    metrics = {}
    if failure is None or failure.startswith("collapsed"):
        metrics = evalset.evaluate(model, protocol.eval, args.seed)
        if not all(math.isfinite(v) for v in metrics.values()):
            metrics, failure = {}, failure or "evaluation produced NaN/inf"
    timings["eval_s"] = time.monotonic() - t2
    timings["total_s"] = time.monotonic() - t0
    result.update(
        status="failed" if failure else "ok",
        reason=failure or "",
        metrics=metrics,
        trajectory=_clean(traj),
        peak_rss_mb=_rss_mb(),
    )
    _write(out, result)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer_template.proxy.worker")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("warmstart", help="build (or find) the cached warm start")
    r = sub.add_parser("run", help="RL-train and evaluate one seed of one candidate")
    for p in (w, r):
        p.add_argument("--preset", default="default")
        p.add_argument("--cache-dir", default=None)
    r.add_argument("--algorithm", required=True, help="path of the candidate's algorithm.py")
    r.add_argument("--name", default="candidate")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", required=True)
    r.add_argument("--overrides", default=None, help="JSON object of Hyperparameters overrides")
    args = ap.parse_args(argv)
    return cmd_warmstart(args) if args.cmd == "warmstart" else cmd_run(args)


if __name__ == "__main__":
    sys.exit(main())
