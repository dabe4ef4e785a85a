"""What the boundary around candidate code costs: verification and one proxy evaluation seed.

Three ways to run the same work, interleaved in one run (median of --repeats):

- ``boundary``: what poise-git does — bubblewrap namespaces, kernel limits, the parent-owned channel;
  verification = a recording child + a trusted replay child; evaluation = a training child + a
  trusted scorer child (``engine.operators.evaluate_seed``);
- ``weak``: the same protocol without namespaces (``POISE_SANDBOX=none``): the cost of bubblewrap alone;
- ``reference``: the design before the boundary — the suite and the fingerprint in one plain
  subprocess running the candidate in-process, and ``worker run`` training and scoring in one plain
  subprocess.

Target: the boundary adds < 5% to an evaluation (seed + verification, against the reference).

    python benchmarks/bench_sandbox.py [--preset smoke|default] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.operators.evaluate_seed import run_seed  # noqa: E402
from engine.operators.verify import VerifyLimits, generate_suite, run_suite  # noqa: E402
from engine.sandbox import boundary  # noqa: E402
from engine.sandbox.limits import Limits  # noqa: E402
from engine.sandbox.process import run_limited, trusted_env  # noqa: E402
from trainer_template import ALGORITHM_FILE  # noqa: E402

REFERENCE_SUITE = r"""
import json, sys
import pytest
rc = pytest.main(["-q", "-p", "no:cacheprovider", "tests"])
from engine.operators.fingerprint import compute
from trainer_template.loader import load_algorithm
fp = compute(load_algorithm(open("algorithm.py").read(), "reference"))
json.dump({"rc": int(rc), "fp": len(fp)}, open(sys.argv[1], "w"))
"""


def verify_boundary(src: str, mode: str) -> float:
    t = time.perf_counter()
    files = generate_suite(("correct_above_wrong",))
    ok, reason, _ = run_suite(src, files, VerifyLimits(), boundary.resolve(mode))
    assert ok, reason
    return time.perf_counter() - t


def verify_reference(src: str) -> float:
    """The suite in direct mode (the candidate in the test process) plus the fingerprint."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "tests").mkdir()
        (root / "algorithm.py").write_text(src)
        (root / "pytest.ini").write_text("[pytest]\n")
        for path, text in generate_suite(("correct_above_wrong",)).items():
            (root / path).write_text(text)
        t = time.perf_counter()
        res = run_limited(
            [sys.executable, "-c", REFERENCE_SUITE, str(root / "out.json")],
            timeout_s=600,
            cwd=root,
            env=trusted_env({"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}),
        )
        wall = time.perf_counter() - t
        out = json.loads((root / "out.json").read_text())
        assert res.ok and out["rc"] == 0, res.stderr[-500:]
    return wall


def seed_boundary(src: str, preset: str, steps: int, ws: Path, mode: str) -> float:
    t = time.perf_counter()
    data = run_seed(
        src, "bench", 0, preset, steps, ws, Limits(wall_s=3600), boundary=boundary.resolve(mode)
    )
    assert data["status"] == "ok", data["reason"]
    return time.perf_counter() - t


def seed_reference(src: str, preset: str, ws: Path) -> float:
    with tempfile.TemporaryDirectory() as d:
        algo, out = Path(d) / "algorithm.py", Path(d) / "out.json"
        algo.write_text(src)
        t = time.perf_counter()
        cmd = [sys.executable, "-m", "trainer_template.proxy.worker", "run", "--preset", preset]
        cmd += ["--algorithm", str(algo), "--warmstart", str(ws), "--seed", "0", "--out", str(out)]
        res = run_limited(cmd, timeout_s=3600, env=trusted_env())
        wall = time.perf_counter() - t
        assert res.ok and json.loads(out.read_text())["status"] == "ok", res.stderr[-500:]
    return wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from trainer_template.proxy.protocol import get_protocol

    b = boundary.resolve("auto")
    if not b.isolated:
        sys.exit(f"bubblewrap does not work here ({b.note}); nothing to compare")
    src = ALGORITHM_FILE.read_text()
    ws_run = run_limited(
        [
            sys.executable,
            "-m",
            "trainer_template.proxy.worker",
            "warmstart",
            "--preset",
            args.preset,
        ],
        timeout_s=3600,
        env=trusted_env(),
    )
    ws = Path(ws_run.stdout.strip().splitlines()[-1])
    steps = get_protocol(args.preset).rl.steps
    times: dict[str, list[float]] = {}
    for i in range(args.repeats):
        for label, fn in (
            ("verify/reference", lambda: verify_reference(src)),
            ("verify/weak", lambda: verify_boundary(src, "none")),
            ("verify/boundary", lambda: verify_boundary(src, "auto")),
            ("seed/reference", lambda: seed_reference(src, args.preset, ws)),
            ("seed/weak", lambda: seed_boundary(src, args.preset, steps, ws, "none")),
            ("seed/boundary", lambda: seed_boundary(src, args.preset, steps, ws, "auto")),
        ):
            times.setdefault(label, []).append(fn())
            print(f"  repeat {i + 1}: {label:18} {times[label][-1]:7.2f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\npreset {args.preset}, median of {args.repeats} (wall seconds):")
    for what in ("verify", "seed"):
        ref = med[f"{what}/reference"]
        for kind in ("reference", "weak", "boundary"):
            v = med[f"{what}/{kind}"]
            print(f"  {what:6} {kind:9} {v:7.2f} s   x{v / ref:.3f} of the reference")
    added = (med["verify/boundary"] - med["verify/reference"]) + (
        med["seed/boundary"] - med["seed/reference"]
    )
    bwrap_only = (med["verify/boundary"] - med["verify/weak"]) + (
        med["seed/boundary"] - med["seed/weak"]
    )
    print(
        f"\nadded by the boundary design (verification + one seed): {added:+.2f} s = "
        f"{100 * added / med['seed/reference']:+.1f}% of a reference evaluation seed "
        f"(target < 5%); of it, bubblewrap's namespaces: {bwrap_only:+.2f} s"
    )


if __name__ == "__main__":
    main()
