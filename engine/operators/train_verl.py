"""Train a node with verl's real ``main_ppo`` on the CPU (the ``verl-smoke`` protocol).

The archive, the node's MLflow run and the result belong to the engine; what verl runs comes from
:mod:`trainer_template.verl_backend.smoke` as plain paths and values. verl runs as a child process
in its own session (its Ray instance with it), killed as a group on timeout or interrupt; its output
goes to ``<work>/verl.log``. Progress comes from the rows the poise trainer appends to
``progress.jsonl`` each step (and a few milestones of the log), reported through ``on_event``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.archive.tracking import node_run, tracking_uri
from engine.errors import EvaluationError
from engine.operators.evaluate_verl import final_checkpoint
from engine.operators.verl_settings import verl_settings
from engine.sandbox.env import without_secrets
from trainer_template.verl_backend import smoke
from trainer_template.verl_backend.smoke import read_progress

SMOKE_DIR = Path(".poise") / "verl" / "smoke"
# log line -> milestone reported before the first step (verl's and Ray's own output)
MILESTONES = (
    ("Started a local Ray instance", "Ray started"),
    ("Connected to Ray cluster", "joined the running Ray"),
    ("create worker group", "actor worker starting"),
    ("LLMServerManager:", "actor, rollout server and reward loop up"),
    ("Training Progress", "training"),
)
# reported per step (the proxy's names; see trainer_template.proxy.rl.SIGNALS)
STEP_SIGNALS = ("train/reward_mean", "train/adv_std", "train/entropy", "train/pg_loss")


@dataclass
class SmokeRun:
    """What one verl smoke training produced (the engine records it; nothing here is ranked)."""

    node: str
    ok: bool
    reason: str | None
    steps: list[dict]
    checkpoint: str | None
    run_id: str
    wall_time_s: float
    log: str
    protocol: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)

    @property
    def step_times(self) -> list[float]:
        return [
            float(r["metrics"]["train/step_s"])
            for r in self.steps
            if "train/step_s" in r["metrics"]
        ]

    def final_metrics(self) -> dict[str, float]:
        """The last step's ``train/*`` signals (numbers only)."""
        if not self.steps:
            return {}
        return {k: v for k, v in self.steps[-1]["metrics"].items() if k.startswith("train/")}


def smoke_dirs(archive, node: str) -> tuple[Path, Path]:
    """(per-node work dir, per-archive shared dir) under ``<archive>/.poise/verl/smoke``."""
    root = Path(archive.path).resolve() / SMOKE_DIR
    return root / "nodes" / node, root / "shared"


def _say(on_event: Callable[[str], None] | None) -> Callable[[str], None]:
    return on_event or (lambda _m: None)


def _step_line(row: Mapping[str, Any]) -> str:
    m = row.get("metrics", {})
    parts = [f"{k.split('/', 1)[1]} {m[k]:.4g}" for k in STEP_SIGNALS if k in m]
    secs = m.get("train/step_s")
    tail = f" ({secs:.1f} s)" if secs is not None else ""
    return f"step {row['step']}/{row.get('total_steps', '?')}: " + ", ".join(parts) + tail


def _kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_verl(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | Path,
    log_path: str | Path,
    progress_path: str | Path,
    timeout_s: float,
    on_event: Callable[[str], None] | None = None,
    poll_s: float = 1.0,
) -> tuple[int | None, bool, list[dict]]:
    """Run verl to completion; returns (exit code or None on timeout, timed out, progress rows)."""
    say = _say(on_event)
    t0 = time.monotonic()
    seen_steps, pending = 0, list(MILESTONES)
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            list(cmd),
            cwd=str(cwd),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # verl, Ray and every worker in one killable group
        )
        timed_out = False
        try:
            while True:
                try:
                    proc.wait(timeout=poll_s)
                    done = True
                except subprocess.TimeoutExpired:
                    done = False
                if pending and not seen_steps:
                    text = Path(log_path).read_text(encoding="utf-8", errors="replace")
                    for marker, what in [m for m in pending if m[0] in text]:
                        say(f"{what} ({time.monotonic() - t0:.0f} s)")
                        pending.remove((marker, what))
                rows = read_progress(progress_path)
                for row in rows[seen_steps:]:
                    say(_step_line(row))
                seen_steps = len(rows)
                if done:
                    break
                if time.monotonic() - t0 > timeout_s:
                    timed_out = True
                    break
        finally:
            _kill_session(proc)  # Ray's daemons outlive the driver unless the group goes
            proc.wait()
    return (None if timed_out else proc.returncode), timed_out, read_progress(progress_path)


# A Ray head kept up by a small process; it exits (and Ray with it) when its stdin closes.
_HOLDER = """
import sys, ray
ctx = ray.init(num_cpus=int(sys.argv[1]), num_gpus=1, include_dashboard=False, log_to_driver=False)
print(ctx.address_info["gcs_address"], flush=True)
sys.stdin.read()
ray.shutdown()
"""


@contextlib.contextmanager
def shared_ray(num_cpus: int = 32, start_timeout_s: float = 180.0) -> Iterator[str]:
    """One local Ray (``num_cpus`` logical CPUs, one logical GPU) for several smokes in a row: yields
    its address for ``train_smoke(ray_address=...)`` (or ``RAY_ADDRESS`` for the CLI), so only the
    first run pays Ray's start. Stopped on exit, its process group killed if it does not stop."""
    env = without_secrets({"RAY_AUTH_MODE": "token"})  # Ray's workers run candidate code
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(num_cpus)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=start_timeout_s):
            raise EvaluationError(f"Ray did not start within {start_timeout_s:.0f} s")
        address = proc.stdout.readline().strip()
        if not address:
            raise EvaluationError(f"Ray failed to start (exit status {proc.poll()})")
        yield address
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        _kill_session(proc)
        proc.wait()


def _tail(path: str | Path, n: int = 30) -> str:
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln]
    return (errors[-1] if errors else "\n".join(lines[-n:]))[-2000:]


def train_smoke(
    archive,
    node: str,
    *,
    proto=None,
    hparams: Mapping[str, Any] | None = None,
    extra: Sequence[str] = (),
    timeout_s: float = 1800.0,
    on_event: Callable[[str], None] | None = None,
    ray_address: str | None = None,
) -> SmokeRun:
    """Train ``node`` for ``proto.steps`` verl steps on the CPU, logging into a new MLflow run of the
    node (joining the Ray at ``ray_address`` when given, see :func:`shared_ray`); the result is not
    recorded here (:func:`engine.operators.verl_smoke_result.record_smoke`). The node's settings
    are read in a sandboxed child first: a bad source or ``--hparam`` raises AlgorithmLoadError
    before any run is opened."""
    say = _say(on_event)
    proto = proto or smoke.SmokeProtocol()
    source = archive.algorithm(node)
    settings = verl_settings(source, node, hparams)  # a bad source or --hparam opens no run
    work, shared = smoke_dirs(archive, node)
    say("building the tiny model, tokenizer and data (cached per archive)")
    tags = {"poise.backend": "verl", "poise.protocol": smoke.PROTOCOL_ID}
    with node_run(archive, node, run_name=f"{node}-{smoke.PROTOCOL_ID}", tags=tags) as run:
        run_id = run.info.run_id
    try:
        project = archive.config().experiment.name
    except Exception:  # noqa: BLE001 - a config without the section: verl's project name only
        project = "poise"
    launch = smoke.prepare(
        node,
        source,
        settings,
        work_dir=work,
        shared_dir=shared,
        tracking_uri=tracking_uri(archive.path),
        run_id=run_id,
        project=project,
        proto=proto,
        hparams=hparams,
        extra=extra,
        ray_address=ray_address,
    )
    say(
        f"verl main_ppo on the CPU: {proto.steps} steps, MLflow run {run_id}, log {launch.files['log']}"
    )
    t0 = time.monotonic()
    code, timed_out, rows = run_verl(
        launch.cmd,
        env=without_secrets(launch.env),  # verl runs the candidate: no key reaches it
        cwd=work,
        log_path=launch.files["log"],
        progress_path=launch.files["progress"],
        timeout_s=timeout_s,
        on_event=on_event,
    )
    wall = time.monotonic() - t0

    ckpt = final_checkpoint(launch.files["ckpt"])
    reason = None
    if timed_out:
        reason = f"verl did not finish within {timeout_s:.0f} s"
    elif code != 0:
        reason = f"verl exited with status {code}: {_tail(launch.files['log'])}"
    elif len(rows) < proto.steps:
        reason = f"verl logged {len(rows)} of {proto.steps} steps"
    elif ckpt is None:
        reason = "verl saved no Hugging Face checkpoint"
    return SmokeRun(
        node=node,
        ok=reason is None,
        reason=reason,
        steps=rows,
        checkpoint=str(ckpt) if ckpt else None,
        run_id=run_id,
        wall_time_s=wall,
        log=launch.files["log"],
        protocol=proto.as_dict(),
        files=dict(launch.files),
    )


def require_verl() -> None:
    """One clear error when the verl extra is missing."""
    for mod, what in (("verl", "verl"), ("transfer_queue", "TransferQueue"), ("ray", "ray")):
        if importlib.util.find_spec(mod) is None:
            raise EvaluationError(
                f"{what} is not installed: install the project's `verl` extra "
                "(pip install 'poise-git[verl]')"
            )
