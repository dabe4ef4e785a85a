"""Parallel evaluation of candidates: a local pool of worker processes (default) or Ray tasks.

Every evaluation runs ``python -m engine.loop.executor JOB`` — a fresh process (one thread for torch) calling
``engine.evaluate.evaluate_node`` — in its own session with a hard wall-clock limit: past the limit the
whole process tree is killed (its descendants too, even those that started their own process groups)
and the node is recorded as ``failed`` with the reason. A worker also dies with the process that
started it (PR_SET_PDEATHSIG), so a killed loop leaves no orphaned evaluation behind.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.archive.results import EvaluationResult, Protocol, now
from engine.archive.scoring import SCORING
from engine.archive.store import Archive
from engine.archive.tracking import end_dangling_runs
from engine.errors import EvaluationError
from engine.loop.waiting import WaitClock, WaitNote
from engine.operators.evaluate import WarmStartFailed, evaluate_node, proxy_protocol
from engine.operators.evaluate_suite import suite_protocol
from engine.sandbox.process import child_env
from engine.scratch import SANDBOX_PREFIX, scratch_dir
from trainer_template.proxy.protocol import get_protocol

log = logging.getLogger(__name__)
RESULT_MARK = "POISE-EVAL-RESULT "
RAY_NODE_TAG = "poise.ray.node"
"""MLflow tag of an evaluation's runs on Ray: the id of the Ray node that ran it"""
HOST_TAG = "poise.host"
"""MLflow tag of an evaluation's runs on Ray: the host name of the machine that ran it"""
NODE_LOSSES = 3
"""times one evaluation may lose its Ray node (each time re-queued) before it is recorded failed:
a candidate whose evaluation brings machines down must not take the cluster down one by one"""
STOPPED = "stopped"
"""outcome status of an evaluation the loop itself stopped (budget, interrupt): nothing is recorded"""
SETUP_FAILED = "setup failed"
"""outcome status of an evaluation whose trusted set-up failed (the proxy's warm start), not the
candidate: nothing is recorded, the node is left for ``--resume``, and the loop stops"""


@dataclass
class EvalJob:
    """One candidate evaluation. ``timeout_s`` is the hard wall-clock limit of the whole process tree."""

    archive: str
    node: str
    backend: str = "proxy"
    seeds: int | None = None
    preset: str | None = None
    timeout_s: float = 1800.0
    tags: dict[str, str] = field(default_factory=dict)
    devices: float = 1.0
    """devices the evaluation holds (GPUs on verl, seed processes on the proxy): for budgets and Ray"""


@dataclass
class EvalOutcome:
    node: str
    status: str
    """evaluated | failed"""
    reason: str = ""
    overall: float | None = None
    wall_s: float = 0.0
    timed_out: bool = False
    other: str = ""
    """"" unless the worker waited for another process evaluating the node: ``engine.loop.waiting.USED``
    (the result is the one that process recorded) or why it was not this evaluation's"""
    waited_s: float = 0.0
    """seconds the worker waited for that process (not counted against its wall-clock limit)"""
    where: str = ""
    """on Ray, the node that ran the evaluation (``ray-node <id> on <host>``); "" elsewhere"""
    lost: tuple[str, ...] = ()
    """on Ray, the nodes that died while they ran this evaluation, each time re-queued"""


def _grace(timeout_s: float) -> float:
    """Extra time past the evaluation's own limit before the tree is killed from outside: the worker's
    start-up (imports, the proxy's warm-start lookup) comes on top of the evaluation's own clock."""
    return min(60.0, 0.25 * timeout_s) + 15.0


def run_job(
    job: EvalJob,
    live: _Live | None = None,
    on_wait: Callable[[bool], None] | None = None,
    env: dict[str, str] | None = None,
) -> EvalOutcome:
    """Run one evaluation in a limited worker process; record a failure on the node if it dies.
    ``env``: variables the worker's environment gets on top of the engine's.
    ``live``: the executor's register of its workers (a Ray task's process has its own); once it is
    stopped no worker starts, and one that started meanwhile is killed at once. The time the worker
    waits for another process evaluating its node does not count against its limit
    (``engine.loop.waiting``); ``on_wait(True)`` / ``on_wait(False)`` is told when the wait starts
    and ends."""
    live = live if live is not None else _LIVE
    start = time.monotonic()
    if live.stopped():
        return _stopped(job, 0.0)
    limit = job.timeout_s + _grace(job.timeout_s)
    wait_r, wait_w = os.pipe()
    cmd = [sys.executable, "-m", "engine.loop.executor", json.dumps(asdict(job)), str(wait_w)]
    # the worker's $TMPDIR, made and removed here: a worker is stopped with SIGKILL (a stop, its
    # wall-clock limit), which no clean-up of its own survives, and what it made there (its seeds'
    # sandboxes, blobs, MLflow's files) would stay until the next run ends or `gc`
    with scratch_dir(SANDBOX_PREFIX) as tmpdir:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env({**(env or {}), "TMPDIR": tmpdir}),
            start_new_session=True,
            pass_fds=(wait_w,),
        )
        os.close(wait_w)
        clock = WaitClock(wait_r)
        timed_out = False
        out = err = ""
        try:
            if not live.add(proc):  # the executor stopped while this worker was starting
                raise _Stop
            out, err = _communicate(proc, clock, limit, on_wait)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc.pid)
            out, err = proc.communicate()
        except _Stop:
            kill_tree(proc.pid)
            proc.communicate()
        finally:
            clock.close()
            kill_tree(proc.pid, wait=True)
            live.discard(proc)
    wall = time.monotonic() - start
    if live.was_stopped(proc):
        return _stopped(job, wall)
    for line in reversed((out or "").splitlines()):
        if line.startswith(RESULT_MARK):
            data = json.loads(line[len(RESULT_MARK) :])
            return EvalOutcome(
                job.node,
                data["status"],
                data.get("reason", ""),
                data.get("overall"),
                wall,
                False,
                data.get("other", ""),
                float(data.get("waited_s", 0.0)),
            )
    if timed_out:
        reason = f"evaluation exceeded the wall-clock limit ({job.timeout_s:.0f} s); its process tree was killed"
    elif proc.returncode and proc.returncode < 0:
        reason = f"evaluation process killed by {signal.Signals(-proc.returncode).name}"
    else:
        tail = [ln for ln in (err or "").strip().splitlines() if ln.strip()]
        reason = "evaluation crashed: " + (
            tail[-1][:250] if tail else f"exit status {proc.returncode}"
        )
    _end_worker_runs(job)
    return record_failure(job, reason, wall, timed_out)


def _communicate(
    proc: subprocess.Popen, clock: WaitClock, limit: float, on_wait: Callable[[bool], None] | None
) -> tuple[str, str]:
    """``proc.communicate()`` within ``limit`` seconds of the worker's own time (``clock``: its
    wall time less its wait for another process); TimeoutExpired past it."""
    waiting = False
    while True:
        clock.poll()
        if on_wait is not None and clock.waiting != waiting:
            waiting = clock.waiting
            on_wait(waiting)
        left = limit - clock.counted()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, limit)
        try:  # a retried communicate() loses no output
            return proc.communicate(timeout=left if clock.settled else min(left, 0.25))
        except subprocess.TimeoutExpired:
            continue


def _end_worker_runs(job: EvalJob) -> None:
    """The MLflow runs the dead worker was logging into, marked KILLED: a worker killed while it
    logs (its wall-clock limit, a signal) never ends them, and they would read as live for good.
    Only the runs carrying the job's tags: another process may be evaluating the node meanwhile."""
    if not job.tags:
        return
    try:
        end_dangling_runs(Archive(job.archive), job.node, job.tags)
    except Exception as exc:  # tracking is best effort; the node's outcome is recorded in git
        log.warning("could not end the MLflow runs of %s's dead worker: %s", job.node, exc)


class _Stop(Exception):
    """The worker started after its executor was stopped."""


def _stopped(job: EvalJob, wall_s: float) -> EvalOutcome:
    return EvalOutcome(job.node, STOPPED, "stopped by the loop; left for --resume", None, wall_s)


def record_failure(
    job: EvalJob, reason: str, wall_s: float, timed_out: bool = False
) -> EvalOutcome:
    """Record the node failed under the job's protocol, with the reason, unless the evaluation
    itself already recorded its result there."""
    arch = Archive(job.archive)
    protocol = job_protocol(arch, job)
    node = arch.node(job.node)
    done = node.results.get(protocol.id)
    if node.status in ("evaluated", "failed") and done is not None:
        return EvalOutcome(job.node, done.status, done.reason, done.value, wall_s, timed_out)
    verl = job.backend == "verl"  # recorded as its evaluation records a failed training
    result = EvaluationResult(
        protocol=protocol,
        status="failed",
        reason=reason,
        seeds=(protocol.settings["seed"],) if verl else tuple(range(job.seeds or 1)),
        utility=arch.config().experiment.objective,
        wall_time_s=round(wall_s, 3),
        node_commit=node.commit,
        source="loop",
        recorded_at=now(),
        details={"training": {"gpus": job.devices, "wall_time_s": round(wall_s, 3)}}
        if verl
        else {},
    )
    arch.record_result(job.node, result)
    return EvalOutcome(job.node, "failed", reason, None, wall_s, timed_out)


def job_protocol(arch, job: EvalJob):
    """The typed protocol a job evaluates under (what its result is recorded as): on verl, the suite
    protocol its checkpoint is scored under, where a failed training is recorded too."""
    if job.backend == "proxy":
        preset = job.preset or arch.config().proxy.preset
        return proxy_protocol(preset, get_protocol(preset))
    if job.backend == "verl":
        return suite_protocol(**SCORING)
    return Protocol(f"{job.backend}/paper", backend=job.backend, preset="paper")


def kill_tree(pid: int, *, wait: bool = False) -> None:
    """SIGKILL ``pid``, every descendant and their process groups (never our own group);
    ``wait``: until they are gone (at most 10 s), so that nothing writes where they worked."""
    try:
        import psutil  # lazy: psutil is heavy (only this path needs it)

        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except Exception:
        procs = []
    own = os.getpgrp()
    groups = {pid}
    for p in procs:
        try:
            groups.add(os.getpgid(p.pid))
        except OSError:
            pass
    for g in groups:
        if g != own:
            try:
                os.killpg(g, signal.SIGKILL)
            except OSError:
                pass
    for p in procs:
        try:
            p.kill()
        except Exception:
            pass
    if wait and procs:
        import psutil  # lazy: psutil is heavy (only this path needs it)

        psutil.wait_procs(procs, timeout=10)


class _Live:
    """An executor's worker processes in flight, so that shutdown can kill them. Once killed, the
    register stays stopped: a worker started afterwards (its job was taken from the queue while
    the others were being killed) is refused and killed too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set = set()
        self._killed: set = set()
        self._stopping = False

    def add(self, p) -> bool:
        """Register ``p``; False (not registered) once the register is stopped."""
        with self._lock:
            if self._stopping:
                self._killed.add(p)
                return False
            self._procs.add(p)
            return True

    def discard(self, p) -> None:
        with self._lock:
            self._procs.discard(p)

    def stopped(self) -> bool:
        with self._lock:
            return self._stopping

    def kill_all(self) -> None:
        with self._lock:
            self._stopping = True
            procs = list(self._procs)
            self._killed.update(procs)
        for p in procs:
            kill_tree(p.pid)

    def was_stopped(self, p) -> bool:
        with self._lock:
            return p in self._killed


_LIVE = _Live()


class LocalExecutor:
    """At most ``workers`` evaluations at once, each its own limited process."""

    kind = "local"

    def __init__(self, workers: int = 1):
        self.workers = max(1, int(workers))
        self._pool = cf.ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix="poise-eval"
        )
        self._live = _Live()

    def submit(self, job: EvalJob) -> cf.Future:
        return self._pool.submit(run_job, job, self._live)

    def shutdown(self, kill: bool = False) -> None:
        """Wait for the evaluations; with ``kill``, cancel the queued ones and kill those running
        (their nodes are left for ``--resume``), so that no evaluation starts after this call."""
        if kill:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._live.kill_all()
        self._pool.shutdown(wait=True, cancel_futures=kill)


class _StartClock:
    """A Ray actor that notes when each of an executor's tasks started, on its own clock (no skew
    between machines): the driver cannot see when a queued task began running without Ray's state
    API, and a lost task is charged (the gpu-hours budget) from its start, not its submission."""

    def __init__(self) -> None:
        self._started: dict[str, float] = {}
        self._waits: dict[str, tuple[float, float | None]] = {}
        self._nodes: dict[str, str] = {}

    def started(self, token: str, node_id: str = "") -> None:
        self._started[token] = time.monotonic()
        self._nodes[token] = node_id

    def node_of(self, token: str) -> str:
        """The Ray node the task ``token`` reported starting on ("" when it never started)."""
        return self._nodes.get(token, "")

    def ran_s(self, token: str) -> float | None:
        """Seconds since the task ``token`` reported its start (None: it never started); forgets it."""
        t = self._started.pop(token, None)
        self._waits.pop(token, None)
        self._nodes.pop(token, None)
        return None if t is None else time.monotonic() - t

    def waiting(self, token: str, now_waiting: bool) -> None:
        """The task ``token``'s worker starts (True) or stops waiting for another process."""
        done, since = self._waits.get(token, (0.0, None))
        if now_waiting and since is None:
            self._waits[token] = (done, time.monotonic())
        elif not now_waiting and since is not None:
            self._waits[token] = (done + time.monotonic() - since, None)

    def waited_s(self, token: str) -> float:
        """Seconds the task ``token``'s worker has waited for another process so far."""
        done, since = self._waits.get(token, (0.0, None))
        return done + (time.monotonic() - since if since is not None else 0.0)


def run_ray_job(job: EvalJob, clock: Any, token: str) -> EvalOutcome:
    """A Ray task: report the start and the node it runs on to the executor's clock (the trusted
    side, before any of the candidate's code runs), then :func:`run_job`, whose MLflow runs are
    tagged with that node (``poise.ray.node``, ``poise.host``). The report is not waited for: a task
    blocked in ``ray.get`` lends its CPUs to another task."""
    import ray  # lazy: optional dependency (ray extra); this runs in a Ray worker

    node_id = ""
    try:
        node_id = ray.get_runtime_context().get_node_id() or ""
    except Exception as exc:  # noqa: BLE001 - where it ran is then unknown, nothing else
        log.warning("could not read the Ray node of %s's evaluation: %s", job.node, exc)
    host = socket.gethostname()
    repo = Path(job.archive)
    if not ((repo / ".git").exists() or (repo / "HEAD").is_file()):  # the run stops: not the
        # candidate's doing, and every evaluation on this node would fail alike
        return EvalOutcome(
            job.node,
            SETUP_FAILED,
            f"the archive {job.archive} is not there on {where_ran(node_id, host)}: every Ray "
            "node must see it at the same path (a shared filesystem)",
        )
    job = replace(job, tags={**job.tags, RAY_NODE_TAG: node_id, HOST_TAG: host})
    try:
        clock.started.remote(token, node_id)
    except Exception as exc:  # the task is charged from its submission instead
        log.warning("could not report the start of %s's evaluation: %s", job.node, exc)

    def waiting(now_waiting: bool) -> None:  # the driver's backstop does not count the wait
        try:
            clock.waiting.remote(token, now_waiting)
        except Exception as exc:
            log.warning("could not report %s's wait for another process: %s", job.node, exc)

    # RAY_ADDRESS=local: a Ray the evaluation starts itself (verl's main_ppo calls ray.init())
    # is a private one on what this task holds (its GPUs: Ray set CUDA_VISIBLE_DEVICES), not the
    # cluster, which ray.init() would otherwise join (RAY_ADDRESS, or the node's
    # /tmp/ray/ray_current_cluster that `ray start` writes) and ask again for GPUs this task holds
    out = run_job(job, on_wait=waiting, env={"RAY_ADDRESS": "local"})
    return replace(out, where=where_ran(node_id, host))


def where_ran(node_id: str, host: str) -> str:
    """How a log line names the Ray node that ran an evaluation."""
    return f"ray-node {node_id[:8] or '?'} on {host}"


@dataclass
class _NodeLost:
    """A Ray task that died with the node running it: not the evaluation's failure."""

    where: str
    why: str
    ran_s: float


_UNKNOWN = ("unknown",)


def _current_result(job: EvalJob) -> EvaluationResult | None:
    """The result the job's node holds now under the job's protocol (None: none)."""
    arch = Archive(job.archive)
    return arch.node(job.node).results.get(job_protocol(arch, job).id)


def _key(result: EvaluationResult) -> tuple:
    """What tells one recorded result from another of the same node and protocol."""
    return (result.recorded_at, result.node_commit, result.status)


def _result_key(job: EvalJob) -> tuple | None:
    """What identifies the job's node's result under its protocol now (None: it has none;
    ``_UNKNOWN`` where the archive cannot say, a node dropped meanwhile say)."""
    try:
        done = _current_result(job)
    except Exception:  # noqa: BLE001 - the evaluation itself says what is wrong
        return _UNKNOWN
    return None if done is None else _key(done)


def _landed(job: EvalJob, before: tuple | None) -> EvalOutcome | None:
    """The outcome of a result the job's evaluation recorded (one other than ``before``, what the
    node held when the job was submitted) before its Ray node died; None when it recorded none."""
    if before == _UNKNOWN:
        return None
    done = _current_result(job)
    if done is None or _key(done) == before:
        return None
    return EvalOutcome(job.node, done.status, done.reason, done.value, 0.0)


def _reachable(address: str) -> None:
    """Refuse at once, in one line, a cluster address nothing answers at: Ray itself retries a
    dead address for minutes before it gives up. ``auto`` (the cluster this machine belongs to)
    is left to Ray."""
    if address == "auto":
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise EvaluationError(
            f"--ray {address!r}: use 'local', 'auto', HOST:PORT (the head's GCS port, 6379 by "
            "default) or ray://HOST:PORT (Ray Client, 10001 by default)"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=10):
            pass
    except OSError as exc:
        raise EvaluationError(
            f"cannot reach the Ray cluster at {address} ({exc.strerror or exc}): start its head "
            "with `ray start --head`, or give the address it printed; nothing was evaluated"
        ) from None


def _join_failed(address: str, exc: Exception) -> str:
    """The one line saying why joining the Ray cluster at ``address`` failed."""
    why = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    msg = f"cannot join the Ray cluster at {address}: {why}"
    if "auth" in str(exc).lower() or address not in ("auto", "local", "", None):
        msg += (
            " (a cluster whose head runs token authentication, which `ray start --head` turns on"
            " where ~/.ray/auth_token exists, needs RAY_AUTH_MODE=token and its token, in"
            " RAY_AUTH_TOKEN or ~/.ray/auth_token, here and on every node; docs/ray.md)"
        )
    return msg + "; nothing was evaluated"


class RayExecutor:
    """Each evaluation a Ray task declaring its CPUs / GPUs; the task runs the same limited worker.

    ``address``: ``local`` starts a private instance with ``workers`` CPUs; ``auto`` or ``ray://…``
    joins a cluster. The archive must be reachable from the workers (a shared filesystem)."""

    kind = "ray"

    def __init__(
        self,
        address: str = "local",
        workers: int = 1,
        num_gpus: float = 0.0,
        cpus_per_task: float = 1.0,
    ):
        import ray  # lazy: optional dependency (ray extra)

        self.ray = ray
        repo = str(Path(__file__).resolve().parents[2])
        env = {
            "PYTHONPATH": repo
            + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
        }
        # the tracking server the driver logs into, the workers too (without it each node would
        # log into the archive's SQLite file); one carrying a user or password is left to the
        # nodes' own environment: Ray shows a task's environment to whoever can list its tasks
        uri = os.environ.get("MLFLOW_TRACKING_URI", "")
        if uri and "@" not in urllib.parse.urlsplit(uri).netloc:
            env["MLFLOW_TRACKING_URI"] = uri
        kwargs: dict[str, Any] = {
            "include_dashboard": False,
            "log_to_driver": False,
            "ignore_reinit_error": True,
            "runtime_env": {"env_vars": env},
        }
        if address in ("local", "", None):
            kwargs["num_cpus"] = max(1, int(workers)) * max(
                1, int(cpus_per_task)
            )  # W evaluations of S seeds at once
        else:
            kwargs["address"] = address
            _reachable(address)
        self._owns = not ray.is_initialized()
        # ray.init puts `sys.exit` in place of the process's SIGTERM handler (the CLI's, which
        # kills the sandboxed children and unwinds as on Ctrl-C): a SIGTERM then left the run by
        # SystemExit and often died of SIGABRT with a native stack dump. Ours is put back.
        main = threading.current_thread() is threading.main_thread()
        sigterm = signal.getsignal(signal.SIGTERM) if main else None
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError) as exc:
            raise EvaluationError(_join_failed(address, exc)) from None
        finally:
            if main and sigterm is not None:
                signal.signal(signal.SIGTERM, sigterm)
        self.num_gpus = num_gpus
        self._remote = ray.remote(max_retries=0)(run_ray_job)
        # on the driver's own node: an actor Ray put on a worker node would die with it, and with it
        # what the executor knows of the tasks that node ran
        clock = ray.remote(num_cpus=0)(_StartClock)
        try:
            from ray.util.scheduling_strategies import (  # lazy: optional dependency (ray extra)
                NodeAffinitySchedulingStrategy,
            )

            here = ray.get_runtime_context().get_node_id()
            clock = clock.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False)
            )
        except Exception as exc:  # noqa: BLE001 - then wherever Ray puts it
            log.warning("the Ray tasks' start clock could not be pinned to this node (%s)", exc)
        self._clock = clock.remote()
        try:  # running before any task reports to it: a report queued while the actor starts up
            # would be noted late, and the task charged less than it ran
            ray.get(self._clock.ran_s.remote(""), timeout=120)
        except Exception as exc:  # noqa: BLE001 - lost tasks are then charged from submission
            log.warning("the Ray tasks' start clock did not start (%s)", exc)
        self._pool = cf.ThreadPoolExecutor(max_workers=64, thread_name_prefix="poise-ray")
        self._refs: set = set()
        self._stopping = False

    def submit(self, job: EvalJob) -> cf.Future:
        # submitted to Ray here, not when a thread of the pool takes it: every evaluation queues
        # in Ray at once, however many the pool waits for
        before = _result_key(job)
        token = uuid.uuid4().hex
        first = (token, time.monotonic(), self._submit_task(job, token))
        return self._pool.submit(self._evaluate, job, before, first)

    def _evaluate(self, job: EvalJob, before: tuple | None, first: tuple) -> EvalOutcome:
        """``job``'s Ray task (``first``: its token, start and reference) waited for; submitted
        again when the node running it died (at most :data:`NODE_LOSSES` times, then recorded
        failed), recorded failed on any other failure of the task. ``before``: what identified the
        node's result under the job's protocol when the job was submitted."""
        lost: list[str] = []
        lost_s = 0.0
        token, start, ref = first
        while True:
            try:
                out = self._wait(job, ref, token, start)
            finally:
                self._refs.discard(ref)
                self._forget(token)
            if not isinstance(out, _NodeLost):
                return replace(out, wall_s=out.wall_s + lost_s, lost=tuple(lost))
            lost.append(out.where)
            lost_s += out.ran_s
            # the dead worker never ends the MLflow runs it was logging into
            _end_worker_runs(job)
            landed = _landed(job, before)
            if landed is not None:  # recorded before the node died: nothing to evaluate again
                return replace(landed, wall_s=lost_s, lost=tuple(lost))
            if self._stopping:
                return EvalOutcome(job.node, STOPPED, "stopped by the loop; left for --resume")
            if len(lost) >= NODE_LOSSES:
                return replace(
                    record_failure(
                        job,
                        f"its evaluation lost its Ray node {len(lost)} times "
                        f"({', '.join(lost)}); not submitted again",
                        lost_s,
                    ),
                    lost=tuple(lost),
                )
            log.warning(
                "%s: the Ray node running its evaluation died (%s); re-queued (%s)",
                job.node,
                out.where,
                out.why,
            )
            token, start = uuid.uuid4().hex, time.monotonic()
            ref = self._submit_task(job, token)

    def _submit_task(self, job: EvalJob, token: str):
        cpus = 1.0 if self.num_gpus else max(1.0, float(job.seeds or 1))
        ref = self._remote.options(num_cpus=cpus, num_gpus=self.num_gpus).remote(
            job, self._clock, token
        )
        self._refs.add(ref)
        if self._stopping:  # a re-queue that crossed shutdown's cancellation
            self.ray.cancel(ref, force=True)
        return ref

    def _wait(self, job: EvalJob, ref, token: str, start: float) -> EvalOutcome | _NodeLost:
        """The task's outcome; :class:`_NodeLost` when the node it ran on died under it."""
        # the task enforces the limit itself; this is only a backstop for a lost worker
        limit = job.timeout_s + 2 * _grace(job.timeout_s) + 60
        try:
            return self._get(ref, token, start, limit)
        except Exception as exc:  # worker lost, task cancelled, or the backstop fired
            if self._stopping:
                return EvalOutcome(job.node, STOPPED, "stopped by the loop; left for --resume")
            self.ray.cancel(ref, force=True)
            node = self._node_of(token)
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            # the time since the task started (the gpu-hours budget counts it), not the
            # backstop's limit nor its time in Ray's queue: a worker lost after seconds costs
            # seconds, one that never started none
            ran = self._ran_s(token, time.monotonic() - start)
            if self._node_died(exc, node):
                return _NodeLost(f"ray-node {node[:8] or '?'}", why, ran)
            _end_worker_runs(job)
            return record_failure(job, f"Ray task failed: {why}", ran)

    def _node_of(self, token: str) -> str:
        try:
            return str(self.ray.get(self._clock.node_of.remote(token), timeout=30))
        except Exception:  # noqa: BLE001 - the clock unreachable: the node is unknown
            return ""

    def _node_died(self, exc: Exception, node: str) -> bool:
        """Whether the task failed because the Ray node under it died, not of its own doing.

        Ray says so itself (``NodeDiedError``: the task's node is gone), or the worker process
        died (``WorkerCrashedError``) on a node the cluster now reports dead. A worker that died
        on a node still alive is the evaluation's own failure: whatever the candidate does can
        end it (a kill, the kernel's OOM killer), and it is recorded failed, never run again."""
        errors = self.ray.exceptions
        if isinstance(exc, errors.NodeDiedError):
            return True
        if not node or not isinstance(exc, errors.WorkerCrashedError):
            return False
        try:
            alive = {n["NodeID"]: n["Alive"] for n in self.ray.nodes()}
        except Exception:  # noqa: BLE001 - the cluster cannot say: not a known node death
            return False
        return alive.get(node) is False

    def _get(self, ref, token: str, start: float, limit: float) -> EvalOutcome:
        """The task's outcome, waited for up to ``limit`` seconds since ``start`` plus the time its
        worker waited for another process evaluating the node (the task's own limit leaves that
        out too); GetTimeoutError past it."""
        waited = 0.0
        while True:
            left = start + limit + waited - time.monotonic()
            try:
                return self.ray.get(ref, timeout=max(1.0, left))
            except self.ray.exceptions.GetTimeoutError as timeout:
                try:
                    waited = float(self.ray.get(self._clock.waited_s.remote(token), timeout=30))
                except Exception as exc:  # noqa: BLE001 - the clock unreachable: no wait known
                    log.warning("the Ray tasks' start clock is unreachable (%s)", exc)
                    raise timeout from exc
                if time.monotonic() - start >= limit + waited:
                    raise

    def _ran_s(self, token: str, since_submitted: float) -> float:
        """How long the task ``token`` ran, by its reported start: 0 if it never started; the time
        since its submission (an upper bound) where the clock cannot be asked."""
        try:
            ran = self.ray.get(self._clock.ran_s.remote(token), timeout=30)
        except Exception as exc:
            log.warning(
                "the Ray tasks' start clock is unreachable (%s): charged from submission", exc
            )
            return since_submitted
        return 0.0 if ran is None else float(ran)

    def _forget(self, token: str) -> None:
        try:
            self._clock.ran_s.remote(token)  # not waited for: only drops the entry
        except Exception:
            pass

    def shutdown(self, kill: bool = False) -> None:
        if kill:
            self._stopping = True
            for ref in list(self._refs):
                try:
                    self.ray.cancel(ref, force=True)
                except Exception:
                    pass
        self._pool.shutdown(wait=True, cancel_futures=kill)
        if self._owns:
            self.ray.shutdown()


def make_executor(
    workers: int, ray_address: str | None = None, num_gpus: float = 0.0, seeds: int = 1
):
    if ray_address:
        return RayExecutor(ray_address, workers, num_gpus, cpus_per_task=1 if num_gpus else seeds)
    return LocalExecutor(workers)


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG (Linux): SIGTERM this worker when the thread that started it exits; the handler
    kills the worker's own descendants (seed processes in their own sessions included), then exits."""

    def on_term(signum, frame) -> None:
        try:
            import psutil  # lazy: psutil is heavy (only this path needs it)

            for child in psutil.Process().children(recursive=True):
                kill_tree(child.pid)
        finally:
            os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except Exception:
        pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def evaluate_job_node(
    job: EvalJob, *, wait_for_other: bool = False, on_wait: WaitNote | None = None
) -> EvaluationResult:
    """``evaluate_node`` of ``job``'s node with the job's settings, in this process (the worker's
    and the in-process executor's one call); ``on_wait``: told of a wait for another process."""
    return evaluate_node(
        Archive(job.archive),
        job.node,
        backend=job.backend,
        seeds=job.seeds,
        preset=job.preset,
        timeout_s=job.timeout_s,
        tags=job.tags,
        wait_for_other=wait_for_other,
        on_wait=on_wait,
    )


def _worker(job: EvalJob, wait_fd: int | None = None) -> None:
    _die_with_parent()
    # no torch here: the seeds train in sandboxed children, and child_env() already gives this
    # process one OMP/MKL thread for anything that loads it

    note = WaitNote(wait_fd)  # the wait for another process, told to the limiting process
    try:
        # a `poise-git evaluate` of this node in flight: its result, if ours
        result = evaluate_job_node(job, wait_for_other=True, on_wait=note)
        out = {"status": result.status, "reason": result.reason, "overall": result.value}
    except WarmStartFailed as exc:  # not the candidate's doing: it must not be recorded as failed
        out = {"status": SETUP_FAILED, "reason": str(exc), "overall": None}
    finally:
        note.close()
    print(RESULT_MARK + json.dumps({**out, **note.fields()}), flush=True)


if __name__ == "__main__":
    _worker(EvalJob(**json.loads(sys.argv[1])), int(sys.argv[2]) if len(sys.argv) > 2 else None)
