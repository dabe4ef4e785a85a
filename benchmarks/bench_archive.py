"""Archive benchmark: spawn latency and whole-lineage read time at 1k and 10k nodes.

Builds a synthetic archive (bulk-loaded with `git fast-import`, each node a branch with the real
trailers and its own algorithm.py variant, half of them with results.json), then measures
`Archive.spawn` (median, p99) and `Archive.nodes()` at 1k and 10k nodes, against a reference measured
in the same run: GitPython's object-by-object traversal of the same lineage.

Targets (2-core machine): spawn <= 25 ms median at 10k nodes; whole-lineage read <= 0.5 s at 10k.

    python benchmarks/bench_archive.py [--nodes 10000] [--spawns 60] [--no-reference]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.archive.store import REF_PREFIX, Archive  # noqa: E402


def bulk_load(
    arch: Archive, start: int, stop: int, rng: random.Random, commits: dict[str, str]
) -> None:
    """Append nodes n<start>..n<stop-1> with fast-import (parents drawn among existing nodes)."""
    base = arch.algorithm("grpo")
    names = list(commits)
    lines: list[bytes] = []

    def data(b: bytes) -> None:
        lines.append(b"data %d\n" % len(b))
        lines.append(b + b"\n")

    ts = int(time.time())
    for i in range(start, stop):
        name = f"n{i}"
        parent = rng.choice(names)
        algo = (base + f"\nSCALE_{i} = {rng.random():.6f}\n").encode()
        msg = (
            f"poise: spawn {name} from {parent}\n\nPoise-Node: {name}\nPoise-Parent: {parent}\n"
            f"Poise-Status: evaluated\nPoise-Created: {ts + i}.000000\nPoise-Event: spawn\n"
        )
        has_results = i % 2 == 0
        if has_results:
            msg += "Poise-Results: yes\n"
        lines.append(f"commit {REF_PREFIX}{name}\nmark :{i + 1}\n".encode())
        lines.append(f"committer poise-git <poise-git@localhost> {ts + i} +0000\n".encode())
        data(msg.encode())
        lines.append(f"from {commits[parent]}\n".encode())
        lines.append(b"M 100644 inline algorithm.py\n")
        data(algo)
        lines.append(b"D results.json\n")
        if has_results:
            res = json.dumps(
                {"metrics": {"overall": rng.random(), "mean_length": rng.uniform(10, 30)}}
            ).encode()
            lines.append(b"M 100644 inline results.json\n")
            data(res)
        lines.append(b"\n")
        names.append(name)
        commits[name] = f":{i + 1}"
    marks = Path(tempfile.mktemp(suffix=".marks"))
    subprocess.run(
        ["git", "-C", str(arch.path), "fast-import", "--quiet", f"--export-marks={marks}"],
        input=b"".join(lines),
        check=True,
    )
    for line in marks.read_text().splitlines():
        mark, oid = line.split()
        idx = int(mark[1:]) - 1
        commits[f"n{idx}"] = oid
    marks.unlink()


def time_spawns(arch: Archive, count: int, tag: str) -> list[float]:
    parents = [n for n in ("grpo", "n0", "n1", "n2") if arch.exists(n)]
    out = []
    for i in range(count):
        t = time.perf_counter()
        arch.spawn(
            parents[i % len(parents)], f"s{tag}-{i}", f"BENCH_{i} = {i}\n", proposal=f"bench {i}"
        )
        out.append(time.perf_counter() - t)
    return out


def time_reads(arch: Archive, repeats: int = 5) -> tuple[float, int]:
    times, n = [], 0
    for _ in range(repeats):
        t = time.perf_counter()
        n = len(arch.nodes())
        times.append(time.perf_counter() - t)
    return statistics.median(times), n


def gitpython_read(path: Path) -> tuple[float, int]:
    """Reference: GitPython object-by-object traversal (message + results blob per branch)."""
    import git

    repo = git.Repo(path)
    t = time.perf_counter()
    count = 0
    for ref in repo.references:
        if not ref.path.startswith(REF_PREFIX):
            continue
        commit = ref.commit
        _ = commit.message
        try:
            _ = (commit.tree / "results.json").data_stream.read()
        except KeyError:
            pass
        count += 1
    return time.perf_counter() - t, count


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--spawns", type=int, default=60)
    ap.add_argument("--no-reference", action="store_true", help="skip the GitPython reference")
    args = ap.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        arch = Archive.init(Path(tmp) / "exp")
        commits = {"grpo": arch.tip("grpo")}
        print(
            f"{'nodes':>7} {'spawn median ms':>16} {'spawn p99 ms':>13} {'read s':>8} "
            f"{'gitpython read s':>17} {'ratio':>6}"
        )
        rows = {}
        for size in sorted({min(1000, args.nodes), args.nodes}):
            t = time.perf_counter()
            bulk_load(arch, len(commits) - 1, size, rng, commits)
            load_s = time.perf_counter() - t
            arch.maintain()  # pack-refs + gc --auto, as the loop does after every round
            spawns = time_spawns(arch, args.spawns, str(size))
            read_s, n = time_reads(arch)
            ref_s = float("nan")
            if not args.no_reference:
                ref_s, m = gitpython_read(arch.path)
                assert m == n
            med, p99 = statistics.median(spawns) * 1e3, pct(spawns, 0.99) * 1e3
            rows[size] = (med, read_s)
            print(
                f"{n:>7} {med:>16.1f} {p99:>13.1f} {read_s:>8.3f} {ref_s:>17.2f} {ref_s / read_s:>5.0f}x"
                f"   (bulk load {load_s:.1f} s)"
            )
        med, read_s = rows[args.nodes]
        print(
            f"targets at {args.nodes} nodes: spawn median {med:.1f} ms (<= 25: {'ok' if med <= 25 else 'MISSED'}), "
            f"lineage read {read_s:.3f} s (<= 0.5: {'ok' if read_s <= 0.5 else 'MISSED'})"
        )
        t = time.perf_counter()
        ok = arch.fsck()
        print(f"git fsck --strict: {'clean' if ok else 'ERRORS'} ({time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    main()
