"""Shared by the proxy benchmarks: one seed of one mechanism through the proxy worker (a sandboxed
subprocess, as ``poise-git evaluate`` runs it), a per-seed result cache, intervals and ranks."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.operators.evaluate import SeedCache, machine  # noqa: E402
from engine.sandbox.process import child_env, run_limited  # noqa: E402
from engine.stats import (  # noqa: E402, F401 (re-exported for the benchmarks)
    mean_interval,
    paired_interval,
    spearman,
)

PAPER_OVERALL = {
    "grpo": 47.8,
    "vm_av_grpo": 52.5,
    "dace_grpo": 51.7,
    "av_grpo": 50.9,
    "msa_grpo": 50.7,
    "fa_grpo": 49.9,
    "cag_grpo": 49.5,
    "dfr_grpo": 49.0,
    "bn_grpo": 44.2,
    "sa_grpo": 34.5,
    "dcbe_grpo": 27.8,
}
"""Overall (percentage points) of the 11 published mechanisms in the paper's result tables"""


IMPROVERS = ("av_grpo", "vm_av_grpo", "msa_grpo", "dace_grpo", "fa_grpo")
"""the paper's improvers: the target wants at least 3 of them above GRPO beyond their intervals"""
REGRESSIONS = ("sa_grpo", "dcbe_grpo")
"""the paper's two large regressions: the target wants both below GRPO beyond their intervals"""


def mechanism_source(name: str) -> str:
    """The complete algorithm.py of a published mechanism: its edit applied to the root, as
    ``poise-git spawn --edit`` applies it (the root itself for grpo)."""
    from engine.archive.edit import prior_source  # lazy: renders the edit with libcst

    return prior_source(name)


def verdict(iv: list[float] | None) -> str:
    """Where a paired difference's 95% interval lies: above / below zero, within, or no interval."""
    if not iv:
        return "no interval"
    if iv[0] > 0:
        return "above"
    if iv[1] < 0:
        return "below"
    return "within"


def calibration_targets(rows: list[dict]) -> dict:
    """The calibration targets over rows with ``mechanism``, ``overall`` (absent: no result) and
    ``verdict``: Spearman with the paper (>= 0.6), the regressions below GRPO, >= 3 improvers above."""
    have = [r for r in rows if "overall" in r and r["mechanism"] in PAPER_OVERALL]
    rho = (
        spearman([r["overall"] for r in have], [PAPER_OVERALL[r["mechanism"]] for r in have])
        if len(have) >= 3
        else float("nan")
    )
    by_name = {r["mechanism"]: r for r in rows}
    improvers_above = [n for n in IMPROVERS if by_name.get(n, {}).get("verdict") == "above"]
    regressions_below = [n for n in REGRESSIONS if by_name.get(n, {}).get("verdict") == "below"]
    return {
        "spearman": rho,
        "spearman_met": rho >= 0.6,
        "regressions_below": regressions_below,
        "regressions_met": len(regressions_below) == len(REGRESSIONS),
        "improvers_above": improvers_above,
        "improvers_met": len(improvers_above) >= 3,
        "mechanisms_with_results": len(have),
    }


def warm_start(preset: str) -> tuple[str, str, str]:
    """(checkpoint path, weights' content hash, device): built or found once, before any seed."""
    res = run_limited(
        [sys.executable, "-m", "trainer_template.proxy.worker", "warmstart", "--preset", preset],
        timeout_s=7200,
        env=child_env(),
    )
    if not res.ok:
        sys.exit(f"warm start failed: {res.reason()}\n{res.stderr[-2000:]}")
    sha, device, path = res.stdout.strip().splitlines()[-3:]
    return path, sha, device


def worker_command(
    algo: Path, out: Path, label: str, seed: int, preset: str, overrides: dict | None = None
) -> list[str]:
    """The proxy worker's ``run`` command line: train and score ``algo`` at one seed into ``out``."""
    cmd = [sys.executable, "-m", "trainer_template.proxy.worker", "run", "--preset", preset]
    cmd += ["--algorithm", str(algo), "--name", label, "--seed", str(seed), "--out", str(out)]
    if overrides:
        cmd += ["--overrides", json.dumps(overrides)]
    return cmd


def run_seed(
    label: str,
    source: str,
    seed: int,
    preset: str,
    protocol_hash: str,
    *,
    overrides: dict | None = None,
    use_cache: bool = True,
    log=None,
) -> dict:
    """The worker's result for one seed (``status``, ``metrics``, ``trajectory``, ``timings``...),
    from the cache (``$POISE_EVAL_CACHE``) when this code already ran under this protocol."""
    cache = SeedCache.from_env(source, protocol_hash) if use_cache and not overrides else None
    data = cache.load(seed) if cache else None
    if data is None:
        with tempfile.TemporaryDirectory(prefix="poise-bench-") as tmp:
            algo = Path(tmp) / "algorithm.py"
            algo.write_text(source)
            out = Path(tmp) / "out.json"
            cmd = worker_command(algo, out, label, seed, preset, overrides)
            res = run_limited(cmd, timeout_s=3600, memory_mb=4096, env=child_env())
            data = (
                json.loads(out.read_text())
                if out.is_file()
                else {"status": "failed", "metrics": {}}
            )
            if not res.ok:
                data["status"], data["reason"] = "failed", res.reason()
            data["wall_s"] = res.wall_s
            data["machine"] = machine_info()  # kept in the cache with the run it measured
            if cache and res.ok:
                cache.store(seed, data)
    data.update(label=label, seed=seed)
    log = log or (
        lambda line: print(line, flush=True)
    )  # progress shows as it happens, also in a pipe
    ov = data.get("metrics", {}).get("overall", float("nan"))
    log(
        f"  {label:>12} seed {seed}: {data['status']:6} overall {ov:.3f}  "
        f"{data.get('wall_s', 0.0):6.1f} s{' (cached)' if data.get('cached') else ''}"
        f"  {data.get('reason', '')[:120]}"
    )
    return data


def paired(values: dict[int, float], ref: dict[int, float]) -> tuple[float, list[float] | None]:
    """Mean and 95% t-interval of the per-seed differences values[s] - ref[s] over shared seeds."""
    d = paired_interval(values, ref)
    return (float("nan"), None) if d is None else d[:2]


def fmt_iv(iv: list[float] | None, signed: bool = False) -> str:
    """A 95% interval as table text; "-" where there is none (a single seed)."""
    if not iv:
        return "-"
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"[{f.format(iv[0])}, {f.format(iv[1])}]"


def machine_info() -> dict:
    """What ran the figures: the engine's ``machine()`` (CPU model, cores, architecture), torch and
    the CPU kernels torch picked. Some mechanisms' seed runs differ from machine to machine
    (docs/calibration.md), so a figure names its machine."""
    import torch  # lazy: torch is heavy (the parent of a benchmark needs it here only)

    return {
        **machine(),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def measured_on(runs) -> tuple[dict | None, list[dict | None]]:
    """The machines ``runs`` (results with a ``machine``) were measured on: the one machine where
    they share it (else None), and every distinct one (None for a run that recorded none)."""
    seen = {json.dumps(r.get("machine"), sort_keys=True) for r in runs}
    machines = [json.loads(m) for m in sorted(seen)]
    return (machines[0] if len(machines) == 1 else None), machines


def write_results(path: str | Path, args, unit: str, **fields) -> Path:
    """A benchmark's JSON: its arguments, the proxy protocol (``args.preset``) with its hash, the
    unit of its figures, the machine (``fields`` may name another, and the hash the protocol has on
    another's device: figures measured elsewhere), then ``fields``."""
    from trainer_template.proxy.protocol import get_protocol

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "args": vars(args),
        "protocol": f"proxy/{args.preset}",
        "protocol_hash": fields.pop("protocol_hash", None) or get_protocol(args.preset).hash(),
        "unit": unit,
        "machine": fields.pop("machine", None) or machine_info(),
        **fields,
    }
    out.write_text(json.dumps(payload, indent=1, default=str))
    return out


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")
