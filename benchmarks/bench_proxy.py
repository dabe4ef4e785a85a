"""Benchmark of the embedded CPU proxy (run: ``nice .venv/bin/python benchmarks/bench_proxy.py``).

Prints four figures, each against a reference measured in the same run:
1. time and peak RSS of one seed of one candidate (RL + evaluation), targets <= 120 s and <= 1 GiB;
2. regressions flagged with one seed: sign-flipped advantages and a sign bug on invalid samples only,
   against GRPO at the same seed;
3. paired-seed noise of Overall and the minimum detectable difference at 6 paired seeds (target 0.03);
4. the published mechanisms (trainer_template.priors) ranked by Overall with 95% intervals.

Figure 4 also has the warm start alone (no RL, evaluated at each seed) and GRPO's paired gain over it.

Options: ``--seeds N`` (paired seeds for 4, default 3), ``--noise-seeds M`` (paired seeds of GRPO and
Dr.GRPO for 3, default N), ``--preset``, ``--parallel P``,
``--only grpo,dr_grpo`` (a subset of the ranking; GRPO, the reference, always runs),
``--no-regressions`` (skip figure 2), ``--json OUT``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxy_runs import fmt_iv, run_seed  # noqa: E402

from engine.sandbox.process import child_env, run_limited  # noqa: E402
from engine.stats import mean_interval, t95  # noqa: E402
from trainer_template import ALGORITHM_FILE  # noqa: E402

RANKED = [
    ("grpo", {}),
    ("dr_grpo", {}),
    ("rloo", {}),
    ("av_grpo", {"sigma_min": 0.4}),
    ("vm_av_grpo", {}),
    ("fa_grpo", {}),
    ("bn_grpo", {}),
    ("sa_grpo", {}),
]

SIGN_FLIP = '''
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """GRPO with the sign flipped (a deliberate regression)."""
    scores = batch.rewards.to(torch.float32)
    stats = group_stats(scores, batch.group)
    std = torch.where(stats.count < 2, torch.ones_like(scores), stats.unbiased_std())
    return -(scores - stats.mean) / (std + cfg.eps)
'''

INVALID_SIGN = '''
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """GRPO whose advantage has the wrong sign on format-invalid samples only (a subtle regression)."""
    scores = batch.rewards.to(torch.float32)
    stats = group_stats(scores, batch.group)
    std = torch.where(stats.count < 2, torch.ones_like(scores), stats.unbiased_std())
    adv = (scores - stats.mean) / (std + cfg.eps)
    return torch.where(batch.valid, adv, -adv)
'''


def prior(name: str) -> str:
    from engine.archive.edit import prior_source

    return prior_source(name)


def edited(edit: str) -> str:
    from engine.archive.edit import apply_edit

    return apply_edit(ALGORITHM_FILE.read_text(), edit)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--noise-seeds",
        type=int,
        default=0,
        help="seeds of GRPO and Dr.GRPO for figure 3 (default: --seeds)",
    )
    ap.add_argument("--preset", default="default")
    ap.add_argument("--parallel", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--only", default="")
    ap.add_argument("--json", default="")
    ap.add_argument(
        "--no-regressions", action="store_true", help="skip figure 2 (the two deliberate bugs)"
    )
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    ranked = [(n, o) for n, o in RANKED if not only or n in only]
    if not any(n == "grpo" for n, _ in ranked):
        ranked.insert(0, ("grpo", {}))
    t0 = time.monotonic()
    from trainer_template.proxy.protocol import get_protocol

    proto = get_protocol(args.preset)
    ws = run_limited(
        [
            sys.executable,
            "-m",
            "trainer_template.proxy.worker",
            "warmstart",
            "--preset",
            args.preset,
        ],
        timeout_s=3600,
        env=child_env(),
    )
    if not ws.ok:
        sys.exit(f"warm start failed: {ws.reason()}")
    print(
        f"preset {args.preset} ({proto.hash()[:19]}), warm start ready in {ws.wall_s:.1f} s "
        f"(cached: {ws.wall_s < 20}); {args.seeds} paired seeds, {args.parallel} parallel processes",
        flush=True,
    )
    noise_seeds = max(args.seeds, args.noise_seeds)
    per = {n: noise_seeds if n in ("grpo", "dr_grpo") else args.seeds for n, _ in ranked}
    jobs = [(f"{n}", prior(n), s, o) for n, o in ranked for s in range(per[n])]
    if not args.no_regressions:
        jobs += [
            ("sign_flip", edited(SIGN_FLIP), 0, None),
            ("invalid_sign", edited(INVALID_SIGN), 0, None),
        ]
    phash = proto.hash()
    with ThreadPoolExecutor(args.parallel) as pool:  # fresh runs: figure 1 times one, uncached
        runs = list(
            pool.map(
                lambda j: run_seed(
                    j[0], j[1], j[2], args.preset, phash, overrides=j[3], use_cache=False
                ),
                jobs,
            )
        )
    by = {}
    for r in runs:
        by.setdefault(r["label"], {})[r["seed"]] = r
    ov = lambda r: r.get("metrics", {}).get("overall", float("nan"))  # noqa: E731

    print("\n1. one seed of one candidate (GRPO, seed 0: RL + evaluation)")
    g0 = by["grpo"][0]
    tm = g0.get("timings", {})
    steps = proto.rl.steps
    print(
        f"   wall {g0['wall_s']:.1f} s (target <= 120 s; ratio {g0['wall_s'] / 120:.2f}), RL {tm.get('rl_s', 0):.1f} s "
        f"= {tm.get('rl_s', 0) / steps:.3f} s/step, evaluation {tm.get('eval_s', 0):.1f} s, "
        f"load {tm.get('load_s', 0):.1f} s"
    )
    print(
        f"   peak RSS {g0.get('peak_rss_mb', 0):.0f} MiB "
        f"(target <= 1024 MiB; ratio {g0.get('peak_rss_mb', 0) / 1024:.2f})"
    )

    print(f"\n2. regressions with one seed (seed 0, reference GRPO seed 0 overall {ov(g0):.3f})")
    for lab in () if args.no_regressions else ("sign_flip", "invalid_sign"):
        r = by[lab][0]
        delta = ov(r) - ov(g0) if r.get("metrics") else float("nan")
        flagged = r["status"] != "ok" or (delta == delta and delta < -0.05)
        print(
            f"   {lab:>13}: {r['status']:6} overall {ov(r):.3f} (delta {delta:+.3f}) -> "
            f"{'FLAGGED' if flagged else 'not flagged'}  {r.get('reason', '')}"
        )

    print("\n3. paired-seed noise of Overall")
    gs = [ov(by["grpo"][s]) for s in range(noise_seeds)]
    sd_seed = statistics_sd(gs)
    print(
        f"   GRPO overall by seed: {', '.join(f'{v:.3f}' for v in gs)}; seed-to-seed SD {sd_seed:.4f}"
    )
    if "dr_grpo" in by:
        d = [ov(by["dr_grpo"][s]) - ov(by["grpo"][s]) for s in range(noise_seeds)]
        sd_d = statistics_sd(d)
        mdd = (t95(5) + 0.920) * sd_d / math.sqrt(6)
        print(
            f"   paired differences Dr.GRPO - GRPO: {', '.join(f'{v:+.3f}' for v in d)}; SD {sd_d:.4f} "
            f"(unpaired SD of a difference would be {sd_seed * math.sqrt(2):.4f})"
        )
        print(
            f"   minimum detectable difference at 6 paired seeds (5% two-sided, 80% power): {mdd:.4f} "
            f"(target <= 0.03; ratio {mdd / 0.03:.2f}); unpaired: {(t95(10) + 0.879) * sd_seed * math.sqrt(2 / 6):.4f}"
        )

    print(
        f"\n4. published mechanisms on the proxy ({args.seeds} paired seeds: mean overall, 95% interval, hard/pass@8, "
        "valid rate)"
    )
    base = warmstart_alone(proto, args.seeds)
    m, iv = mean_interval([b["overall"] for b in base])
    gain = [ov(by["grpo"][s]) - base[s]["overall"] for s in range(args.seeds)]
    gm, giv = mean_interval(gain)
    print(
        f"   warm start alone (no RL): overall {m:.3f} {fmt_iv(iv)}; GRPO's paired gain over it "
        f"{gm:+.3f} {fmt_iv(giv, signed=True)}"
    )
    rows = [
        (
            "warm start (no RL)",
            m,
            iv,
            sum(b["hard/pass@8"] for b in base) / len(base),
            sum(b["valid_rate"] for b in base) / len(base),
            0,
        )
    ]
    for n, _ in ranked:
        rs = [by[n][s] for s in range(args.seeds) if by[n][s].get("metrics")]
        fails = sum(1 for s in range(args.seeds) if by[n][s]["status"] != "ok")
        if not rs:
            rows.append((n, float("nan"), None, float("nan"), float("nan"), fails))
            continue
        m, iv = mean_interval([ov(r) for r in rs])
        rows.append(
            (
                n,
                m,
                iv,
                sum(r["metrics"]["hard/pass@8"] for r in rs) / len(rs),
                sum(r["metrics"]["valid_rate"] for r in rs) / len(rs),
                fails,
            )
        )
    rows.sort(key=lambda r: -r[1] if r[1] == r[1] else 1)
    print(
        "   | rank | mechanism | Overall | 95% interval | hard/pass@8 | valid rate | failed seeds |"
    )
    print("   |---|---|---|---|---|---|---|")
    for i, (n, m, iv, hp, vr, f) in enumerate(rows, 1):
        ivs = fmt_iv(iv)
        print(f"   | {i} | {n} | {m:.3f} | {ivs} | {hp:.3f} | {vr:.3f} | {f} |")
    print(
        f"\ntotal wall time {time.monotonic() - t0:.0f} s (machine shared: timings are inflated by other load)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(runs, default=str, indent=1))


def warmstart_alone(proto, seeds: int) -> list[dict]:
    """The warm start's metrics without RL, with each seed's evaluation sampling noise."""
    import torch

    from trainer_template.proxy import evalset
    from trainer_template.proxy.warmstart import ensure_warmstart, load_warmstart

    torch.set_num_threads(1)
    model = load_warmstart(ensure_warmstart(proto), proto.warmstart)
    return [evalset.evaluate(model, proto.eval, s, proto.task) for s in range(seeds)]


def statistics_sd(vals: list[float]) -> float:
    vals = [v for v in vals if v == v]
    if len(vals) < 2:
        return float("nan")
    m = sum(vals) / len(vals)
    return math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))


if __name__ == "__main__":
    main()
