"""How sure a warm start is of the steps of a written chain: the teacher-forced probability of each
running result's digits, by split and operation (+/- or *), for the preset's warm start and for
protocol-sweep variants that build their own.

    .venv/bin/python benchmarks/bench_step_confidence.py [--variant NAME:warmstart.FIELD=VALUE,...] \\
        [--preset default] [--chains 200] [--json OUT]

A variant is written as for ``bench_protocol_sweep.py``; its warm start is built in the warm-start
cache when missing (minutes) and pinned by its content hash. For every chain length k = 1..8 the
benchmark draws ``--chains`` problems (a fixed generator), feeds the written chain of running results
after the prompt, and reads the probability the policy gives each gold digit. The first digit of the
first result is left out: it also decides the response's style (a chain or a direct answer). It also
scores each warm start before RL with the preset's held-out evaluation at seed 0.

Why it matters: GRPO's gradient on a token is (1 - p) times its advantage in size, so when a failed
chain is pushed down, the steps the policy is unsure of take the push. The column "share of the push
on hard +/- steps" is the part of the summed (1 - p) over a hard chain's digits that falls on its
additions and subtractions, which succeeding and failing chains share, rather than on its
multiplications, where hard chains fail.
"""

from __future__ import annotations

import argparse

import torch
from bench_protocol_sweep import parse_variant, pin_warmstart, variant_protocol
from proxy_runs import write_results


def step_confidence(model, chains: int, seed: int = 5) -> dict[str, dict[str, float]]:
    """{"<split>/<op>": {n, mean_p, below_0_9, mean_miss}} over teacher-forced written chains."""
    from trainer_template.proxy import task

    gen = torch.Generator().manual_seed(seed)
    probs: dict[str, list[float]] = {}
    for k in range(1, task.MAX_K + 1):
        problems = [task.sample_problem(gen, k) for _ in range(chains)]
        seqs = torch.tensor([task.encode_prompt(p) + task.encode_response(p) for p in problems])
        with torch.no_grad():
            logp = torch.log_softmax(model(seqs[:, :-1]), -1)
        gold = logp.gather(2, seqs[:, 1:, None])[..., 0].exp()  # p of each next token
        for i, p in enumerate(problems):
            for j, (sign, _) in enumerate(p.ops):
                key = f"{task.split_of(k)}/{'*' if sign == task.MUL else '+-'}"
                for t in (1,) if j == 0 else (0, 1):  # digit t of running result j
                    pos = task.PROMPT_LEN + 3 * j + t  # index in seqs; predicted at pos - 1
                    probs.setdefault(key, []).append(float(gold[i, pos - 1]))
    out = {}
    for key in sorted(probs):
        v = torch.tensor(probs[key])
        out[key] = {
            "n": len(v),
            "mean_p": float(v.mean()),
            "below_0_9": float((v < 0.9).float().mean()),
            "mean_miss": float((1 - v).mean()),
        }
    return out


def push_share(conf: dict[str, dict[str, float]]) -> float | None:
    """The share of a hard chain's summed (1 - p) on its +/- digits."""
    pm, mul = conf.get("hard/+-"), conf.get("hard/*")
    if not pm or not mul:
        return None
    a, b = pm["n"] * pm["mean_miss"], mul["n"] * mul["mean_miss"]
    return a / (a + b)


def main() -> None:
    from trainer_template.proxy import evalset
    from trainer_template.proxy.protocol import get_protocol
    from trainer_template.proxy.worker import warm_policy

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--variant", action="append", default=[], help="NAME:FIELD=VALUE,...")
    ap.add_argument("--preset", default="default")
    ap.add_argument("--chains", type=int, default=200, help="problems per chain length")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    base = get_protocol(args.preset)
    try:
        variants = dict(parse_variant(v, base) for v in [f"{args.preset}:", *args.variant])
    except (ValueError, TypeError) as exc:
        raise SystemExit(str(exc)) from None
    results = {}
    print("| warm start | split / steps | digits | mean p | p < 0.9 | mean 1 - p |")
    print("|---|---|---|---|---|---|")
    for name, changes in variants.items():
        proto = pin_warmstart(variant_protocol(base, changes), build=True, log=print)
        model = warm_policy(proto, device="cpu")
        model.eval()
        conf = step_confidence(model, args.chains)
        before = evalset.evaluate(model, proto.eval, 0, proto.task)
        results[name] = {
            "changes": changes,
            "warmstart_sha256": proto.warmstart_sha256,
            "steps": conf,
            "hard_push_share_pm": push_share(conf),
            "before_rl": before,
        }
        for key, c in conf.items():
            print(
                f"| {name} | {key} | {c['n']} | {c['mean_p']:.3f} | {c['below_0_9']:.3f} | "
                f"{c['mean_miss']:.3f} |"
            )
    print()
    for name, r in results.items():
        share, b = r["hard_push_share_pm"], r["before_rl"]
        print(
            f"{name}: share of the push on hard +/- steps "
            f"{'-' if share is None else f'{share:.2f}'}; before RL Overall {b['overall']:.3f}, "
            f"hard pass@1 {b['hard/pass@1']:.3f}, pass@8 {b['hard/pass@8']:.3f}, "
            f"valid {b['hard/valid_rate']:.3f}"
        )
    if args.json:
        path = write_results(args.json, args, "probability (fraction)", variants=results)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
