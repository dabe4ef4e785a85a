"""One seed of a proxy evaluation, in two sandboxed children:

1. ``train`` runs the candidate: it RL-trains the warm start and sends, over the channel the parent
   owns, one ``step`` frame per RL step (the training trajectory — advisory: the candidate's process
   produced it) and a ``done`` frame with the trained weights.
2. ``score`` loads no candidate code: it checks the weights (weights-only load, the proxy model's
   exact names, shapes and dtypes, finite values), scores the held-out splits with the proxy's own
   evaluation function and sends the metrics, which the parent checks again (names, finiteness).

Every way the first child can end — killed by a limit, an exit before ``done``, ``SystemExit``, a
malformed frame — is a failed seed with its reason. The held-out metrics exist only if the second
child computed them.
"""

from __future__ import annotations

import threading
from pathlib import Path

from engine.sandbox.channel import ChannelError, expect, finite_number, metric_map, text
from engine.sandbox.limits import Limits
from engine.sandbox.runner import Feed, SandboxRun, Session, run_sandboxed

WORKER = "trainer_template.proxy.worker"


class _Training:
    """``on_frame`` of the training child."""

    def __init__(self, max_steps: int):
        self.max_steps = max_steps
        self.rows: dict[int, dict] = {}
        self.done: dict | None = None
        self.weights: bytes | None = None

    def __call__(self, frame: dict, _session: Session) -> None:
        if self.done is not None:
            raise ChannelError("a frame after 'done'")
        if frame["type"] == "step":
            step = expect(frame, "step", int)
            if not 0 <= step < self.max_steps or step in self.rows:
                raise ChannelError(f"step {step} is out of range or repeated")
            self.rows[step] = metric_map(frame.get("row"), allow_none=True)
        elif frame["type"] == "done":
            status = frame.get("status")
            if status not in ("ok", "failed"):
                raise ChannelError("done: status must be 'ok' or 'failed'")
            rss = frame.get("peak_rss_mb")
            if rss is not None and (
                isinstance(rss, bool) or not isinstance(rss, (int, float)) or not finite_number(rss)
            ):
                raise ChannelError("done: 'peak_rss_mb' is not a finite number")
            self.done = {
                "status": status,
                "reason": text(frame.get("reason", ""), 500),
                "timings": metric_map(frame.get("timings") or {}, allow_none=True),
                "peak_rss_mb": None if rss is None else float(rss),
                "device": text(frame.get("device") or "", 16),
            }
            self.weights = frame.get("_blob")
        else:
            raise ChannelError(f"unexpected frame type {text(frame['type'], 40)!r}")

    def trajectory(self) -> dict[str, list]:
        steps = sorted(self.rows)
        keys = sorted({k for r in self.rows.values() for k in r})
        out: dict[str, list] = {"step": steps}
        for k in keys:
            out[k] = [self.rows[s].get(k) for s in steps]
        return out if steps else {}


def run_seed(
    source: str,
    name: str,
    seed: int,
    preset: str,
    max_steps: int,
    warmstart: Path,
    limits: Limits,
    required: tuple[str, ...] = ("overall",),
    boundary=None,
    device: str = "cpu",
) -> dict:
    """``{"status": "ok"|"failed", "reason", "metrics", "trajectory", "timings", "peak_rss_mb",
    "device", "seed", "wall_s"}`` of one seed; never raises for anything the candidate does.

    ``device`` (cpu | cuda), decided by the engine, is passed to both children, which fail rather
    than fall back to the CPU; ``device`` in the result is what the training child reports it used.
    For cuda, ``limits.gpu`` must be set (the sandbox hides the GPU otherwise).
    The scorer starts with the training child (its imports overlap the training) and receives the
    weights on its stdin when they exist."""
    train = _Training(max_steps)
    feed = Feed()
    scoring: dict = {}
    scorer = threading.Thread(
        target=lambda: scoring.update(
            result=_score(feed, preset, seed, limits, required, boundary, device)
        ),
        name=f"poise-score-{seed}",
    )
    scorer.start()
    try:
        run = run_sandboxed(
            WORKER,
            ["train", "--preset", preset, "--algorithm", "{input}/algorithm.py"]
            + ["--warmstart", "{input}/warmstart.pt", "--name", name, "--seed", str(seed)]
            + ["--device", device],
            limits=limits,
            inputs={"algorithm.py": source.encode("utf-8"), "warmstart.pt": warmstart},
            on_frame=train,
            boundary=boundary,
            preload=("torch",),
        )
        data = _judge_training(run, train, seed)
        feed.put(train.weights if data is None else None)
    finally:
        feed.put(None)  # no-op after the weights; unblocks the scorer on any error
        scorer.join()
    if data is not None:
        return data
    return _with_scores(_base(run, train, seed), train, scoring["result"], seed)


def _base(run: SandboxRun, train: _Training, seed: int) -> dict:
    done = train.done or {}
    return {
        "status": "failed",
        "reason": "",
        "metrics": {},
        "trajectory": train.trajectory(),
        "timings": done.get("timings", {}),
        "peak_rss_mb": done.get("peak_rss_mb"),
        "device": done.get("device", ""),
        "seed": seed,
        "wall_s": run.wall_s,
    }


def _judge_training(run: SandboxRun, train: _Training, seed: int) -> dict | None:
    """The failed seed when the training alone decides it, else None (the weights get scored)."""
    data = _base(run, train, seed)
    problem = _ended(run, train)
    if problem:
        data["reason"] = f"seed {seed}: the training process {problem}"
        return data
    failure = train.done["reason"] if train.done["status"] == "failed" else ""
    if failure and not failure.startswith("collapsed"):
        data["reason"] = f"seed {seed}: {failure}"
        return data
    if not failure and len(train.rows) != train.max_steps:
        # a completed run sends one step frame per RL step (steps are unique and in range)
        data["reason"] = (
            f"seed {seed}: the training process reported success after {len(train.rows)} of "
            f"{train.max_steps} RL steps"
        )
        return data
    if not train.weights:
        data["reason"] = f"seed {seed}: the training process sent no trained weights"
        return data
    return None


def _with_scores(data: dict, train: _Training, scored, seed: int) -> dict:
    metrics, problem, run, eval_s = scored
    data["wall_s"] = max(data["wall_s"], run.wall_s)  # the two children overlap
    data["timings"] = {**data["timings"], "eval_s": round(eval_s, 3)}
    if problem:
        data["reason"] = f"seed {seed}: {problem}"
        return data
    data["metrics"] = metrics
    failure = train.done["reason"] if train.done["status"] == "failed" else ""
    if failure:  # collapsed: the metrics of the collapsed policy are kept, the seed failed
        data["reason"] = f"seed {seed}: {failure}"
        return data
    data["status"] = "ok"
    return data


def _ended(run: SandboxRun, train: _Training) -> str:
    """'' when the training child ended cleanly with its 'done' frame, else what happened."""
    if run.protocol_error or run.killed or run.returncode != 0:
        return run.reason()
    if train.done is None:
        return "exited without a result (status 0)"
    return ""


def _score(
    weights: Feed,
    preset: str,
    seed: int,
    limits: Limits,
    required: tuple[str, ...],
    boundary,
    device: str = "cpu",
) -> tuple[dict, str, SandboxRun, float]:
    got: dict = {}

    def on_frame(frame: dict, _session: Session) -> None:
        if got or frame["type"] not in ("metrics", "invalid"):
            raise ChannelError("the scorer sent an unexpected frame")
        got.update(frame)

    run = run_sandboxed(
        WORKER,
        ["score", "--preset", preset, "--checkpoint", "-", "--seed", str(seed), "--device", device],
        limits=limits.with_(wall_s=2 * limits.wall_s, cpu_s=limits.wall_s),
        on_frame=on_frame,
        boundary=boundary,
        stdin=weights,
        preload=("torch",),
    )
    spent = got.get("eval_s")
    eval_s = float(spent) if isinstance(spent, (int, float)) else 0.0
    if got.get("type") == "invalid":
        return {}, text(got.get("reason", "the trained checkpoint is refused"), 300), run, eval_s
    if not run.ok or got.get("type") != "metrics":
        return {}, f"scoring the trained weights failed: {run.reason()}", run, eval_s
    try:
        metrics = metric_map(got.get("metrics"), max_keys=256)
    except ChannelError as exc:
        return {}, f"the held-out evaluation produced {exc}", run, eval_s
    missing = [k for k in required if k not in metrics]
    if missing:
        return {}, f"the held-out evaluation lacks {', '.join(missing)}", run, eval_s
    return metrics, "", run, eval_s
