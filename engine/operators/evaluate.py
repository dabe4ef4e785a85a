"""Evaluate a node under the standardized protocol: the embedded CPU proxy (per seed, a sandboxed
training child and a sandboxed scorer that loads no candidate code: ``evaluate_seed``; seeds in
parallel), aggregate mean + 95% interval, record results.json and one MLflow run per seed. Only a
node that passed verification (or holds template code) is evaluated.

The node's ``algorithm.py`` is read from its commit, never from a working directory. Torch and MLflow
are imported only in the children / inside functions, so importing this module is cheap.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import stat
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import trainer_template
from engine.archive.results import SEEDS_INTERVAL, EvaluationResult, Protocol, now
from engine.archive.tracking import (
    TrackingUnavailable,
    node_run,
    open_store_meanwhile,
    unreachable,
)
from engine.errors import EvaluationError
from engine.operators.evaluate_seed import run_seed
from engine.operators.evaluate_verl import evaluate_node_verl
from engine.operators.evaluation_lock import evaluation_turn
from engine.operators.reevaluation import replaced_line
from engine.operators.verify import refuse_unverified
from engine.sandbox import live
from engine.sandbox.limits import Limits
from engine.sandbox.process import run_limited, trusted_env
from engine.secrets import scrub
from engine.stats import mean_interval, tail_means
from trainer_template.proxy.protocol import PRESETS, get_protocol, metric_unit

log = logging.getLogger(__name__)
TRAJECTORY_POINTS = 100


def downsample(traj: Mapping[str, list], points: int = TRAJECTORY_POINTS) -> dict[str, list]:
    """Every signal at <= ``points`` evenly spaced steps (the last step always kept)."""
    steps = list(traj.get("step", []))
    n = len(steps)
    if n <= points:
        idx = list(range(n))
    else:
        idx = sorted({round(i * (n - 1) / (points - 1)) for i in range(points)})
    return {k: [v[i] for i in idx if i < len(v)] for k, v in traj.items()}


def _mean_trajectory(trajs: list[dict]) -> dict[str, list]:
    trajs = [t for t in trajs if t.get("step")]
    if not trajs:
        return {}
    n = min(len(t["step"]) for t in trajs)
    out: dict[str, list] = {"step": trajs[0]["step"][:n]}
    for key in trajs[0]:
        if key == "step":
            continue
        col = []
        for i in range(n):
            vals = [
                t[key][i] for t in trajs if key in t and i < len(t[key]) and t[key][i] is not None
            ]
            col.append(sum(vals) / len(vals) if vals else None)
        out[key] = col
    return out


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for dist in ("poise-git", "torch", "mlflow"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "unknown" if dist != "poise-git" else "0.1.0"
    return out


def machine() -> dict:
    """The machine a result is measured on (CPU model, cores, architecture): some mechanisms' seed
    runs differ from one CPU to another at the same seed (docs/calibration.md), so a result names it."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "arch": platform.machine()}


def _python() -> str:
    return sys.executable


def evaluate_node(
    archive,
    name: str,
    backend: str = "proxy",
    seeds: int | list[int] | None = None,
    preset: str | None = None,
    timeout_s: float | None = None,
    tags: Mapping[str, str] | None = None,
    *,
    on_event: Callable[[str], None] | None = None,
    cache_dir: str | None = None,
    wait_for_other: bool = False,
    on_wait: Callable[[str, str], None] | None = None,
) -> EvaluationResult:
    """Evaluate ``name`` and record its result under ``proxy/<preset>`` (status evaluated | failed).

    ``seeds``: a count N (seeds 0..N-1) or an explicit list; default ``[evaluation].seeds``.
    ``preset``: the proxy protocol preset (default ``[proxy].preset``). ``on_event``: progress lines.
    One process at a time evaluates a node (:func:`node_evaluation`): when another holds it, this
    call fails at once, or with ``wait_for_other`` (the loop's workers) waits, and then returns the
    result the other recorded when it is this evaluation's (same protocol version and seeds).
    ``on_wait(what, detail)`` is told of a wait: ``("waiting", holder)`` before it, then
    ``("used", "")`` when the other's result is returned, or ``("evaluating", why)`` when this call
    evaluates the node itself, ``why`` saying why the other's result is not this evaluation's (""
    when it did not wait: then only ``"evaluating"`` is told, once the node is this call's).
    """
    if backend not in ("proxy", "verl"):
        raise EvaluationError(
            f"evaluate: unknown backend {backend!r}; use 'proxy' (CPU) or 'verl' (GPU), "
            "or --suite for benchmark scoring"
        )
    _require_verified(archive, name, unsandboxed=backend == "verl")
    if backend == "verl":
        return evaluate_node_verl(
            archive,
            name,
            timeout_s=float(timeout_s or archive.config().evaluation.timeout_s),
            tags=tags,
            on_event=on_event,
            wait_for_other=wait_for_other,
            on_wait=on_wait,
        )
    job = _Job.prepare(archive, name, seeds, preset, timeout_s, cache_dir)
    ours: Protocol = job.base["protocol"]
    with evaluation_turn(
        archive, name, ours, job.seeds, wait=wait_for_other, on_wait=on_wait
    ) as done:
        if done is not None:
            return done
        replaced = replaced_line(
            archive.node(name).results.get(ours.id), ours.hash, job.seeds, _cached_seeds(job)
        )
        if replaced:
            _reporter(name, on_event)(replaced)
        return _evaluate(archive, name, job, tags, on_event)


def _cached_seeds(job: _Job) -> list[int]:
    """The seeds of ``job`` the per-seed cache (when on) holds a usable record of."""
    cache = SeedCache.from_env(job.source, job.base["protocol"].hash)
    return [s for s in job.seeds if cache.usable(s) is not None] if cache else []


def _evaluate(archive, name: str, job: _Job, tags, on_event) -> EvaluationResult:
    if job.compile_error is not None:
        archive.record_result(name, job.compile_error)
        return job.compile_error
    prior_status = archive.node(name).status
    archive.set_status(name, "evaluating")
    try:
        result = _run(job, tags, _reporter(name, on_event))
        archive.record_result(name, result)
        return result
    except WarmStartFailed as exc:
        archive.set_status(name, prior_status, reason=f"proxy warm start failed: {exc.why}")
        raise
    except BaseException as exc:  # interrupted or crashed: the node must not stay "evaluating"
        if archive.node(name).status == "evaluating":
            archive.set_status(
                name, prior_status, reason=f"evaluation interrupted: {type(exc).__name__}"
            )
        raise


def measure_node(
    archive,
    name: str,
    seeds: list[int],
    preset: str | None = None,
    timeout_s: float | None = None,
    tags: Mapping[str, str] | None = None,
    *,
    on_event: Callable[[str], None] | None = None,
    cache_dir: str | None = None,
) -> EvaluationResult:
    """The proxy protocol on ``name`` at ``seeds``, exactly as :func:`evaluate_node` runs it (the same
    sandbox, limits, warm start and MLflow runs), returned without recording it and without touching
    the node's status: the node's recorded result, which the selection reads, stays as it was. A
    held-out confirmation (``engine.operators.confirm``) measures this way."""
    _require_verified(archive, name)
    job = _Job.prepare(archive, name, seeds, preset, timeout_s, cache_dir)
    if job.compile_error is not None:
        return job.compile_error
    return _run(job, tags, _reporter(name, on_event))


_WARM: dict[tuple[str, str], tuple[tuple[int, ...], list[str]]] = {}
_WARM_LOCK = threading.Lock()


def _stat_key(path: Path) -> tuple[int, ...] | None:
    """The identity of the regular file at ``path`` (None when there is none)."""
    try:
        st = path.stat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _warm_start(preset: str, env: Mapping[str, str], timeout_s: float) -> list[str]:
    """The lines the trusted ``worker warmstart`` printed for ``preset``: [capability,] content hash,
    device, checkpoint path (last). That child imports torch (about 3 s of CPU), so a process asks
    once per preset, cache directory and visible GPUs, and again when the checkpoint file is not the
    one it was told of (another inode, size or time stamp: rebuilt, replaced or removed)."""
    # what the child's answer depends on: the preset, where the cache is, which GPUs it may see
    seen = {k: v for k, v in env.items() if k.startswith(("POISE_", "CUDA_")) or k == "PYTHONPATH"}
    memo_key = (preset, json.dumps(sorted(seen.items())))
    with _WARM_LOCK:
        known = _WARM.get(memo_key)
    if known is not None and _stat_key(Path(known[1][-1])) == known[0]:
        return list(known[1])
    ws = run_limited(  # trusted code (no candidate's): it may write the cache
        [_python(), "-m", "trainer_template.proxy.worker", "warmstart", "--preset", preset],
        timeout_s=timeout_s,
        env=env,
    )
    lines = ws.stdout.strip().splitlines()
    ident = _stat_key(Path(lines[-1])) if ws.ok and lines else None
    if ident is None:
        raise WarmStartFailed(ws.reason() if not ws.ok else "it printed no checkpoint path")
    with _WARM_LOCK:
        _WARM[memo_key] = (ident, list(lines))
    return lines


_MODELS: dict[str, str] = {}
_MODELS_LOCK = threading.Lock()
_GPU_NAME = "import torch; print(torch.cuda.get_device_name(0))"


def device_model(device: str, env: Mapping[str, str]) -> str:
    """The device a proxy evaluation trains on, by model, for its result's details: ``cpu``, or
    ``cuda:<GPU name>`` as torch names the first visible GPU, asked of a trusted child (no
    candidate's code) once per process and set of visible GPUs; ``cuda:unknown`` where it cannot
    tell. Not part of the protocol hash: results of one protocol on two GPU models stay comparable,
    and the model says where they came from."""
    if device != "cuda":
        return device
    key = env.get("CUDA_VISIBLE_DEVICES", "")
    with _MODELS_LOCK:
        known = _MODELS.get(key)
    if known is not None:
        return known
    r = run_limited([_python(), "-c", _GPU_NAME], timeout_s=120, env=env)
    lines = r.stdout.strip().splitlines() if r.ok else []
    model = f"cuda:{lines[-1].strip()[:100] if lines else 'unknown'}"
    with _MODELS_LOCK:
        _MODELS[key] = model
    return model


class WarmStartFailed(EvaluationError):
    """The proxy's warm start (trusted code) failed: no candidate was run."""

    def __init__(self, why: str):
        super().__init__(f"the proxy's warm start failed: {why}")
        self.why = why


@dataclass
class _Job:
    """One proxy evaluation, resolved from the archive: what runs, at which seeds, under which protocol."""

    archive: Any
    name: str
    cfg: Any
    protocol: Any
    preset: str
    seeds: list[int]
    timeout: float
    source: str
    base: dict
    cache_dir: str | None
    t_start: float
    compile_error: EvaluationResult | None = None

    @classmethod
    def prepare(cls, archive, name, seeds, preset, timeout_s, cache_dir) -> _Job:
        cfg = archive.config()
        node = archive.node(name)
        preset = proxy_preset(preset, cfg)
        protocol = get_protocol(preset)
        seed_list = (
            list(range(seeds))
            if isinstance(seeds, int)
            else list(seeds or range(cfg.evaluation.seeds))
        )
        if not seed_list or any((not isinstance(s, int)) or s < 0 for s in seed_list):
            raise EvaluationError(
                f"evaluate: seeds must be a positive count or a list of non-negative integers, got {seeds!r}"
            )
        source = archive.algorithm(name)
        base = {
            "protocol": proxy_protocol(preset, protocol),
            "seeds": tuple(seed_list),
            "node_commit": node.commit,
            # the harness's sources: the protocol hash covers settings and warm start, not the code
            # that turns them into numbers (the task generator, the RL loop, the scorer)
            "details": {
                "versions": _versions(),
                "machine": machine(),
                "harness_sha256": harness_digest(),
            },
        }
        job = cls(
            archive=archive,
            name=name,
            cfg=cfg,
            protocol=protocol,
            preset=preset,
            seeds=seed_list,
            timeout=float(timeout_s or cfg.evaluation.timeout_s),
            source=source,
            base=base,
            cache_dir=cache_dir,
            t_start=time.monotonic(),
        )
        try:
            compile(source, f"{name}/algorithm.py", "exec")
        except SyntaxError as exc:
            job.compile_error = EvaluationResult(
                **base,
                status="failed",
                reason=f"algorithm.py does not compile: {exc.msg} (line {exc.lineno})",
                utility=cfg.experiment.objective,
                recorded_at=now(),
            )
        return job


def _require_verified(archive, name: str, *, unsandboxed: bool = False) -> None:
    refuse_unverified(archive, name, "evaluate", unsandboxed=unsandboxed)


def _run(job: _Job, tags: Mapping[str, str] | None, say: Callable[[str], None]) -> EvaluationResult:
    archive, name, cfg, protocol, preset = job.archive, job.name, job.cfg, job.protocol, job.preset
    seed_list, timeout, source, base = job.seeds, job.timeout, job.source, job.base
    cache_dir = job.cache_dir or cfg.proxy.cache_dir or None
    env = trusted_env({"POISE_CACHE_DIR": str(Path(cache_dir).expanduser())} if cache_dir else None)
    store = open_store_meanwhile(archive.path)  # ready by the time the seeds are
    say(f"warm start ({preset}) ...")
    lines = _warm_start(preset, env, max(timeout, 600.0))
    warmstart = Path(lines[-1])
    # the device every seed runs on, decided here (trusted, outside the sandbox) and passed to the
    # children, which fail rather than train elsewhere: inside the sandbox CUDA is visible only when
    # the limits let it in
    device = "cpu"
    if len(lines) >= 3:  # content hash of the weights (checked against the pin), device, path
        device = lines[-2].strip()
        base["details"] = {**base["details"], "warmstart_sha256": lines[-3], "device": device}
    base["details"] = {**base["details"], "device_model": device_model(device, env)}
    if len(lines) >= 4:  # the CPU kernels torch picks on this machine (docs/calibration.md)
        machine_ = {**base["details"]["machine"], "torch_cpu_capability": lines[-4].strip()}
        base["details"] = {**base["details"], "machine": machine_}
    cache = SeedCache.from_env(source, base["protocol"].hash)

    workers = max(1, min(len(seed_list), cfg.proxy.parallel or (os.cpu_count() or 1)))
    limits = Limits(
        wall_s=timeout,
        cpu_s=timeout * 1.5,
        memory_mb=cfg.evaluation.memory_mb,
        gpu=device == "cuda",
    )

    def one(seed: int) -> dict:
        hit = cache.usable(seed) if cache else None
        if hit is not None:
            hit["seed"] = seed
            say(f"seed {seed}: {hit['status']} (cached)")
            return hit
        data = run_seed(
            source,
            name,
            seed,
            preset,
            protocol.rl.steps,
            warmstart.resolve(),
            limits,
            device=device,
        )
        if cache and data.get("status") in ("ok", "failed") and data.get("metrics"):
            cache.store(seed, data)
        say(
            f"seed {seed}: {data['status']}"
            + (
                f" ({data['reason']})"
                if data["status"] != "ok"
                else f" overall {data['metrics'].get('overall', float('nan')):.3f}"
            )
        )
        return data

    with ThreadPoolExecutor(max_workers=workers) as pool:
        runs = live.results([pool.submit(one, s) for s in seed_list])

    store.join()
    run_ids = _log_mlflow(archive, name, runs, base, tags, say)
    failed = [r for r in runs if r["status"] != "ok"]
    with_metrics = [r for r in runs if r.get("metrics")]
    metrics, intervals = {}, {}
    for key in sorted({k for r in with_metrics for k in r["metrics"]}):
        vals = [r["metrics"][key] for r in with_metrics if key in r["metrics"]]
        metrics[key], iv = mean_interval(vals)
        if iv:
            intervals[key] = iv
    trajectory = (
        failed[0].get("trajectory", {})
        if failed
        else _mean_trajectory([r["trajectory"] for r in runs])
    )
    per_seed = tuple(
        {
            "seed": r["seed"],
            "status": "evaluated" if r["status"] == "ok" else "failed",
            **({"reason": r["reason"]} if r["status"] != "ok" else {}),
            "metrics": r.get("metrics", {}),
            "mlflow_run_id": run_ids.get(r["seed"]),
            "wall_s": round(r["wall_s"], 3),
            "timings": r.get("timings", {}),
            "peak_rss_mb": r.get("peak_rss_mb"),
            **_trajectory_tail(r),
        }
        for r in runs
    )
    result = EvaluationResult(
        **base,
        status="failed" if failed else "evaluated",
        metrics=metrics,
        units={k: metric_unit(k) for k in metrics},
        intervals={k: (float(a), float(b)) for k, (a, b) in intervals.items()},
        interval_kind=SEEDS_INTERVAL,
        utility=cfg.experiment.objective,
        reason="; ".join(r["reason"] for r in failed)[:1000] if failed else "",
        per_seed=tuple(json.loads(json.dumps(per_seed, allow_nan=False))),
        trajectory=downsample(trajectory),
        mlflow_run_ids=tuple(run_ids[s] for s in seed_list if run_ids.get(s)),
        wall_time_s=round(time.monotonic() - job.t_start, 3),
        recorded_at=now(),
    )
    return result


def _trajectory_tail(run: dict) -> dict:
    """``{"trajectory_tail": {series: mean over its last third}}`` of one seed's run ({} without a
    trajectory): what the reflection pairs with the parent's seeds, since the recorded trajectory
    is the seeds' mean."""
    tail = tail_means(run.get("trajectory") or {})
    return {"trajectory_tail": tail} if tail else {}


def _reporter(name: str, on_event: Callable[[str], None] | None) -> Callable[[str], None]:
    """A progress line goes to ``on_event`` (the CLI's display) and to this module's logger."""

    def say(msg: str) -> None:
        log.info("%s: %s", name, msg)
        if on_event is not None:
            on_event(msg)

    return say


def proxy_preset(preset: str | None, cfg) -> str:
    """``preset``, else the experiment's ``[proxy].preset``; an unknown one is an EvaluationError."""
    preset = preset or cfg.proxy.preset
    if preset not in PRESETS:
        raise EvaluationError(f"unknown proxy preset {preset!r} (known: {', '.join(PRESETS)})")
    return preset


def proxy_protocol(preset: str, protocol) -> Protocol:
    """The typed identity of a proxy preset (its hash covers every setting and the warm start)."""
    return Protocol(
        id=f"proxy/{preset}",
        hash=protocol.hash(),
        backend="proxy",
        preset=preset,
        settings=protocol.to_dict(),
    )


# What trains and scores a candidate besides its own code: a change here changes every result, so it
# is part of a cached result's identity (the protocol hash covers settings and warm start only).
HARNESS = (
    Path(trainer_template.__file__).resolve().parent,
    Path(__file__).resolve().with_name("evaluate_seed.py"),
)
# folders under HARNESS that never train or score a proxy result: the verl harness is the at-scale
# path's (an edit of it does not change a proxy number, so it does not retire cached proxy results)
NOT_HARNESS = ("verl_backend",)


@functools.cache
def harness_digest() -> str:
    """:func:`source_digest` of :data:`HARNESS` (less :data:`NOT_HARNESS`), once per process."""
    return source_digest(HARNESS, skip=NOT_HARNESS)


def source_digest(paths: tuple[Path, ...], skip: tuple[str, ...] = ()) -> str:
    """sha256 over the Python sources under ``paths`` (files or folders; a folder named in
    ``skip`` is left out), by relative name and content, in sorted order."""
    h = hashlib.sha256()
    for root in paths:
        files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
        for f in files:
            if skip and set(f.relative_to(root).parts[:-1]) & set(skip):
                continue
            rel = f.relative_to(root.parent).as_posix()
            h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


class SeedCache:
    """Per-seed proxy results kept on disk by (code, protocol identity, harness, seed), for benchmarks
    that evaluate the same code many times (``POISE_EVAL_CACHE=DIR``; off by default). Only results
    of runs that finished within their limits are kept; the code's identity ignores docstrings and
    formatting (engine.operators.propose.code_key); the harness is :func:`harness_digest`, so an
    edit of the trainer or the scorer never serves results the old one produced."""

    def __init__(self, directory: Path, key: str):
        self.dir, self.key = directory, key

    @classmethod
    def from_env(
        cls, source: str, protocol_hash: str, harness: str | None = None
    ) -> SeedCache | None:
        d = os.environ.get("POISE_EVAL_CACHE")
        if not d:
            return None
        # lazy: engine.operators.propose imports the loop's operators (a circle at the top)
        from engine.operators.propose import code_key

        code = code_key(source)
        if code is None:
            return None
        harness = harness if harness is not None else harness_digest()
        key = hashlib.sha256(f"{code}|{protocol_hash}|{harness}".encode()).hexdigest()[:32]
        return cls(Path(d).expanduser(), key)

    def _path(self, seed: int) -> Path:
        return self.dir / self.key[:2] / f"{self.key}-s{seed}.json"

    def load(self, seed: int) -> dict | None:
        try:
            data = json.loads(self._path(seed).read_text())
        except (OSError, json.JSONDecodeError):
            return None
        data["cached"] = True
        return data

    def usable(self, seed: int) -> dict | None:
        """:meth:`load`, where the record is one an evaluation can log in full: a result the
        benchmarks cached from the worker's own `run` has no trajectory (and names no seed), so
        that seed runs again."""
        hit = self.load(seed)
        return hit if hit is not None and "trajectory" in hit else None

    def store(self, seed: int, data: dict) -> None:
        path = self._path(seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, allow_nan=False, default=str))
        os.replace(tmp, path)


def mlflow_key(key: str) -> str:
    """MLflow's name for a metric key: '@' is not allowed there (``hard/pass@8`` -> ``hard/pass_at_8``)."""
    return key.replace("@", "_at_")


def _log_mlflow(
    archive,
    name: str,
    runs: list[dict],
    base: dict,
    tags: Mapping[str, str] | None,
    say: Callable[[str], None],
) -> dict[int, str]:
    """One MLflow run per seed: protocol params, per-step train/* metrics (batched), eval/* metrics."""
    try:
        from mlflow.entities import Metric, Param  # lazy: mlflow is heavy (only this path needs it)
        from mlflow.tracking import MlflowClient  # lazy: mlflow is heavy (only this path needs it)
    except Exception as exc:  # pragma: no cover - mlflow is a dependency
        say(f"MLflow unavailable: {exc}")
        return {}
    ids: dict[int, str] = {}
    proto: Protocol = base["protocol"]
    params = [
        Param("preset", proto.preset),
        Param("protocol", proto.id),
        Param("protocol_hash", proto.hash),
    ]
    params += [
        Param(f"{sec}.{k}", str(v))
        for sec in ("warmstart", "rl", "eval")
        for k, v in proto.settings.get(sec, {}).items()
    ]
    for r in runs:
        run_tags = {
            "poise.backend": "proxy",
            "poise.seed": str(r["seed"]),
            "poise.preset": proto.preset,
            "poise.protocol": proto.id,
            "poise.status": "evaluated" if r["status"] == "ok" else "failed",
            **(tags or {}),
        }
        try:
            with node_run(archive, name, run_name=f"{name}/seed{r['seed']}", tags=run_tags) as run:
                client = MlflowClient()
                rid = run.info.run_id
                now = int(time.time() * 1000)
                traj = r.get("trajectory", {})
                metrics = [
                    Metric(k, float(v), now, int(step))
                    for k, vals in traj.items()
                    if k != "step"
                    for step, v in zip(traj.get("step", []), vals)
                    if v is not None
                ]
                metrics += [
                    Metric(mlflow_key(f"eval/{k}"), float(v), now, 0)
                    for k, v in r.get("metrics", {}).items()
                ]
                for i in range(0, len(metrics), 1000):
                    client.log_batch(
                        rid, metrics=metrics[i : i + 1000], params=params if i == 0 else []
                    )
                if not metrics:
                    client.log_batch(rid, params=params)
                if r["status"] != "ok":
                    client.set_tag(rid, "poise.reason", scrub(str(r.get("reason", "")))[:500])
                ids[r["seed"]] = rid
        except TrackingUnavailable as exc:  # the same for every seed: said once
            say(f"MLflow logging skipped: {exc}")
            break
        except Exception as exc:
            problem = unreachable(archive.path, fresh=True)  # the server died after the probe?
            if problem:  # as when it was dead from the start: said once, the rest not tried
                say(f"MLflow logging skipped: {problem}")
                break
            say(f"MLflow logging failed for seed {r['seed']}: {type(exc).__name__}: {exc}")
    return ids
