"""Archive benchmark: lineage read, duplicate check, spawn and selection at 1k, 10k and 100k nodes.

Builds one synthetic archive and grows it through the sizes: node commits with the real trailers
(``Poise-Node``, ``Poise-Parent``, ``Poise-Status``, ``Poise-Created``, ``Poise-Mechanism``,
``Poise-Results``), each its own ``algorithm.py`` and, on nine nodes in ten, a typed result
``results/proxy/<preset>.json`` under the archive's protocol (metrics with units and intervals,
seeds, per-seed rows and a short trajectory, as an evaluation records them), written by
``git fast-import`` with the branches packed (``packed-refs``, as ``Archive.maintain`` leaves them).
At each size it measures:

- the lineage read ``Archive.nodes()``, each in a new process (what a command pays, and a loop
  resumed): cold (the lineage index removed: every tip parsed from git, then indexed), warm (its
  first read, from the index file) and warm in memory (that process reading again);
- the duplicate-mechanism check (``same_mechanism``, the index's hash look-up) and
  ``Archive.spawn`` (median and p99 over ``--spawns``);
- one ``engine.select.select_parents`` call over the lineage read.

Each figure is printed with its target and its ratio to the smallest size measured in the same run
(and the warm read's to the cold one); ``--json PATH`` writes them per size.

Targets (2-core machine, at 100k nodes): lineage read <= 0.5 s (warm), spawn <= 25 ms median,
one selection <= 2 s.

    python benchmarks/bench_archive.py [--sizes 1000,10000,100000] [--spawns 40] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.archive import index as lineage_index  # noqa: E402
from engine.archive.edit import apply_edit  # noqa: E402
from engine.archive.locks import git_dir  # noqa: E402
from engine.archive.mechanism import mechanism_hash, same_mechanism  # noqa: E402
from engine.archive.store import REF_PREFIX, Archive  # noqa: E402
from engine.select import select_parents  # noqa: E402
from trainer_template.proxy.protocol import get_protocol  # noqa: E402

SPLITS = ("easy", "medium", "hard")
READ_TARGET_S = 0.5
SPAWN_TARGET_MS = 25.0
SELECT_TARGET_S = 2.0
FULL_PARENTS = 4
"""the first nodes hold the root's whole algorithm.py (the spawns fork them); later ones a short
module of their own (what a lineage read or a duplicate check reads of them is the trailer alone)"""


def result_template(arch: Archive) -> dict:
    """A result under the archive's configured protocol, as an evaluation writes it (values are
    filled per node by :func:`result_json`)."""
    preset = arch.config().proxy.preset
    proto = get_protocol(preset)
    names = [f"{s}/{m}" for s in SPLITS for m in ("acc@1", "pass@1", "pass@8", "valid_rate")]
    names += ["overall", "valid_rate"]
    return {
        "schema": "poise.result/2",
        "protocol": {
            "id": f"proxy/{preset}",
            "hash": proto.hash(),
            "backend": "proxy",
            "preset": preset,
            "settings": proto.to_dict(),
        },
        "status": "evaluated",
        "metrics": dict.fromkeys(names, 0.0) | {"mean_length": 0.0},
        "units": dict.fromkeys(names, "fraction") | {"mean_length": "tokens"},
        "intervals": {},
        "interval_kind": "95% Student-t over seeds",
        "seeds": [0, 1, 2, 3],
        "utility": "overall",
        "reason": "",
        "per_seed": [],
        "trajectory": {},
        "mlflow_run_ids": [],
        "wall_time_s": 0.0,
        "node_commit": "",
        "source": "evaluate",
        "recorded_at": 0.0,
        "details": {"timings": {"train_s": 0.0, "eval_s": 0.0}},
    }


def result_json(tpl: dict, rng: random.Random, i: int, skill: float = 0.0) -> bytes:
    """A node's result: every score its skill (which drifts along the lineage) plus noise, as
    per-benchmark scores of real nodes move together (independent uniform scores would make nearly
    every node Pareto-optimal on the nine objectives a selection ranks by, a population no search
    produces, whose layering costs the selection ten times what a real one does)."""
    d = dict(tpl)

    def score() -> float:
        return min(1.0, max(0.0, 0.4 + skill + rng.gauss(0.0, 0.03)))

    metrics = {k: (rng.uniform(5, 30) if k == "mean_length" else score()) for k in tpl["metrics"]}
    seeds = [score() for _ in d["seeds"]]
    metrics["overall"] = sum(seeds) / len(seeds)
    d["metrics"] = metrics
    d["intervals"] = {k: [v - 0.05, v + 0.05] for k, v in metrics.items()}
    d["per_seed"] = [
        {"seed": s, "status": "evaluated", "metrics": {"overall": o}, "trajectory_tail": {}}
        for s, o in zip(d["seeds"], seeds)
    ]
    d["trajectory"] = {
        "step": list(range(0, 40, 4)),
        "train/reward": [round(rng.random(), 4) for _ in range(10)],
        "train/entropy": [round(rng.random(), 4) for _ in range(10)],
    }
    d["mlflow_run_ids"] = [f"{i:08x}{s:024x}" for s in d["seeds"]]
    d["recorded_at"] = 1.8e9 + i
    d["wall_time_s"] = rng.uniform(5, 50)
    return json.dumps(d, sort_keys=True).encode()


def bulk_load(
    arch: Archive,
    start: int,
    stop: int,
    rng: random.Random,
    commits: dict,
    skills: dict | None = None,
) -> None:
    """Append nodes n<start>..n<stop-1> (parents drawn among existing nodes) with one fast-import,
    then add their branches to ``packed-refs`` in one rewrite (a fast-import of 100k branches leaves
    100k loose refs, which ``git pack-refs`` then takes minutes to fold)."""
    skills = {} if skills is None else skills  # node -> its skill, kept across calls
    base = arch.algorithm(arch.root())
    tpl = result_template(arch)
    pid = tpl["protocol"]["id"]
    names = list(commits)
    out: list[bytes] = []

    def data(b: bytes) -> None:
        out.append(b"data %d\n%s\n" % (len(b), b))

    ts = 1_800_000_000
    for i in range(start, stop):
        name = f"n{i}"
        parent = rng.choice(names)
        skills[name] = skills.get(parent, 0.0) + rng.gauss(0.0, 0.02)
        if i < FULL_PARENTS:
            algo = base + f"\nSCALE_{i} = {i}\n"
        else:
            algo = f'"""node {name}"""\nSCALE = {rng.random()!r}\nSHIFT = {i}\n'
        evaluated = i % 10 != 9
        msg = (
            f"poise: spawn {name} from {parent}\n\nPoise-Node: {name}\nPoise-Parent: {parent}\n"
            f"Poise-Status: {'evaluated' if evaluated else 'verified'}\n"
            f"Poise-Created: {ts + i}.000000\nPoise-Mechanism: {mechanism_hash(algo)}\n"
            f"Poise-Event: {'results' if evaluated else 'verified'}\n"
        )
        if evaluated:
            msg += f"Poise-Results: {pid}\n"
        out.append(b"commit refs/poise-bench/load\nmark :%d\n" % (i + 1))
        out.append(b"committer poise-git <poise-git@localhost> %d +0000\n" % (ts + i))
        data(msg.encode())
        out.append(f"from {commits[parent]}\n".encode())
        out.append(b"deleteall\n")  # a node inherits no records of its parent
        out.append(b"M 100644 inline algorithm.py\n")
        data(algo.encode())
        if evaluated:
            out.append(f"M 100644 inline results/{pid}.json\n".encode())
            data(result_json(tpl, rng, i, skills[name]))
        out.append(b"\n")
        names.append(name)
        commits[name] = f":{i + 1}"
    with tempfile.TemporaryDirectory() as tmp:
        marks = Path(tmp) / "marks"
        subprocess.run(
            ["git", "-C", str(arch.path), "fast-import", "--quiet", f"--export-marks={marks}"],
            input=b"".join(out),
            check=True,
        )
        added = {}
        for line in marks.read_text().splitlines():
            mark, oid = line.split()
            added[f"n{int(mark[1:]) - 1}"] = oid
    commits.update(added)
    arch.git.run("update-ref", "-d", "refs/poise-bench/load")
    arch.maintain()  # every other branch packed too
    packed = Path(git_dir(arch)) / "packed-refs"
    lines = packed.read_text().splitlines()
    head, refs = lines[:1], {ln.split(" ", 1)[1]: ln for ln in lines[1:] if not ln.startswith("^")}
    refs.update({REF_PREFIX + n: f"{oid} {REF_PREFIX}{n}" for n, oid in added.items()})
    tmp_packed = packed.with_suffix(".bench")
    tmp_packed.write_text("\n".join(head + [refs[r] for r in sorted(refs)]) + "\n")
    tmp_packed.replace(packed)


def drop_index(arch: Archive) -> None:
    """Forget the lineage index in this process and remove its file (the next read is cold)."""
    common = git_dir(arch)
    lineage_index.forget(common)
    arch._lineage_index = None
    for p in (Path(common) / lineage_index.INDEX_DIR).glob(lineage_index.INDEX_FILE + "*"):
        p.unlink()


_READER = """
import json, sys, time
from engine.archive.store import Archive
arch = Archive(sys.argv[1])
arch.config()  # the root and its settings, which every read of this handle shares
times, cpu = [], []
for _ in range(3):
    t, c = time.perf_counter(), time.process_time()
    n = len(arch.nodes())
    times.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
print(json.dumps({"nodes": n, "first": times[0], "again": min(times[1:]), "first_cpu": cpu[0],
                  "again_cpu": min(cpu[1:])}))
"""


def read_in_a_new_process(arch: Archive) -> dict:
    """``nodes()`` timed in a process that has read nothing yet (its first read: from the index
    file, or from git where there is none), then again in that process (from memory): what a
    command or a resumed loop pays, without this process's heap in the collector's way."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, "-c", _READER, str(arch.path)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.splitlines()[-1])


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def timed_cpu(fn):
    """(wall s, CPU s of this process: what git processes spend is not in it, out)"""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - t, time.process_time() - c, out


def measure(arch: Archive, size: int, spawns: int, tag: str) -> dict:
    drop_index(arch)
    cold = read_in_a_new_process(arch)  # parses every tip from git, then writes the index
    warm = read_in_a_new_process(arch)
    assert cold["nodes"] == warm["nodes"] == size + 1, (cold, warm, size)
    lineage_index.forget(git_dir(arch))
    arch._lineage_index = None
    nodes = arch.nodes()
    cfg = arch.config()
    select_s, select_cpu_s, _sel = timed_cpu(lambda: select_parents(nodes, cfg))
    parents = [f"n{i}" for i in range(min(FULL_PARENTS, size))] or [arch.root()]
    dup_ms, spawn_ms, spawn_cpu_ms = [], [], []
    for i in range(spawns):
        parent = parents[i % len(parents)]
        edit = f"BENCH_{tag}_{i} = {i}\n"
        src = apply_edit(arch.algorithm(parent), edit)  # what the command line checks
        t, same = timed(lambda src=src: same_mechanism(arch, src))
        assert same == [], same
        dup_ms.append(t * 1e3)
        t, c, _node = timed_cpu(lambda p=parent, n=f"s{tag}-{i}", e=edit: arch.spawn(p, n, e))
        spawn_ms.append(t * 1e3)
        spawn_cpu_ms.append(c * 1e3)
    # the spawned nodes' duplicate check finds them (written by the spawns, not by a lineage read)
    assert same_mechanism(arch, src) == [f"s{tag}-{spawns - 1}"]
    for i in range(spawns):
        arch.git.run("update-ref", "-d", f"{REF_PREFIX}s{tag}-{i}")
    return {
        "nodes": size,
        "lineage_read_s": {
            "cold": cold["first"],
            "warm": warm["first"],
            "warm_in_memory": warm["again"],
        },
        "lineage_read_cpu_s": {
            "cold": cold["first_cpu"],
            "warm": warm["first_cpu"],
            "warm_in_memory": warm["again_cpu"],
        },
        "select_s": select_s,
        "select_cpu_s": select_cpu_s,
        "spawn_median_ms": statistics.median(spawn_ms),
        "spawn_p99_ms": pct(spawn_ms, 0.99),
        "spawn_cpu_median_ms": statistics.median(spawn_cpu_ms),
        "duplicate_check_median_ms": statistics.median(dup_ms),
    }


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def report(rows: list[dict]) -> None:
    ref = rows[0]
    print(
        f"{'nodes':>7} {'read cold s':>11} {'warm s':>8} {'in-mem s':>8} {'warm/cold':>9} "
        f"{'dup ms':>7} {'spawn ms':>8} {'p99 ms':>7} {'select s':>8}"
    )
    for r in rows:
        rd = r["lineage_read_s"]
        print(
            f"{r['nodes']:>7} {rd['cold']:>11.3f} {rd['warm']:>8.3f} {rd['warm_in_memory']:>8.3f} "
            f"{rd['warm'] / rd['cold']:>9.2f} {r['duplicate_check_median_ms']:>7.1f} "
            f"{r['spawn_median_ms']:>8.1f} {r['spawn_p99_ms']:>7.1f} {r['select_s']:>8.3f}"
        )
    for r in rows[1:]:
        rd, r0 = r["lineage_read_s"], ref["lineage_read_s"]
        x = r["nodes"] / ref["nodes"]
        print(
            f"{r['nodes']} vs {ref['nodes']} nodes ({x:.0f}x): read cold {rd['cold'] / r0['cold']:.1f}x, "
            f"warm {rd['warm'] / r0['warm']:.1f}x, duplicate check "
            f"{r['duplicate_check_median_ms'] / ref['duplicate_check_median_ms']:.1f}x, spawn "
            f"{r['spawn_median_ms'] / ref['spawn_median_ms']:.1f}x, select "
            f"{r['select_s'] / ref['select_s']:.1f}x"
        )
    print("CPU time of the reading process (git's own processes not counted):")
    for r in rows:
        rc = r["lineage_read_cpu_s"]
        print(
            f"{r['nodes']:>7} read cold {rc['cold']:.3f} s, warm {rc['warm']:.3f} s, in memory "
            f"{rc['warm_in_memory']:.3f} s; spawn median {r['spawn_cpu_median_ms']:.1f} ms"
        )
        print(f"{r['nodes']:>7} select_parents CPU {r['select_cpu_s']:.3f} s")
    top = rows[-1]
    warm, med, sel = top["lineage_read_s"]["warm"], top["spawn_median_ms"], top["select_s"]
    print(
        f"targets at {top['nodes']} nodes: lineage read (warm) {warm:.3f} s "
        f"(<= {READ_TARGET_S}: {'ok' if warm <= READ_TARGET_S else 'MISSED'}), spawn median "
        f"{med:.1f} ms (<= {SPAWN_TARGET_MS:.0f}: {'ok' if med <= SPAWN_TARGET_MS else 'MISSED'}), "
        f"select {sel:.3f} s (<= {SELECT_TARGET_S:.0f}: {'ok' if sel <= SELECT_TARGET_S else 'MISSED'})"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="1000,10000,100000", help="comma-separated node counts")
    ap.add_argument("--spawns", type=int, default=40, help="spawns timed at each size")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    except ValueError:
        ap.error(f"--sizes takes comma-separated integers, got {args.sizes!r}")
    if not sizes or sizes[0] < 1 or args.spawns < 1:
        ap.error("--sizes needs positive node counts and --spawns at least 1")
    rng = random.Random(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        arch = Archive.init(Path(tmp) / "exp")
        commits = {arch.root(): arch.tip(arch.root())}
        skills: dict[str, float] = {}
        for size in sizes:
            load_s, _ = timed(
                lambda size=size: bulk_load(arch, len(commits) - 1, size, rng, commits, skills)
            )
            print(f"built {size} nodes in {load_s:.1f} s", file=sys.stderr, flush=True)
            rows.append(measure(arch, size, args.spawns, str(size)) | {"build_s": load_s})
        fsck_s, ok = timed(arch.fsck)
    report(rows)
    print(f"git fsck --strict: {'clean' if ok else 'ERRORS'} ({fsck_s:.1f} s)")
    if args.json:
        args.json.write_text(json.dumps({"sizes": rows}, indent=1) + "\n")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
