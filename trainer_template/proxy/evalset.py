"""Held-out evaluation per difficulty split: greedy acc@1, unbiased pass@1/pass@8 (and pass@32 when
the evaluation draws 32 or more samples), length, validity."""

from __future__ import annotations

import torch

from evaluators.metrics import pass_at_k  # unbiased 1 - C(n-c, k) / C(n, k), as a stable product
from trainer_template.proxy import task
from trainer_template.proxy.model import TinyGPT, generate
from trainer_template.proxy.protocol import Eval, Task, overall

PASS_K = (1, 8, 32)
"""pass@k reported per split; pass@32 only where the evaluation draws at least 32 samples"""


def heldout(ev: Eval, task_settings: Task | None = None) -> dict[str, list[task.Problem]]:
    """Fixed held-out prompt sets (k uniform within each split) of ``task_settings``'s task (default:
    the default task), independent of the run's seed."""
    tk = task_settings or Task()
    gen = torch.Generator().manual_seed(ev.seed)
    out = {}
    for name, (lo, hi) in task.SPLITS.items():
        ks = [lo + i % (hi - lo + 1) for i in range(ev.prompts_per_split)]
        out[name] = [task.sample_problem(gen, k, tk.mul_rate(name)) for k in ks]
    return out


@torch.no_grad()
def evaluate(
    model: TinyGPT, ev: Eval, seed: int, task_settings: Task | None = None
) -> dict[str, float]:
    """Scored on ``task_settings``'s held-out prompts with its response cap (default: the default
    task). Metrics ``{split}/acc@1, {split}/pass@1, {split}/pass@8, {split}/valid_rate, {split}/mean_length``,
    plus ``valid_rate``, ``mean_length`` (over all samples) and ``overall``."""
    model.eval()
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(10_000 + seed)
    cap = (task_settings or Task()).max_response
    metrics: dict[str, float] = {}
    all_valid, all_len = [], []
    for name, problems in heldout(ev, task_settings).items():
        prompts = task.prompts_tensor(problems).to(dev)
        greedy = generate(model, prompts, cap, task.EOS, task.PAD, greedy=True)
        _, g_correct, _ = task.score(greedy, problems)
        n = ev.samples
        rep = prompts.repeat_interleave(n, dim=0)
        rep_problems = [p for p in problems for _ in range(n)]
        samples = generate(model, rep, cap, task.EOS, task.PAD, temperature=1.0, generator=gen)
        valid, correct, lengths = task.score(samples, rep_problems)
        c = correct.view(len(problems), n).sum(1).tolist()
        metrics[f"{name}/acc@1"] = float(g_correct.float().mean())
        for k in PASS_K if n >= 32 else PASS_K[:2]:
            metrics[f"{name}/pass@{k}"] = sum(pass_at_k(n, ci, k) for ci in c) / len(c)
        metrics[f"{name}/valid_rate"] = float(valid.float().mean())
        metrics[f"{name}/mean_length"] = float(lengths.float().mean())
        all_valid.append(valid.float())
        all_len.append(lengths.float())
    metrics["valid_rate"] = float(torch.cat(all_valid).mean())
    metrics["mean_length"] = float(torch.cat(all_len).mean())
    metrics["overall"] = overall(metrics)
    return metrics
