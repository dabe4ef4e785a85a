"""What one evaluation costs beyond the training it measures.

Interleaved, ``--repeats`` times (medians printed):

- ``evaluate, new store``: ``poise-git evaluate grpo --seeds 1`` on a freshly initialised archive, as
  a user's first evaluation runs: the CLI's start, the warm start's lookup, one seed in the sandbox
  (a training child and a trusted scorer child), MLflow's import and a new SQLite store, the result
  committed to the node's branch;
- ``evaluate, existing store``: the same on an archive whose MLflow store another evaluation made;
- ``reference``: the seed alone, ``python -m trainer_template.proxy.worker run`` (one plain process
  that trains and scores, no sandbox, no tracking, no git);
- ``in one process``: evaluations after the first in one Python process (what the loop's final
  confirmation, ``confirm`` and the benchmarks' in-process searches do), once with the warm start
  already known to the process and once made to ask the trusted warm-start child again, which
  imports torch: the difference is what the process's memory of the warm start saves per evaluation.

Every evaluation gets an empty per-seed cache, so each one trains. The ratios against the reference
are the overhead a candidate pays per evaluation; at the ``tiny`` preset (the tests' and the
quickstart's size, where a seed trains in seconds) it is the largest share.

    python benchmarks/bench_evaluate.py [--preset tiny] [--repeats 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.archive.edit import prior_source  # noqa: E402


def _timed(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    t = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd[:6])} ... failed:\n{res.stdout[-2000:]}{res.stderr[-2000:]}"
        )
    return time.perf_counter() - t


IN_PROCESS = """
import json, sys, time
from engine.archive.store import Archive
import engine.operators.evaluate as ev
arch, preset, repeats = Archive.init(sys.argv[1]), sys.argv[2], int(sys.argv[3])
ev.evaluate_node(arch, "grpo", seeds=[0], preset=preset)  # imports, store, warm start: not counted
out = {"known": [], "asked": []}
for i in range(repeats):
    for key in (("known", "asked") if i % 2 == 0 else ("asked", "known")):
        if key == "asked":
            ev._WARM.clear()
        t = time.perf_counter()
        ev.evaluate_node(arch, "grpo", seeds=[0], preset=preset)
        out[key].append(time.perf_counter() - t)
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()

    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env.pop("MLFLOW_TRACKING_URI", None)  # each archive's own SQLite store
    poise = [sys.executable, "-m", "engine"]
    times: dict[str, list[float]] = {"new": [], "existing": [], "reference": []}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        algo = work / "grpo.py"
        algo.write_text(prior_source("grpo"))
        # the warm start is built (or found in the user's cache) once, outside the timings
        subprocess.run(
            [sys.executable, "-m", "trainer_template.proxy.worker", "warmstart"]
            + ["--preset", args.preset],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
        )
        kept = work / "kept"  # the archive whose store exists
        subprocess.run(
            [*poise, "init", str(kept)], cwd=work, env=env, check=True, capture_output=True
        )
        evaluate = ["evaluate", "grpo", "--preset", args.preset, "--seeds", "1"]
        for i in range(args.repeats + 1):  # the first round warms the file cache: not counted
            fresh = work / f"fresh{i}"
            subprocess.run(
                [*poise, "init", str(fresh)], cwd=work, env=env, check=True, capture_output=True
            )
            cache = {**env, "POISE_EVAL_CACHE": str(work / f"cache-new{i}")}
            new = _timed([*poise, *evaluate, "-C", str(fresh)], cache, work)
            cache = {**env, "POISE_EVAL_CACHE": str(work / f"cache-existing{i}")}
            existing = _timed([*poise, *evaluate, "-C", str(kept)], cache, work)
            ref = _timed(
                [sys.executable, "-m", "trainer_template.proxy.worker", "run", "--preset"]
                + [args.preset, "--algorithm", str(algo), "--seed", "0"]
                + ["--out", str(work / f"ref{i}.json")],
                env,
                ROOT,
            )
            if i:
                times["new"].append(new)
                times["existing"].append(existing)
                times["reference"].append(ref)
        res = subprocess.run(
            [sys.executable, "-c", IN_PROCESS, str(work / "inproc"), args.preset]
            + [str(args.repeats)],
            cwd=ROOT,
            env={k: v for k, v in env.items() if k != "POISE_EVAL_CACHE"},
            capture_output=True,
            text=True,
            timeout=1800,
            check=True,
        )
        times.update(json.loads(res.stdout.strip().splitlines()[-1]))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"one evaluation at the {args.preset} preset, 1 seed, median of {args.repeats}:")
    print("| what | wall s (median) | min | max | vs reference |")
    print("|---|---|---|---|---|")
    for key, label in (
        ("new", "evaluate, new store"),
        ("existing", "evaluate, existing store"),
        ("reference", "reference: the seed alone"),
        ("known", "in one process, warm start known"),
        ("asked", "in one process, warm start asked again"),
    ):
        v = times[key]
        print(
            f"| {label} | {med[key]:.2f} | {min(v):.2f} | {max(v):.2f} |"
            f" {med[key] / med['reference']:.2f}x |"
        )
    overhead = med["new"] - med["reference"]
    print(f"overhead of a first evaluation over its seed: {overhead:.2f} s")
    saved = med["asked"] - med["known"]
    print(f"saved per evaluation by a process that knows its warm start: {saved:.2f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "preset": args.preset,
                    "repeats": args.repeats,
                    "unit": "wall seconds per evaluation of 1 seed",
                    "seconds": times,
                    "median": med,
                    "ratio_vs_reference": {k: med[k] / med["reference"] for k in med},
                    "cpus": os.cpu_count(),
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
