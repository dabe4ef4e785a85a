"""Why the same seed run can score differently on another machine: each mechanism's seed, trained and
scored once per set of CPU kernels torch may pick (``ATEN_CPU_CAPABILITY``), side by side.

    nice -n 5 .venv/bin/python benchmarks/bench_cpu_kernels.py [--mechanisms grpo,sa_grpo] [--seed 0] \\
        [--capabilities default,avx2] [--preset default] [--sources DIR] [--json OUT]

Each capability runs in its own process (torch reads the variable at start-up) on the shipped warm
start. It records the policy's logits on the first RL step's sampled responses, a hash of every RL
step's sampled rewards, and the held-out Overall. The parent prints, against the first capability:
the largest logit difference at step 0 (the forward pass itself), the first RL step whose sampled
rewards differ (where the runs part: a sampled token flipped), and each Overall. A capability the CPU
lacks falls back to one it has; the child reports the one torch actually used.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import proxy_runs
from proxy_runs import ROOT, machine_info, write_results


def child(args: argparse.Namespace) -> None:
    """One capability: train the seed, record step 0's logits and every step's rewards, score."""
    import torch

    from trainer_template.proxy import evalset, rl, task
    from trainer_template.proxy.protocol import get_protocol
    from trainer_template.proxy.worker import configured_algorithm, warm_policy

    protocol = get_protocol(args.preset)
    if args.steps:
        protocol = dataclasses.replace(
            protocol, rl=dataclasses.replace(protocol.rl, steps=args.steps)
        )
    model = warm_policy(protocol)
    if args.sources:  # rendered elsewhere (bench_protocol_sweep.py --write-sources DIR)
        source = (Path(args.sources) / f"{args.mechanism}.py").read_text(encoding="utf-8")
    else:
        source = proxy_runs.mechanism_source(args.mechanism)
    module, cfg = configured_algorithm(source, args.mechanism)
    rewards: list[str] = []
    first: dict[str, torch.Tensor] = {}
    advantages = module.compute_advantages

    def recording(batch, c):  # a published mechanism (trusted): wrapped to see what was sampled
        rewards.append(hashlib.sha256(batch.rewards.numpy().tobytes()).hexdigest()[:16])
        return advantages(batch, c)

    module.compute_advantages = recording
    problems = next(rl.prompt_stream(protocol.rl, args.seed, protocol.task))  # RL step 0's
    prompts = task.prompts_tensor(problems)
    with torch.no_grad():
        first["logits"] = model(prompts)
    traj: dict[str, list] = {}
    stopped = ""
    try:
        rl.train(
            model, module, cfg, protocol.rl, args.seed, trajectory=traj, task_settings=protocol.task
        )
    except rl.CandidateFailure as exc:
        stopped = str(exc)
    metrics = evalset.evaluate(model, protocol.eval, args.seed, protocol.task)
    torch.save(first["logits"], args.child_out + ".pt")
    Path(args.child_out).write_text(
        json.dumps(
            {
                "capability": torch.backends.cpu.get_cpu_capability(),
                "rewards": rewards,
                "overall": metrics["overall"],
                "stopped": stopped,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mechanisms", default="grpo,msa_grpo,dace_grpo,sa_grpo,fa_grpo,vm_av_grpo")
    ap.add_argument("--mechanism", default=None, help=argparse.SUPPRESS)  # a child's one
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--preset", default="default")
    ap.add_argument("--steps", type=int, default=0, help="RL steps (default: the preset's)")
    ap.add_argument("--capabilities", default="default,avx2", help="ATEN_CPU_CAPABILITY values")
    ap.add_argument(
        "--json", default=str(ROOT / "benchmarks" / "results" / "cpu-kernels.json"), help="output"
    )
    ap.add_argument("--sources", default=None, help="read DIR/NAME.py instead of rendering priors")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args)
        return
    import torch

    caps = [c.strip() for c in args.capabilities.split(",") if c.strip()]
    if len(caps) < 2:
        raise SystemExit("--capabilities needs at least two values to compare")
    mechs = [m for m in args.mechanisms.split(",") if m]
    unknown = sorted(set(mechs) - set(proxy_runs.PAPER_OVERALL))
    if unknown:
        raise SystemExit(
            f"unknown mechanism(s) {', '.join(unknown)} (known: {', '.join(proxy_runs.PAPER_OVERALL)})"
        )
    rows = []
    t0 = time.monotonic()
    ref = caps[0]
    print(
        f"| mechanism | kernels asked | used | step-0 max logit diff vs {ref} "
        "| first RL step whose rewards differ | Overall |"
    )
    print("|---|---|---|---|---|---|")
    for mech in mechs:
        runs = {}
        with tempfile.TemporaryDirectory() as tmp:
            for cap in caps:
                out = str(Path(tmp) / f"{cap}.json")
                cmd = [sys.executable, __file__, "--child", cap, "--child-out", out]
                cmd += ["--mechanism", mech, "--seed", str(args.seed)]
                cmd += ["--preset", args.preset, "--steps", str(args.steps)]
                cmd += ["--sources", args.sources] if args.sources else []
                env = {**os.environ, "ATEN_CPU_CAPABILITY": cap}
                subprocess.run(cmd, env=env, check=True, cwd=ROOT)
                runs[cap] = json.loads(Path(out).read_text())
                runs[cap]["logits"] = torch.load(out + ".pt")
        for cap in caps:
            r = runs[cap]
            diff = float((r["logits"] - runs[ref]["logits"]).abs().max())
            part = next(
                (i for i, (a, b) in enumerate(zip(r["rewards"], runs[ref]["rewards"])) if a != b),
                None,
            )
            rows.append(
                {
                    "mechanism": mech,
                    "asked": cap,
                    "capability": r["capability"],
                    "max_logit_diff_step0": diff,
                    "first_differing_step": part,
                    "steps": len(r["rewards"]),
                    "overall": r["overall"],
                    "stopped": r["stopped"],
                }
            )
            where = "-" if cap == ref else ("none" if part is None else str(part))
            print(
                f"| {mech} | {cap} | {r['capability']} | {diff:.2e} | {where} | {r['overall']:.4f} |",
                flush=True,
            )
    path = write_results(
        args.json,
        args,
        "logit difference (nats); RL step index; Overall (fraction)",
        runs=rows,
        wall_s=round(time.monotonic() - t0, 1),
        machine=machine_info(),
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
