"""Discovery power of the closed loop on the CPU proxy, against random search with the same budget.

    nice -n 5 .venv/bin/python benchmarks/bench_discovery.py [--candidates 16] [--seeds 6] \\
        [--search-seeds 3]

For each search seed: (a) ``poise-git run`` from the GRPO root (or ``--root-source FILE``, an
``algorithm.py`` of your own as the root node ``--root-name``) with the offline proposer (selection,
TPE-guided mutation and crossover, verification, evaluation, reflection) until it has spawned
``--candidates`` children; (b) random search over the same component space with the same budget:
each candidate mutates one random component of a uniformly chosen evaluated node, continuous values
drawn uniformly (no TPE, no selection model). Every candidate is evaluated at ``--seeds`` paired
seeds; per-seed results are cached by (code, protocol, seed) in ``$POISE_EVAL_CACHE`` (default
``.cache/poise-eval``), so the root and any code found twice are trained once.

Reports per method and search seed the best-so-far Overall after each candidate, the best node's
paired difference to the root with its 95% interval, and whether it beats the root beyond it; writes
the curves as a figure (``--figure``) and everything as JSON (``--json``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

from proxy_runs import ROOT, load_average, mean_interval, paired, stamp, write_results

from trainer_template.proxy.protocol import PRESETS, get_protocol


def per_seed_overall(node) -> dict[int, float]:
    r = node.result
    if r is None:
        return {}
    return {
        int(p["seed"]): float(p["metrics"]["overall"])
        for p in r.per_seed
        if p.get("metrics") and "overall" in p["metrics"]
    }


def finished_searches(work: Path, methods: list[str]) -> list[tuple[str, int, Path, dict]]:
    """(method, search seed, archive directory, the search's JSON) for every search of ``methods``
    finished in ``work``: the ``METHOD-sSEED.json`` :func:`main` writes beside the archive
    ``METHOD-sSEED`` (which a caller should check is still there)."""
    out = []
    for done in sorted(work.glob("*-s*.json")):
        method, _, seed = done.stem.rpartition("-s")
        if method in methods and seed.isdigit():
            out.append((method, int(seed), work / done.stem, json.loads(done.read_text())))
    return out


def searched_archives(work: Path, methods: str) -> list[tuple[str, int, Path]]:
    """(method, search seed, archive directory) of every search of ``methods`` (comma-separated)
    finished in ``work``, for the tools that read them; exits with a message when there is none or
    an archive is gone."""
    searches = finished_searches(work, methods.split(","))
    if not searches:
        raise SystemExit(f"no finished search of {methods} under {work}")
    for method, seed, path, _ in searches:
        if not path.is_dir():
            raise SystemExit(f"{method} search seed {seed}: its archive {path} is gone")
    return [(method, seed, path) for method, seed, path, _ in searches]


def best_so_far(rows: list[dict], root_overall: float) -> list[float]:
    """The best Overall in the archive after each candidate: the root counts (it is the search's
    starting point), a failed or worse candidate leaves the curve where it was."""
    curve, best = [], root_overall
    for r in rows:
        if r.get("overall") is not None:
            best = max(best, r["overall"])
        curve.append(best)
    return curve


def trace(archive, root: str, preset: str) -> dict:
    """Candidates in spawn order with their Overall under ``proxy/<preset>``, the best-so-far curve
    and the best node's paired difference to the root."""
    nodes = archive.nodes(f"proxy/{preset}")
    kids = sorted((n for n in nodes.values() if n.name != root), key=lambda n: (n.created, n.name))
    base = per_seed_overall(nodes[root])
    best, rows = None, []
    for n in kids:
        ov = n.overall if n.evaluated else None
        rows.append({"node": n.name, "status": n.status, "overall": ov, "parents": list(n.parents)})
        if ov is not None and (best is None or ov > best[1]):
            best = (n.name, ov)
    root_overall = nodes[root].metrics.get("overall")
    out = {
        "root": root,
        "root_overall": root_overall,
        "candidates": rows,
        "curve": best_so_far(rows, root_overall),
    }
    if best:
        d, iv = paired(per_seed_overall(nodes[best[0]]), base)
        out.update(
            best=best[0],
            best_overall=best[1],
            best_diff=d,
            best_diff_interval=iv,
            beats_root=bool(iv and iv[0] > 0),
        )
    return out


def summarize(runs: dict) -> dict:
    """One method's searches (search seed -> search): the mean best Overall with its 95% interval over
    the search seeds, and in how many of them the best node beats the root beyond its interval."""
    bests = [r["best_overall"] for r in runs.values() if r.get("best_overall") is not None]
    m, iv = mean_interval(bests) if bests else (float("nan"), None)
    return {
        "mean_best_overall": m,
        "interval": iv,
        "beats_root_in": sum(1 for r in runs.values() if r.get("beats_root")),
        "search_seeds": len(runs),
    }


def loop_config(args) -> str | None:
    """The loop archive's poise.toml: the default one, with ``--remedies`` / ``--directed`` (an
    ablation of the proposer's diagnosis), ``--learned`` (its direction by the archive's evidence) and
    ``--explore`` (that direction's untried moves), ``--min-gain`` (the expected gain its favoured
    moves need) and ``--remedy-trials`` (the trials after which a remedy that never moved its
    series is spent) written into ``[propose]``; None when none is given."""
    from engine.config import DEFAULT_TOML

    lines = []
    if args.remedies is not None:
        moves = [m for m in args.remedies.split(",") if m]
        lines.append(f"remedies = {json.dumps(moves)}")
    if args.directed is not None:
        lines.append(f"directed = {args.directed}")
    if args.learned is not None:
        lines.append(f"learned = {args.learned}")
    if args.explore:
        lines.append("explore = true")
    if args.min_gain is not None:
        lines.append(f"min_gain = {args.min_gain}")
    if args.remedy_trials is not None:
        lines.append(f"remedy_trials = {args.remedy_trials}")
    if not lines:
        return None
    return DEFAULT_TOML.replace("[propose]\n", "[propose]\n" + "\n".join(lines) + "\n", 1)


LOOP_ONLY = ("parents", "population", "implement", "remedies", "directed", "learned", "explore")
LOOP_ONLY += ("min_gain", "remedy_trials")


def search_settings(args, method: str) -> dict:
    """What a finished search of ``method`` depends on besides its search seed: a later invocation
    reads it back only under the same settings (the protocol's hash among them)."""
    keys = ("candidates", "seeds", "preset", "root_name") + (LOOP_ONLY if method == "loop" else ())
    out = {k: getattr(args, k) for k in keys}
    out["protocol_hash"] = get_protocol(args.preset).hash()
    out["root_source_sha256"] = (
        hashlib.sha256(Path(args.root_source).read_bytes()).hexdigest()
        if args.root_source
        else None
    )
    return out


def run_loop(path: Path, search_seed: int, args) -> dict:
    from engine.archive.store import Archive
    from engine.loop.budget import Budget
    from engine.loop.core import Loop, RunOptions

    archive = Archive.init(
        path, config_toml=loop_config(args), algorithm=root_source(args), root_name=args.root_name
    )
    per_round = args.parents * (args.implement or args.population)
    opts = RunOptions(
        plan={
            "rounds": math.ceil(args.candidates / per_round) + 2,
            "parents": args.parents,
            "population": args.population,
            "implement": args.implement,
            "seeds": args.seeds,
            "proposer": "offline",
            "preset": args.preset,
            "seed": search_seed,
        },
        workers=1,
        budget=Budget(candidates=args.candidates),
    )
    Loop(archive, opts, on_event=lambda e: _event(e, "loop", search_seed)).run()
    return trace(Archive(path), args.root_name, args.preset)


def root_source(args) -> str | None:
    """The root's ``algorithm.py`` (``--root-source``), None for the trainer template's GRPO."""
    return Path(args.root_source).read_text(encoding="utf-8") if args.root_source else None


def _event(e: dict, method: str, s: int) -> None:
    if e.get("kind") in ("evaluated", "stop") or e.get("kind", "").startswith("eval"):
        print(f"  [{method} s{s}] {json.dumps(e, default=str)[:200]}", flush=True)


def run_random(path: Path, search_seed: int, args) -> dict:
    """Random parent (any evaluated node), random component, uniform values; implement, verify,
    evaluate — the same operators the loop uses, without selection or the proposer's model."""
    from engine.archive.store import Archive
    from engine.operators.evaluate import evaluate_node
    from engine.operators.implement import build_source, implement
    from engine.operators.propose import Proposal, archived_code, code_key
    from engine.operators.proposers.codegen import CONTINUOUS, describe, normalize
    from engine.operators.proposers.edit_plan import plan_edit
    from engine.operators.proposers.offline import OfflineProposer, intents_for, mutation_base
    from engine.operators.verify import evaluation_gate, verify_node

    archive = Archive.init(path, algorithm=root_source(args), root_name=args.root_name)
    cfg = archive.config()
    rng = random.Random(1000 + search_seed)
    if evaluation_gate(archive, args.root_name):  # a --root-source of your own: verified first
        verify_node(archive, args.root_name, cfg)
    evaluate_node(archive, args.root_name, seeds=args.seeds, preset=args.preset)
    made = 0
    while made < args.candidates:
        nodes = archive.nodes(f"proxy/{args.preset}")
        pool = sorted(n for n, x in nodes.items() if x.evaluated)
        parent = rng.choice(pool)
        rec = archive.read_file(parent, "records/proposal.json")
        comps = json.loads(rec).get("components") if rec else None
        src = archive.algorithm(parent)
        base = mutation_base(comps, src)

        def sample(name: str) -> float:
            lo, hi, log, _d, _o = CONTINUOUS[name]
            v = math.exp(rng.uniform(math.log(lo), math.log(hi))) if log else rng.uniform(lo, hi)
            return round(v, 4 if v >= 0.01 else 6)

        spec = normalize(OfflineProposer._mutate(base, rng, sample))
        plan = plan_edit(src, base, spec, rendered=bool(comps))
        key = code_key(build_source(src, plan.edit, plan.hyperparameters, plan.drop))
        if key in archived_code(archive):
            continue  # the same rule as the loop's proposer: no evaluation of code already archived
        made += 1
        prop = Proposal(
            name=f"rand-{made:02d}",
            motivation=f"random search from {parent}",
            mechanism=describe(spec),
            expected_effect="random",
            hyperparameters=plan.hyperparameters,
            edit=plan.edit,
            drop_hyperparameters=plan.drop,
            proposer="offline",
            intents=intents_for(spec),
            components=spec,
        )
        node = implement(archive, parent, prop, cfg, name=prop.name)
        if node.status == "verified":
            evaluate_node(archive, node.name, seeds=args.seeds, preset=args.preset)
        n = archive.nodes(f"proxy/{args.preset}")[prop.name]
        print(
            f"  [random s{search_seed}] {made}/{args.candidates} {prop.name} <- {parent}: "
            f"{n.status} {n.overall if n.overall is not None else float('nan'):.3f}",
            flush=True,
        )
    return trace(Archive(path), args.root_name, args.preset)


def figure(results: dict, path: Path, candidates: int) -> None:
    """The best-so-far curves of ``results`` (method -> search seed -> search) as a PNG."""
    labels = {"loop": "closed loop (offline proposer)", "random": "random search"}
    series = [
        (labels[m], [r["curve"] for r in results[m].values() if r.get("curve")])
        for m in labels
        if results.get(m)
    ]
    roots = [
        r["root_overall"] for m in results.values() for r in m.values() if r.get("root_overall")
    ]
    names = [r.get("root", "grpo") for m in results.values() for r in m.values()]
    draw(series, roots[0] if roots else None, path, candidates, names[0] if names else "grpo")


def draw(
    series: list[tuple[str, list[list[float]]]],
    root: float | None,
    path: Path,
    candidates: int,
    root_name: str = "grpo",
) -> None:
    """Best-so-far curves, one colour per labelled method: each search seed thin, their mean bold;
    the root's Overall dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for (label, curves), color in zip(series, colors):
        for c in curves:
            ax.plot(range(1, len(c) + 1), c, color=color, alpha=0.3, lw=1)
        if curves:
            n = min(len(c) for c in curves)
            mean = [sum(c[i] for c in curves) / len(curves) for i in range(n)]
            ax.plot(range(1, n + 1), mean, color=color, lw=2.5, label=f"{label}, mean")
    if root is not None:
        ax.axhline(
            root,
            color="gray",
            ls="--",
            lw=1,
            label="GRPO root" if root_name == "grpo" else f"root ({root_name})",
        )
    ax.set_xlabel("candidates evaluated")
    ax.set_ylabel("best Overall so far (proxy)")
    ax.set_xlim(1, max(candidates, 2))  # one candidate: a point, not an empty range
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def _searches(args, work: Path, results: dict, under_way: list) -> None:
    """Every search of ``args`` into ``results`` (method -> search seed -> search): a finished one
    read from ``work``, the others run and written there as they finish; ``under_way`` names the
    one running."""
    for s in range(args.search_seeds):
        for method in args.methods.split(","):
            path = work / f"{method}-s{s}"
            done = work / f"{method}-s{s}.json"
            if done.is_file() and not args.fresh:  # a finished search of an interrupted benchmark
                res = json.loads(done.read_text())
                earlier, settings = res.get("settings"), search_settings(args, method)
                if earlier is not None and earlier != settings:
                    diff = ", ".join(
                        f"{k} {earlier.get(k)!r} (now {v!r})"
                        for k, v in settings.items()
                        if earlier.get(k) != v
                    )
                    raise SystemExit(
                        f"error: {done} was searched with other settings: {diff}; not combined "
                        "with this run: give another --workdir, or --fresh to search again"
                    )
                res["curve"] = best_so_far(res["candidates"], res["root_overall"])
                results.setdefault(method, {})[s] = res
                print(f"{stamp()} {method} search seed {s}: finished earlier ({done})", flush=True)
                continue
            if path.exists():
                shutil.rmtree(path)
            under_way[:] = [f"{method} search seed {s}"]
            print(f"{stamp()} {method} search seed {s}: searching in {path}", flush=True)
            t = time.monotonic()
            res = (run_loop if method == "loop" else run_random)(path, s, args)
            if res.get("root_overall") is None:  # not recorded as finished: the next run redoes it
                raise SystemExit(
                    f"error: {method} search seed {s}: the root {args.root_name} has no Overall "
                    f"under proxy/{args.preset} (its evaluation failed); see the archive {path}"
                )
            res["wall_s"] = round(time.monotonic() - t, 1)
            res["settings"] = search_settings(args, method)
            done.write_text(json.dumps(res, default=str))
            results.setdefault(method, {})[s] = res
            under_way.clear()
            print(
                f"{stamp()} {method} search seed {s}: best {res.get('best')} "
                f"{res.get('best_overall', float('nan')):.3f} vs root {res['root_overall']:.3f}, "
                f"paired diff {res.get('best_diff', float('nan')):+.3f} "
                f"{res.get('best_diff_interval')}, beats root: {res.get('beats_root')} "
                f"({res['wall_s'] / 60:.1f} min)",
                flush=True,
            )


def _interrupt(signum, _frame) -> None:
    """SIGINT: kill the sandboxed children first (they run in sessions of their own and never see
    the terminal's signal), then unwind."""
    from engine.sandbox.live import kill_all

    kill_all()
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=6, help="paired evaluation seeds per candidate")
    ap.add_argument("--search-seeds", type=int, default=3)
    ap.add_argument("--parents", type=int, default=2, help="loop: parents per round")
    ap.add_argument("--population", type=int, default=2, help="loop: candidates per parent")
    ap.add_argument(
        "--implement",
        type=int,
        default=0,
        help="loop: of the N screened proposals, how many are implemented per parent (0: all N; "
        "1: the paper's highest-ranked one)",
    )
    ap.add_argument(
        "--preset",
        default="default",
        choices=list(PRESETS),
        help="proxy protocol (default: default; tiny and smoke are for tests)",
    )
    ap.add_argument("--methods", default="loop,random", help="comma-separated: loop, random")
    ap.add_argument(
        "--remedies",
        default=None,
        help="loop: the remedies its proposer may direct a diagnosed parent to, comma-separated "
        "([propose].remedies; default all: kl,entropy_control,entropy,clip_higher)",
    )
    ap.add_argument(
        "--directed",
        type=float,
        default=None,
        help="loop: the share of a diagnosed parent's mutations directed to a remedy "
        "([propose].directed; default 0.5, 0 turns the diagnosis off)",
    )
    ap.add_argument(
        "--learned",
        type=float,
        default=None,
        help="loop: the share of mutations that make the move the archive's evidence favours "
        "([propose].learned; default 0, off)",
    )
    ap.add_argument(
        "--explore",
        action="store_true",
        help="loop, with --learned: where no move is favoured with confidence, make the untried "
        "move the prior is least sure of ([propose].explore; default off)",
    )
    ap.add_argument(
        "--min-gain",
        type=float,
        default=None,
        help="loop, with --learned: the expected utility gain a favoured move needs besides its "
        "confidence ([propose].min_gain; default 0)",
    )
    ap.add_argument(
        "--remedy-trials",
        type=int,
        default=None,
        help="loop: the children, judged on the series a remedy is meant to move, after which a "
        "remedy none of them moved is no longer directed to ([propose].remedy_trials; default 2, "
        "0: never, the proposer before remedies were spent)",
    )
    ap.add_argument(
        "--root-source",
        default=None,
        help="the root's algorithm.py (default: the trainer template's GRPO), e.g. a found node's, "
        "to search on from it",
    )
    ap.add_argument(
        "--root-name",
        default="grpo",
        help="the root node's name (default grpo; with --root-source)",
    )
    ap.add_argument(
        "--workdir",
        default=str(ROOT / ".cache" / "discovery"),
        help="the searches' archives and finished-search JSONs (default .cache/discovery); a "
        "finished search there is read, not run again",
    )
    ap.add_argument(
        "--fresh", action="store_true", help="redo searches that finished in an earlier invocation"
    )
    ap.add_argument(
        "--json",
        default=str(ROOT / "benchmarks" / "results" / "discovery.json"),
        help="where the JSON goes (default benchmarks/results/discovery.json, the recorded result)",
    )
    ap.add_argument(
        "--figure",
        default=str(ROOT / "docs" / "figures" / "discovery.png"),
        help="where the figure goes (default docs/figures/discovery.png, the recorded one)",
    )
    args = ap.parse_args()
    bad = [m for m in args.methods.split(",") if m not in ("loop", "random")]
    if bad or not args.methods:
        ap.error(f"--methods: unknown method {', '.join(bad) or '(none)'} (known: loop, random)")
    if min(args.candidates, args.seeds, args.search_seeds, args.parents, args.population) < 1:
        ap.error("--candidates, --seeds, --search-seeds, --parents and --population must be >= 1")
    if args.root_source and not Path(args.root_source).is_file():
        ap.error(f"--root-source: no such file {args.root_source}")
    os.environ.setdefault("POISE_EVAL_CACHE", str(ROOT / ".cache" / "poise-eval"))
    # Ctrl-C stops the run even where this process was started with SIGINT ignored (a background
    # job of a script: Python then leaves it ignored), as the engine's own commands stop
    signal.signal(signal.SIGINT, _interrupt)

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    loads = [load_average()]
    print(
        f"{stamp()} discovery: {args.candidates} candidates x {args.seeds} paired seeds, "
        f"{args.search_seeds} search seeds, methods {args.methods}; load average {loads[0]}",
        flush=True,
    )
    results: dict[str, dict[int, dict]] = {}
    under_way: list[str] = []
    try:
        _searches(args, work, results, under_way)
    except KeyboardInterrupt:
        # a finished search stays in --workdir with its JSON, read (not run again) by the same
        # command; the one under way has none, so that command searches it again from scratch
        total = args.search_seeds * len(args.methods.split(","))
        done = sum(len(runs) for runs in results.values())
        print(
            f"interrupted: {done} of {total} searches finished, kept in {work}"
            + "".join(f"; {u} stopped, to be searched again" for u in under_way)
            + f"; nothing written to {args.json} or {args.figure}; the same command resumes",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(130) from None
    loads.append(load_average())
    print()
    print(
        "| method | search seed | best node | best Overall | root Overall | paired diff | 95% interval | beats root |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for method, runs in results.items():
        for s, r in runs.items():
            iv = r.get("best_diff_interval")
            ivs = f"[{iv[0]:+.3f}, {iv[1]:+.3f}]" if iv else "-"
            print(
                f"| {method} | {s} | {r.get('best')} | {r.get('best_overall', float('nan')):.3f} | "
                f"{r['root_overall']:.3f} | {r.get('best_diff', float('nan')):+.3f} | {ivs} | "
                f"{'yes' if r.get('beats_root') else 'no'} |"
            )
    summary = {method: summarize(runs) for method, runs in results.items()}
    for method, v in summary.items():
        found = sum(1 for r in results[method].values() if r.get("best_overall") is not None)
        print(
            f"{method}: mean best Overall {v['mean_best_overall']:.3f} over {found} search seeds; "
            f"beats the root beyond its interval in {v['beats_root_in']} of {v['search_seeds']}"
        )
    wall = time.monotonic() - t0
    searched = sum(r.get("wall_s", 0.0) for runs in results.values() for r in runs.values())
    print(
        f"wall time {wall / 3600:.2f} h (the searches themselves, this or earlier invocations: "
        f"{searched / 3600:.2f} h); load average at start {loads[0]}, at end {loads[1]}"
    )
    figure(results, Path(args.figure), args.candidates)
    out = write_results(
        args.json,
        args,
        "Overall (fraction); paired differences over seeds 0..seeds-1, 95% Student-t",
        seeds=list(range(args.seeds)),
        results=results,
        summary=summary,
        wall_s=round(wall, 1),
        search_wall_s=round(searched, 1),
        load_average=loads,
    )
    print(f"written {out} and {args.figure}")


if __name__ == "__main__":
    main()
