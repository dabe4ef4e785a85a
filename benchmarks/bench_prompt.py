"""Proposal-prompt size: the LLM proposer's messages for a realistic archive, in tokens, by section.

Builds an archive shaped like a proxy run (root + 6 children + 12 grandchildren, 3 rejected, 1
failed): every evaluated node has the proxy's 18 metrics with 95% intervals and a 150-step
trajectory; its REFLECTION.md is written by the real ``reflect_node`` (metrics table + diagnostics),
plus a 200-word mechanism-level analysis as the LLM reflection would add (the reflect prompt's limit).
Then renders ``proposal_messages`` for the best node as the llm proposer sends them, and prints the
size per section against a reference rendered in the same run: the previous context format (8
metrics, no intervals, reflections cut at 500 characters).

Tokens: ``engine.operators.tokens.count_tokens`` (tiktoken when installed with its encoding cached,
else the documented estimate); characters / 4 is printed next to it as a second, cruder estimate.

    python benchmarks/bench_prompt.py [--budget 12000] [--out prompt.txt]
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.archive.store import Archive  # noqa: E402

SPLITS = ("easy", "medium", "hard")
NARRATIVE = " ".join(
    ["The clipped surrogate kept the update small while the group baseline removed the shared"]
    + ["offset; the length term shortened wrong answers first, which explains the valid-rate dip;"]
    + ["next, scale the penalty by the group's success rate."] * 8
)  # ~200 words, the reflect prompt's limit


def proxy_results(rng: random.Random, level: float):
    """A typed proxy result (``proxy/default`` at the current protocol hash)."""
    from engine.archive.results import EvaluationResult, now
    from engine.operators.evaluate import proxy_protocol
    from engine.stats import tail_means
    from trainer_template.proxy.protocol import get_protocol, metric_unit

    d = _proxy_payload(rng, level)
    return EvaluationResult(
        protocol=proxy_protocol("default", get_protocol("default")),
        status="evaluated",
        metrics=d["metrics"],
        units={k: metric_unit(k) for k in d["metrics"]},
        intervals={k: tuple(v) for k, v in d["intervals"].items()},
        interval_kind="95% Student-t over paired seeds",
        seeds=(0, 1),
        trajectory=d["trajectory"],
        per_seed=tuple(
            {
                "seed": s,
                "status": "evaluated",
                "metrics": {"overall": d["metrics"]["overall"] + rng.uniform(-0.01, 0.01)},
                # each series' last-third mean at this seed, as an evaluation records it
                "trajectory_tail": {
                    k: v * (1 + rng.uniform(-0.05, 0.05))
                    for k, v in tail_means(d["trajectory"]).items()
                },
            }
            for s in (0, 1)
        ),
        recorded_at=now(),
    )


def _proxy_payload(rng: random.Random, level: float) -> dict:
    m, iv = {}, {}
    for s, base in zip(SPLITS, (0.9, 0.5, 0.1)):
        for k, f in (("acc@1", 1.0), ("pass@1", 0.9), ("pass@8", 1.5), ("valid_rate", 1.05)):
            v = min(1.0, max(0.0, base * f * level + rng.uniform(-0.02, 0.02)))
            m[f"{s}/{k}"] = v
            iv[f"{s}/{k}"] = [max(0.0, v - 0.03), min(1.0, v + 0.03)]
        m[f"{s}/mean_length"] = 12 + rng.uniform(-2, 2)
        iv[f"{s}/mean_length"] = [m[f"{s}/mean_length"] - 0.8, m[f"{s}/mean_length"] + 0.8]
    m["valid_rate"] = 0.95
    m["mean_length"] = 12.3
    m["overall"] = 0.3 * m["hard/pass@8"] + 0.2 * m["hard/pass@1"] + 0.1 * m["hard/acc@1"]
    m["overall"] += 0.15 * m["medium/pass@8"] + 0.15 * m["medium/acc@1"] + 0.1 * m["easy/acc@1"]
    for k in ("valid_rate", "mean_length", "overall"):
        iv[k] = [m[k] - 0.01, m[k] + 0.01]
    steps = list(range(0, 150, 5))
    traj = {
        "step": steps,
        "train/reward_mean": [0.2 + 0.002 * s * level for s in steps],
        "train/entropy": [1.4 * (0.99 ** (s / 5)) for s in steps],
        "train/response_length": [14 - 0.01 * s for s in steps],
        "train/kl": [0.001 * (1 + (s == 75) * 20) for s in steps],
    }
    return {
        "status": "evaluated",
        "metrics": m,
        "intervals": iv,
        "trajectory": traj,
        "seeds": [0, 1],
    }


def build(path: Path) -> Archive:
    from engine.config import Config
    from engine.operators.reflect import reflect_node

    rng = random.Random(0)
    arch = Archive.init(path)
    cfg = Config()
    arch.record_result("grpo", proxy_results(rng, 1.0))
    gen1 = [f"g1-{i}-clip-higher-variant" for i in range(6)]
    for i, n in enumerate(gen1):
        arch.spawn("grpo", n, proposal=f"# {n}\n\n## Mechanism\nvariant {i} of the clip")
        arch.record_result(n, proxy_results(rng, 1.0 + 0.02 * i))
    gen2 = []
    for i in range(12):
        parent = gen1[i % 6]
        n = f"g2-{i}-length-shaped-baseline"
        arch.spawn(parent, n, proposal=f"# {n}\n\n## Mechanism\nlength shaping {i}")
        arch.record_result(n, proxy_results(rng, 1.05 + 0.01 * i))
        gen2.append(n)
    for i in range(3):
        arch.spawn(gen1[i], f"bad-{i}")
        arch.set_status(f"bad-{i}", "rejected", "static check: import of 'os' is not allowed")
    arch.spawn(gen1[0], "nan-run")
    arch.set_status("nan-run", "failed", "NaN loss at step 40")
    for n in ["grpo", *gen1, *gen2]:
        text = reflect_node(arch, n, cfg)
        arch.record_reflection(n, text + "\n## Mechanism-level analysis\n\n" + NARRATIVE + "\n")
    return arch


def old_render(ctx) -> str:
    """The previous context format: 8 metrics (alphabetical), no intervals, 500-character
    whitespace-collapsed reflections (the reference)."""

    def node(s) -> str:
        m = ", ".join(f"{k}={v:.4g}" for k, v in sorted(s.metrics.items())[:8]) or "not evaluated"
        u = "—" if s.utility is None else f"{s.utility:.4g}"
        out = f"- {s.name} [{s.status}] U={u}; {m}\n  mechanism: {s.mechanism}"
        if s.reason:
            out += f"\n  rejected/failed because: {s.reason}"
        refl = " ".join(s.reflection.split())[:500]
        return out + (f"\n  reflection: {refl}" if refl else "")

    parts = []
    if ctx.directive:
        parts.append(f"## Research directive\n{ctx.directive}")
    parts.append(f"## Parent node\n{node(ctx.parent)}")
    if ctx.proposal:
        parts.append(f"### Parent's proposal\n{ctx.proposal[:1500]}")
    parts.append(f"### Parent's algorithm.py\n```python\n{ctx.parent_code}\n```")
    for title, tier in (
        ("Pareto-frontier nodes", ctx.frontier),
        ("Complementary nodes (structural contrast)", ctx.complementary),
        ("Exploratory nodes (outside the parent's lineage)", ctx.exploratory),
        ("Rejected or failed nodes (avoid repeating these)", ctx.rejected),
    ):
        if tier:
            parts.append(f"## {title}\n" + "\n".join(node(s) for s in tier))
    if ctx.priors:
        parts.append(
            "## Literature priors\n"
            + "\n\n".join(f"### {p['name']}\n{p['card']}" for p in ctx.priors)
        )
    return "\n\n".join(parts)


TOP = (
    "Research directive",
    "Parent node",
    "Parent's reflection (whole)",
    "Parent's proposal",
    "Parent's algorithm.py",
    "Pareto-frontier nodes",
    "Rejected or failed nodes (avoid repeating these)",
    "Complementary nodes (structural contrast)",
    "Exploratory nodes (outside the parent's lineage)",
    "Literature priors",
    "Task",
)


def sections(text: str) -> list[tuple[str, str]]:
    """The prompt cut at the context's own headings (the system prompt first)."""
    out, title, buf = [], "system prompt", []
    for line in text.splitlines(keepends=True):
        m = re.match(r"^##+ (.*)", line)
        if m and m.group(1).strip() in TOP:
            out.append((title, "".join(buf)))
            title, buf = m.group(1).strip(), []
        buf.append(line)
    out.append((title, "".join(buf)))
    return [(t, b) for t, b in out if b.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--budget", type=int, default=None, help="context token budget (default: poise.toml's)"
    )
    ap.add_argument("--out", type=Path, default=None, help="write the rendered prompt here")
    args = ap.parse_args()
    from engine.operators import tokens
    from engine.operators.context import build_context
    from engine.operators.proposers.llm import proposal_messages
    from engine.select.objective import best_node

    with tempfile.TemporaryDirectory(prefix="poise-bench-prompt-") as tmp:
        t0 = time.perf_counter()
        arch = build(Path(tmp) / "exp")
        cfg = arch.config()
        nodes = arch.nodes()
        parent = best_node(nodes, cfg.experiment)
        t1 = time.perf_counter()
        ctx = build_context(arch, parent, cfg, seed=0, nodes=nodes)
        if args.budget is not None:
            ctx.budget_tokens = args.budget
        msgs = proposal_messages(ctx, parent, 4, seed=0)
        t2 = time.perf_counter()
        full = "\n\n".join(m["content"] for m in msgs)
        old = "\n\n".join([msgs[0]["content"], old_render(ctx)])
        print(f"archive: {len(nodes)} nodes built in {t1 - t0:.1f} s; parent {parent}")
        print(f"context built and rendered in {(t2 - t1) * 1000:.0f} ms")
        print(f"token count: {tokens.method()}")
        n_metrics = len(nodes[parent].metrics)
        shown = len(
            re.findall(r"=\S+ \[", msgs[1]["content"].split("## Parent node")[1].split("\n")[2])
        )
        print(f"parent metrics in the prompt: {shown} of {n_metrics}, each with its interval")
        refl = arch.read_file(parent, "REFLECTION.md").strip()
        print(f"parent reflection in the prompt: whole ({len(refl)} characters) = {refl in full}")
        print(f"budget {ctx.budget_tokens} tokens; trimmed: {'; '.join(ctx.trimmed) or 'nothing'}")
        print()
        print(f"{'section':<52} {'chars':>7} {'tokens':>7} {'chars/4':>8}")
        for title, body in sections(full):
            print(
                f"{title[:52]:<52} {len(body):>7} {tokens.count_tokens(body):>7} {len(body) // 4:>8}"
            )
        print()
        a, b = tokens.count_tokens(full), tokens.count_tokens(old)
        print(f"{'whole prompt (system + user)':<52} {len(full):>7} {a:>7} {len(full) // 4:>8}")
        print(
            f"{'reference: previous format, same archive':<52} {len(old):>7} {b:>7} {len(old) // 4:>8}"
        )
        print(f"ratio new / previous: {a / b:.2f}x tokens")
        if args.out:
            args.out.write_text(full)


if __name__ == "__main__":
    main()
