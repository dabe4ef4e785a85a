"""Which proxy protocol separates the published mechanisms: their paired differences to GRPO under
protocol variants, side by side.

    nice -n 5 .venv/bin/python benchmarks/bench_protocol_sweep.py \\
        --variant default: --variant long:steps=200 --variant hot:lr=4e-4 --variant hard:k_power=-1 \\
        [--mechanisms grpo,sa_grpo,...] [--seeds 6] [--parallel N] [--rows ROWS.jsonl] [--json OUT]

A variant is ``NAME:FIELD=VALUE,...`` over the ``--preset`` protocol: a bare field is one of the RL
settings (``steps``, ``lr``, ``k_power``, ``prompts``, ``group``, ``minibatches``, ...), an
``eval.``-prefixed one an evaluation setting, a ``task.``-prefixed one the task's (``mul_rate_hard``,
``mul_rate_medium``, ``max_response``: the RL prompts and the evaluation's alike), a
``warmstart.``-prefixed one the warm start's (``skill_steps``, ``d_model``, ...: built once in the
warm-start cache before the runs, then pinned by its content hash; a style mix is a tuple,
``warmstart.habit_hard=(0.5,0.15,0.35,0.0)``); ``NAME:`` alone is the preset
itself. Every (variant, mechanism, seed) trains its variant's warm start (the shipped one unless
``warmstart.`` settings change) in a worker process of this script (the published mechanisms are
trusted code: no sandbox) and is scored by the variant's own evaluation at that seed, as a seed run
of ``poise-git evaluate`` would be. Jobs run seed by seed, so a sweep cut short still holds
complete paired seeds. Every finished job is appended to ``--rows`` (JSON lines) at once, and a
re-run reads it back and runs only what is missing.

Prints, per variant: each mechanism's mean Overall, its paired difference to GRPO with the 95%
t-interval and the seed-to-seed SD, the verdict (above / below / within), Spearman's rank
correlation with the paper over the mechanisms run, the calibration targets it meets (SA-GRPO and
DCBE-GRPO below GRPO; how many of AV, VM-AV, MSA, DACE, FA above it) and the seconds per run.
``--report-only`` summarizes the rows a sweep left (one cut short, say) without running any.
``--score paper32`` compares the paper's weighting instead of the protocol's Overall: pass@32 on
the hard (0.40) and medium (0.15) splits and greedy acc@1 on each split (0.15 each), as the paper
weighs AIME and AMC pass@32 and three acc@1 benchmarks; it needs ``eval.samples`` of 32 or more.
``--sources DIR`` reads each mechanism's algorithm.py from ``DIR/NAME.py`` (written by
``--write-sources DIR``) instead of rendering it from ``trainer_template/priors``.
``--mechanism-variant NAME=BASE:FIELD=VALUE,...`` adds a mechanism NAME: BASE's source with those
``Hyperparameters`` defaults set (the edit the offline proposer makes; every other byte kept), e.g.
``grpo_kl=grpo:kl_coef=0.000935`` for a null control, GRPO with AV-GRPO's effective KL weight.
Its rows record what NAME stood for; a re-run that derives NAME otherwise is refused.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import proxy_runs
from proxy_runs import (
    PAPER_OVERALL,
    ROOT,
    calibration_targets,
    fmt_iv,
    load_average,
    machine_info,
    measured_on,
    stamp,
    verdict,
    write_results,
)

from engine.stats import SEEDS_LIMIT, mean_interval, paired_interval, seeds_to_resolve


def split_items(spec: str) -> list[str]:
    """``FIELD=VALUE,...`` split at the commas outside brackets, so a VALUE may be a tuple such as
    ``warmstart.habit_hard=(0.55,0.2,0.25,0.0)``; empty items dropped."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            items.append(spec[start:i])
            start = i + 1
    items.append(spec[start:])
    return [s.strip() for s in items if s.strip()]


def _setting_value(name: str, field: str, value, default):
    """``value`` as the setting takes it: a tuple setting (a style mix) takes as many non-negative
    numbers as its default has, not all zero, and keeps them as a tuple (the protocol is frozen and
    hashed); a one-value setting refuses a tuple."""
    if isinstance(default, tuple):
        ok = isinstance(value, list | tuple) and len(value) == len(default)
        ok = ok and all(isinstance(v, int | float) and v >= 0 for v in value) and sum(value) > 0
        if not ok:
            raise ValueError(
                f"variant {name!r}: {field} takes {len(default)} non-negative numbers, not all "
                f"zero, as (a,b,...), got {value!r}"
            )
        return tuple(value)
    if isinstance(value, list | tuple):
        raise ValueError(f"variant {name!r}: {field} takes one value, got {value!r}")
    return value


def parse_variant(text: str, base) -> tuple[str, dict]:
    """``NAME:FIELD=VALUE,...`` -> (NAME, {"rl": {...}, "eval": {...}, "task": {...}}), checked
    against ``base``. A tuple setting (the warm start's style mixes) takes ``FIELD=(a,b,c,d)``."""
    name, _, spec = text.partition(":")
    if not name:
        raise ValueError(f"variant {text!r} has no name (NAME:FIELD=VALUE,...)")
    changes: dict[str, dict] = {"rl": {}, "eval": {}, "task": {}, "warmstart": {}}
    for item in split_items(spec):
        key, eq, raw = item.partition("=")
        if not eq:
            raise ValueError(f"variant {name!r}: {item!r} is not FIELD=VALUE")
        part, _, field = key.rpartition(".")
        part = part or "rl"
        if part not in changes:
            raise ValueError(
                f"variant {name!r}: {key!r} is none of an RL, an eval., a task. or a warmstart. "
                "setting"
            )
        known = {f.name for f in dataclasses.fields(getattr(base, part))}
        if field not in known:
            raise ValueError(
                f"variant {name!r}: unknown {part} setting {field!r} (known: {', '.join(sorted(known))})"
            )
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            raise ValueError(f"variant {name!r}: {raw!r} is not a number or literal") from None
        changes[part][field] = _setting_value(name, key, value, getattr(getattr(base, part), field))
    for part in ("task", "warmstart"):  # the preset's own: recorded as before these could vary
        if not changes[part]:
            del changes[part]
    return name, changes


def parse_mechanism_variant(text: str) -> tuple[str, str, dict]:
    """``NAME=BASE:FIELD=VALUE,...`` -> (NAME, BASE, {FIELD: VALUE}); VALUE a Python literal."""
    name, eq, rest = text.partition("=")
    base, colon, spec = rest.partition(":")
    if not (eq and colon and name.isidentifier() and base.isidentifier()):
        raise ValueError(f"mechanism variant {text!r} is not NAME=BASE:FIELD=VALUE,...")
    values = {}
    for item in split_items(spec):
        field, eq, raw = item.partition("=")
        if not eq or not field.isidentifier():
            raise ValueError(f"mechanism variant {name!r}: {item!r} is not FIELD=VALUE")
        try:
            values[field] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            raise ValueError(f"mechanism variant {name!r}: {raw!r} is not a literal") from None
    if not values:
        raise ValueError(f"mechanism variant {name!r} sets no hyperparameter")
    return name, base, values


def mechanism_variant_source(base_source: str, values: dict) -> str:
    """``base_source`` with its ``Hyperparameters`` defaults set; a field the base lacks is an
    error (a typo would otherwise add a field nothing reads)."""
    from engine.operators.proposers.edit_plan import class_defaults
    from engine.operators.proposers.hyperparams import set_defaults

    fields = class_defaults(base_source)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(
            f"no Hyperparameters field {', '.join(map(repr, unknown))} (known: {', '.join(sorted(fields))})"
        )
    return set_defaults(base_source, values)


def variant_protocol(base, changes: dict):
    """The base protocol with a variant's RL, evaluation and task changes (its hash follows them;
    a task setting out of range is a ValueError)."""
    if changes["eval"].get("samples", base.eval.samples) < 8:
        raise ValueError("eval.samples must be at least 8 (the evaluation reports pass@8)")
    proto = dataclasses.replace(
        base,
        rl=dataclasses.replace(base.rl, **changes["rl"]),
        eval=dataclasses.replace(base.eval, **changes["eval"]),
        task=dataclasses.replace(base.task, **changes.get("task", {})),
    )
    if changes.get("warmstart"):  # another starting policy: built, then pinned (see pin_warmstart)
        proto = dataclasses.replace(
            proto,
            warmstart=dataclasses.replace(base.warmstart, **changes["warmstart"]),
            warmstart_sha256=None,
        )
    return proto


def pin_warmstart(protocol, build: bool, log=None):
    """A variant's own warm start (``warmstart.`` settings), built in the warm-start cache when
    ``build`` (minutes: once per settings, then read back) and pinned by its content hash, so the
    variant's hash names the weights its runs start from. Unchanged when the protocol pins one
    already, or when it is not built and not cached."""
    from trainer_template.proxy.warmstart import (
        cache_dir,
        checkpoint_name,
        ensure_warmstart,
        verify_warmstart,
    )

    if protocol.warmstart_sha256:
        return protocol
    cached = cache_dir() / checkpoint_name(protocol)
    if not build and not cached.is_file():
        return protocol
    path = ensure_warmstart(protocol, log=log)
    return dataclasses.replace(protocol, warmstart_sha256=verify_warmstart(protocol, path))


def mechanism_source(name: str, sources: str | None) -> str:
    """``sources/NAME.py`` when a sources directory is given, else the rendered prior."""
    if sources:
        return (Path(sources) / f"{name}.py").read_text(encoding="utf-8")
    return proxy_runs.mechanism_source(name)


def render_sources(mechs: list[str], derived: dict, sources: str | None) -> dict[str, str]:
    """Each mechanism's algorithm.py: a derived one (``--mechanism-variant``) from its base's."""
    return {
        m: mechanism_variant_source(mechanism_source(derived[m][0], sources), derived[m][1])
        if m in derived
        else mechanism_source(m, sources)
        for m in mechs
    }


def derivation(derived: dict, name: str) -> dict:
    """What a derived mechanism's rows record of it (``mechanism_variant``)."""
    base, values = derived[name]
    return {"base": base, "set": values}


def check_derived_rows(rows: list[dict], derived: dict) -> None:
    """A finished row of a derived mechanism must have been derived as the name is now: a re-run
    that gives an old name another base or other settings is refused, not read back."""
    for r in rows:
        spec = r.get("mechanism_variant")
        if spec is None or r["mechanism"] not in derived:
            continue
        now = derivation(derived, r["mechanism"])
        if spec != now:
            raise ValueError(
                f"the rows hold {r['mechanism']!r} as {spec['base']} with {spec['set']}, not "
                f"{now['base']} with {now['set']}: give the new mechanism another name or other --rows"
            )


def run_job(variant: str, protocol, mech: str, source: str, seed: int) -> dict:
    """One seed of one mechanism under one variant (a row of ``--rows``)."""
    from trainer_template.proxy import evalset  # lazy: only the worker processes train
    from trainer_template.proxy.worker import train_policy

    t0 = time.monotonic()
    traj: dict[str, list] = {}
    model, stopped = train_policy(protocol, source, mech, seed, trajectory=traj)
    # a collapsed run counts, as in calibration
    metrics = evalset.evaluate(model, protocol.eval, seed, protocol.task)
    keep = ("train/entropy", "train/valid_rate", "train/kl", "train/response_length")
    last = {k: v[-1] for k, v in traj.items() if v and k in keep}
    return {
        "variant": variant,
        "mechanism": mech,
        "seed": seed,
        "overall": metrics["overall"],
        "metrics": metrics,
        "stopped": stopped,
        # resolved here, where it trained: a GPU preset's hash names the device it ran on
        "protocol_hash": protocol.hash(),
        "device": protocol.device(),
        "steps_run": len(traj.get("step", [])),
        "final_train": last,
        "wall_s": round(time.monotonic() - t0, 1),
        "machine": machine_info(),
    }


# The paper's Overall read on the proxy's splits, fixed before any run scored by it was read: the
# paper weighs pass@32 on its hardest sets (0.2 AIME24 + 0.2 AIME25), pass@32 on AMC (0.15) and acc@1
# on MATH-500, Minerva and OlympiadBench (0.15 each); here hard and medium pass@32 and each split's
# greedy acc@1. It needs an evaluation of at least 32 samples per prompt (``eval.samples=64``).
PAPER32_WEIGHTS = {
    "hard/pass@32": 0.40,
    "medium/pass@32": 0.15,
    "easy/acc@1": 0.15,
    "medium/acc@1": 0.15,
    "hard/acc@1": 0.15,
}
SCORES = {"overall": "Overall (fraction)", "paper32": "paper-weighted Overall (fraction)"}
PAPER32_MIN_SAMPLES = 32
"""the fewest evaluation samples per prompt that report pass@32 (``evalset.evaluate``)"""


def check_score(score: str, protocols: dict) -> None:
    """ValueError when ``score`` cannot read every variant's runs: paper32 needs pass@32, so every
    variant's evaluation must draw at least 32 samples. Checked before the sweep trains anything,
    so a sweep never runs for minutes to end in a table it cannot print."""
    if score != "paper32":
        return
    narrow = [n for n, p in protocols.items() if p.eval.samples < PAPER32_MIN_SAMPLES]
    if narrow:
        raise ValueError(
            f"--score paper32 reads pass@32, which an evaluation of fewer than "
            f"{PAPER32_MIN_SAMPLES} samples does not report: variant(s) {', '.join(narrow)} "
            "(add eval.samples=64)"
        )


def rescore(rows: list[dict], score: str) -> list[dict]:
    """The rows with ``overall`` read as ``score``: ``overall`` (the protocol's own, as recorded) or
    ``paper32`` (``PAPER32_WEIGHTS`` over each row's metrics). ValueError for an unknown score or
    rows whose evaluation has no pass@32."""
    if score == "overall":
        return rows
    if score != "paper32":
        raise ValueError(f"unknown score {score!r} (known: {', '.join(SCORES)})")
    out = []
    for r in rows:
        m = r.get("metrics", {})
        missing = [k for k in PAPER32_WEIGHTS if k not in m]
        if missing:
            raise ValueError(
                f"{r['variant']} {r['mechanism']} seed {r['seed']}: no {missing[0]} "
                "(paper32 needs an evaluation of at least 32 samples, e.g. eval.samples=64)"
            )
        out.append({**r, "overall": sum(w * m[k] for k, w in PAPER32_WEIGHTS.items())})
    return out


def resolve_text(row: dict) -> str:
    """A table cell: the paired seeds at which a row's difference to GRPO, were it real, would lie
    beyond its 95% interval in 4 evaluations of 5, at the paired SD measured (``stats.
    seeds_to_resolve``); '-' for GRPO, '>SEEDS_LIMIT' where no practical number of seeds would."""
    if row.get("diff") is None or not row.get("diff_sd"):
        return "-"
    n = seeds_to_resolve(row["diff"], row["diff_sd"])
    return str(n) if n else f">{SEEDS_LIMIT}"


def summarize(rows: list[dict], mechs: list[str]) -> dict:
    """One variant's table: paired differences to GRPO, Spearman with the paper, targets met."""
    ov = {m: {r["seed"]: r["overall"] for r in rows if r["mechanism"] == m} for m in mechs}
    table = []
    for m in mechs:
        if not ov[m]:
            continue
        mean, iv = mean_interval(list(ov[m].values()))
        stopped = sum(1 for r in rows if r["mechanism"] == m and r.get("stopped"))
        row = {
            "mechanism": m,
            "overall": mean,
            "interval": iv,
            "seeds": len(ov[m]),
            "stopped": stopped,
        }
        if m != "grpo":
            res = paired_interval(ov[m], ov["grpo"])
            if res:
                diffs = [ov[m][s] - ov["grpo"][s] for s in ov[m] if s in ov["grpo"]]
                row.update(
                    diff=res[0],
                    diff_interval=res[1],
                    diff_sd=statistics.stdev(diffs) if len(diffs) > 1 else None,
                    verdict=verdict(res[1]),
                )
        table.append(row)
    walls = [r["wall_s"] for r in rows]
    return {
        "table": table,
        **calibration_targets(table),
        "mean_abs_diff": statistics.mean([abs(r["diff"]) for r in table if "diff" in r] or [0.0]),
        "mean_diff_sd": statistics.mean([r["diff_sd"] for r in table if r.get("diff_sd")] or [0.0]),
        "seconds_per_run": statistics.mean(walls) if walls else None,
    }


def measured_hash(variant: str, rows: list[dict], protocol, here: bool) -> str:
    """The protocol hash a variant's rows were measured under: the one every row records, computed
    where it trained (a GPU preset's hash names the device). Rows from before rows recorded it take
    this machine's hash, which for a CPU protocol is every machine's; a GPU preset's rows must
    record theirs. Rows under different hashes are never summarized together (the same preset on
    a GPU and on a CPU samples differently), and a sweep that trains here (``here``) refuses rows
    measured under another hash than this machine's: ValueError."""
    local = protocol.hash()
    if protocol.accelerator != "cpu" and any("protocol_hash" not in r for r in rows):
        raise ValueError(
            f"variant {variant!r}: rows of a {protocol.accelerator!r} protocol that record no "
            "protocol hash; which device trained them is unknown"
        )
    counts: dict[str, int] = {}
    for r in rows:
        h = r.get("protocol_hash", local)
        counts[h] = counts.get(h, 0) + 1
    if len(counts) > 1:
        listed = ", ".join(f"{n} under {h[:19]}…" for h, n in sorted(counts.items()))
        raise ValueError(
            f"variant {variant!r}: its rows were measured under different protocols "
            f"({listed}); give each its own --rows"
        )
    measured = next(iter(counts), local)
    if here and measured != local:
        raise ValueError(
            f"variant {variant!r}: its rows were measured under protocol {measured[:19]}…, and "
            f"here it is {local[:19]}… (device {protocol.device()}); train into another --rows, "
            "or summarize these with --report-only"
        )
    return measured


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut off by a kill: that job runs again
    return rows


def main() -> None:
    from trainer_template.proxy.protocol import get_protocol

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--variant", action="append", default=[], help="NAME:FIELD=VALUE,...")
    ap.add_argument("--mechanisms", default=",".join(PAPER_OVERALL), help="GRPO always runs")
    ap.add_argument("--seeds", type=int, default=6, help="paired RL seeds 0..S-1")
    ap.add_argument("--preset", default="default")
    ap.add_argument("--parallel", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--sources", default=None, help="read DIR/NAME.py instead of rendering priors")
    ap.add_argument(
        "--mechanism-variant",
        action="append",
        default=[],
        help="NAME=BASE:FIELD=VALUE,...: BASE with those Hyperparameters defaults",
    )
    ap.add_argument("--write-sources", default=None, help="write DIR/NAME.py for --sources, exit")
    ap.add_argument(
        "--report-only", action="store_true", help="summarize the rows already in --rows, run none"
    )
    ap.add_argument(
        "--score",
        default="overall",
        choices=list(SCORES),
        help="what the tables compare: the protocol's Overall, or paper32 (the paper's weights: "
        "pass@32 on hard and medium, acc@1 on every split; needs eval.samples >= 32)",
    )
    ap.add_argument(
        "--rows", default=None, help="JSON lines of finished jobs (default: beside --json)"
    )
    ap.add_argument(
        "--json",
        default=str(ROOT / "benchmarks" / "results" / "protocol-sweep.json"),
        help="output",
    )
    args = ap.parse_args()
    try:
        derived = {n: (b, v) for n, b, v in map(parse_mechanism_variant, args.mechanism_variant)}
    except ValueError as exc:
        sys.exit(str(exc))
    mechs = ["grpo"] + [m for m in args.mechanisms.split(",") if m and m != "grpo"]
    mechs += [n for n in derived if n not in mechs]
    try:
        sources = render_sources(mechs, derived, None if args.write_sources else args.sources)
    except (ValueError, OSError, KeyError) as exc:
        sys.exit(f"mechanism sources: {exc.args[0] if isinstance(exc, KeyError) else exc}")
    if args.write_sources:
        out = Path(args.write_sources)
        out.mkdir(parents=True, exist_ok=True)
        for m in mechs:
            (out / f"{m}.py").write_text(sources[m], encoding="utf-8")
        print(f"wrote {len(mechs)} sources to {out}")
        return
    base = get_protocol(args.preset)
    try:
        variants = dict(parse_variant(v, base) for v in (args.variant or [f"{args.preset}:"]))
        protocols = {n: variant_protocol(base, c) for n, c in variants.items()}
        check_score(args.score, protocols)  # before any warm start is built or any run trains
    except (ValueError, TypeError) as exc:
        sys.exit(str(exc))
    for n, proto in protocols.items():
        if not proto.warmstart_sha256 and not args.report_only:
            print(
                f"{stamp()} {n}: building its warm start (minutes; cached for re-runs)", flush=True
            )
        protocols[n] = pin_warmstart(
            proto, build=not args.report_only, log=lambda m: print(f"  {m}", flush=True)
        )
    rows_path = Path(args.rows or Path(args.json).with_suffix(".rows.jsonl"))
    rows_path.parent.mkdir(parents=True, exist_ok=True)
    finished = read_rows(rows_path)
    try:
        check_derived_rows(finished, derived)
    except ValueError as exc:
        sys.exit(str(exc))
    try:
        for v, proto in protocols.items():
            mine = [r for r in finished if r["variant"] == v]
            measured_hash(v, mine, proto, here=not args.report_only)
    except ValueError as exc:
        sys.exit(str(exc))
    done = {(r["variant"], r["mechanism"], r["seed"]) for r in finished}
    jobs = [
        (v, m, s)
        for s in range(args.seeds)
        for v in protocols
        for m in mechs
        if (v, m, s) not in done and not args.report_only
    ]
    t0, loads, failed = time.monotonic(), [load_average()], 0
    print(
        f"{stamp()} {len(protocols)} variants x {len(mechs)} mechanisms x {args.seeds} seeds: "
        f"{len(jobs)} runs to do ({len(done)} read back), {args.parallel} at a time; "
        f"load average {loads[0]}",
        flush=True,
    )
    # spawned, not forked: a GPU preset's hash asks torch about CUDA in this process, and a forked
    # child cannot use a CUDA driver its parent started
    ctx = multiprocessing.get_context("spawn")
    with (
        ProcessPoolExecutor(max_workers=max(1, args.parallel), mp_context=ctx) as pool,
        rows_path.open("a") as out,
    ):
        futures = [pool.submit(run_job, v, protocols[v], m, sources[m], s) for v, m, s in jobs]
        for i, fut in enumerate(as_completed(futures), 1):
            try:
                r = fut.result()
            except Exception as exc:  # one broken job: the others go on; a re-run retries it
                print(f"  [{i}/{len(jobs)}] a run failed: {type(exc).__name__}: {exc}", flush=True)
                failed += 1
                continue
            if r["mechanism"] in derived:  # what the name stood for, so a re-run can check it
                r["mechanism_variant"] = derivation(derived, r["mechanism"])
            out.write(json.dumps(r) + "\n")
            out.flush()
            print(
                f"  [{i}/{len(jobs)}] {r['variant']:>10} {r['mechanism']:>12} seed {r['seed']}: "
                f"Overall {r['overall']:.3f} ({r['wall_s']:.0f} s)",
                flush=True,
            )
    loads.append(load_average())
    rows = [r for r in read_rows(rows_path) if r["variant"] in protocols and r["seed"] < args.seeds]
    try:
        rows = rescore(rows, args.score)
    except ValueError as exc:
        sys.exit(str(exc))
    summaries = {}
    for v, proto in protocols.items():
        mine = [r for r in rows if r["variant"] == v]
        s = summarize(mine, mechs)
        measured = measured_hash(v, mine, proto, here=False)  # checked above
        s.update(changes=variants[v], protocol_hash=measured, settings=proto.to_dict())
        summaries[v] = s
        if s["seconds_per_run"] is None:
            print(f"\n## {v} {json.dumps(variants[v])}: no finished runs")
            continue
        print(f"\n## {v} {json.dumps(variants[v])}  ({s['seconds_per_run']:.0f} s per run)\n")
        score = SCORES[args.score].split(" (")[0]
        print(
            f"| mechanism | {score} | vs GRPO (paired) | 95% interval | SD | verdict | "
            "seeds to resolve | paper | stopped early |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for r in sorted(s["table"], key=lambda r: -r["overall"]):
            diff = f"{r['diff']:+.3f}" if "diff" in r else "-"
            sd = f"{r['diff_sd']:.3f}" if r.get("diff_sd") else "-"
            print(
                f"| {r['mechanism']} | {r['overall']:.3f} | {diff} | "
                f"{fmt_iv(r.get('diff_interval'), signed=True)} | {sd} | "
                f"{r.get('verdict', 'reference')} | {resolve_text(r)} | "
                f"{PAPER_OVERALL.get(r['mechanism'], '-')} | {r['stopped']} of {r['seeds']} |"
            )
        print(
            f"\nSpearman with the paper {s['spearman']:+.3f}; below GRPO: "
            f"{', '.join(s['regressions_below']) or 'none'} (of SA, DCBE); above GRPO: "
            f"{', '.join(s['improvers_above']) or 'none'} (of 5 improvers); mean |diff| "
            f"{s['mean_abs_diff']:.3f}, mean SD of the paired differences {s['mean_diff_sd']:.3f}"
        )
    wall = time.monotonic() - t0
    print(
        f"\n{len(jobs) - failed} runs in {wall / 60:.1f} min ({failed} failed); load average "
        f"{loads[0]} -> {loads[1]}"
    )
    # the machine the rows were measured on (a --report-only summary can be written elsewhere)
    machine, machines = measured_on(rows)
    # the preset's hash on the device the rows were trained on (a GPU preset's rows read back here)
    devices = {r.get("device", "cpu") for r in rows}
    path = write_results(
        args.json,
        args,
        SCORES[args.score],
        protocol_hash=base.hash(devices.pop()) if len(devices) == 1 else None,
        machine=machine,
        rows_measured_on=machines,
        variants=summaries,
        wall_s=round(wall, 1),
        load_average=loads,
    )
    print(f"wrote {path} and {rows_path}")


if __name__ == "__main__":
    main()
