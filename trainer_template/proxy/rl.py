"""The RL loop: sample G responses per prompt, score them, call the node's ``compute_advantages`` and
``policy_loss``, update with Adam (written out, no weight decay); a frozen copy of the warm start is
the KL reference.

Seeds are paired: seed s fixes the prompt stream and the sampling generator of every step, so two
candidates share the initial checkpoint, the prompts and the sampling noise (until their policies
differ). A candidate that raises, produces NaN/inf or collapses stops the run with ``CandidateFailure``.
With ``RL.tail_average`` = N > 0 a run that completes ends with the mean of its weights after each of
its last N steps (tail averaging), which is what its evaluation scores.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from trainer_template.interface import RolloutBatch, TrainingState, call_policy_loss
from trainer_template.proxy import task
from trainer_template.proxy.model import TinyGPT, generate, response_logprobs
from trainer_template.proxy.protocol import RL, Task

SIGNALS = (
    "train/reward_mean",
    "train/valid_rate",
    "train/correct_rate",
    "train/entropy",
    "train/kl",
    "train/response_length",
    "train/clipfrac",
    "train/ratio_max",
    "train/ratio_min",
    "train/grad_norm",
    "train/adv_mean",
    "train/adv_std",
    "train/adv_min",
    "train/adv_max",
    "train/pg_loss",
)


class Adam:
    """Adam (Kingma & Ba 2015; no weight decay), written out: torch.optim's first use imports
    torch._dynamo, seconds per seed process for a run of about a minute.

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
    """

    def __init__(self, params: list[torch.Tensor], betas=(0.9, 0.999), eps: float = 1e-8):
        self.params = params
        self.b1, self.b2 = betas
        self.eps = eps
        self.t = 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, lr: float) -> None:
        self.t += 1
        c1, c2 = 1 - self.b1**self.t, 1 - self.b2**self.t
        for p, m, v in zip(self.params, self.m, self.v):
            if p.grad is None:
                continue
            m.mul_(self.b1).add_(p.grad, alpha=1 - self.b1)
            v.mul_(self.b2).addcmul_(p.grad, p.grad, value=1 - self.b2)
            p.addcdiv_(m, (v / c2).sqrt_().add_(self.eps), value=-lr / c1)


class CandidateFailure(RuntimeError):
    """The candidate broke the run: an exception, a non-finite value, a bad shape, or a collapse."""


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


def _call(fn: Callable, what: str, step: int, *args, **kwargs) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        raise CandidateFailure(f"{what} raised {type(exc).__name__}: {exc} (step {step})") from exc


def _expand_advantages(adv: Any, b: int, t: int, step: int) -> torch.Tensor:
    if not isinstance(adv, torch.Tensor):
        raise CandidateFailure(
            f"compute_advantages returned {type(adv).__name__}, not a Tensor (step {step})"
        )
    adv = adv.detach().to(torch.float32)
    if tuple(adv.shape) == (b,):  # the interface's [B], as verification and the verl bridge require
        adv = adv[:, None].expand(b, t)
    else:
        raise CandidateFailure(
            f"compute_advantages returned shape {tuple(adv.shape)}, expected [{b}] (step {step})"
        )
    if not _finite(adv):
        raise CandidateFailure(f"compute_advantages produced NaN/inf (step {step})")
    return adv


def prompt_stream(
    rl: RL, seed: int, task_settings: Task | None = None
) -> Iterator[list[task.Problem]]:
    """Each RL step's prompts at ``seed`` (``rl.prompts`` of them, chain lengths P(k) proportional to
    k^-k_power, ``task_settings``'s multiplication rates): the same stream for every mechanism, so
    seeds are paired."""
    tk = task_settings or Task()
    gen = torch.Generator().manual_seed(1_000_003 * (seed + 1))
    weights = task.k_weights(rl.k_power)
    while True:
        ks = task.sample_ks(gen, rl.prompts, weights)
        yield [task.sample_problem(gen, k, tk.mul_rate(task.split_of(k))) for k in ks]


def train(
    model: TinyGPT,
    module: Any,
    cfg: Any,
    rl: RL,
    seed: int,
    *,
    trajectory: dict[str, list],
    on_step: Callable[[int], None] | None = None,
    task_settings: Task | None = None,
) -> TinyGPT:
    """Run ``rl.steps`` RL steps in place on ``model`` (on its device) on ``task_settings``'s prompts
    and response cap (default: the default task); per-step signals are appended to ``trajectory``.
    The rollout's log-probabilities and entropies come from the sampling pass."""
    tk = task_settings or Task()
    dev = next(model.parameters()).device
    torch.manual_seed(seed)
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    opt = Adam(list(model.parameters()))
    warmup = max(1, rl.warmup_steps * rl.minibatches)
    updates = 0
    first: dict[str, float] = {}
    # the mean of the weights after each of the last rl.tail_average steps
    tail: dict[str, torch.Tensor] | None = None
    for step, problems in zip(range(rl.steps), prompt_stream(rl, seed, tk)):
        t0 = time.perf_counter()
        rep_problems = [p for p in problems for _ in range(rl.group)]
        prompts = task.prompts_tensor(problems).repeat_interleave(rl.group, dim=0).to(dev)
        sample_gen = torch.Generator(device=dev).manual_seed(seed * 100_003 + step)
        model.eval()
        responses, old_logp, ent = generate(
            model,
            prompts,
            tk.max_response,
            task.EOS,
            task.PAD,
            temperature=rl.temperature,
            generator=sample_gen,
            return_logprobs=True,
        )
        t = int(task.response_mask(responses).sum(1).max())
        responses, old_logp, ent = responses[:, :t], old_logp[:, :t], ent[:, :t]
        mask = task.response_mask(responses)
        valid, correct, lengths = task.score(responses, rep_problems)
        rewards = correct.to(torch.float32)
        with torch.no_grad():
            ref_logp, _ = response_logprobs(ref, prompts, responses, rl.temperature)
        mf = mask.to(torch.float32)
        seq_entropy = (ent * mf).sum(1) / mf.sum(1).clamp(min=1)
        b = responses.shape[0]
        batch = RolloutBatch(
            rewards=rewards,
            group=torch.arange(rl.prompts, device=dev).repeat_interleave(rl.group),
            valid=valid,
            correct=correct,
            lengths=lengths,
            token_entropy=seq_entropy,
            progress=step / max(1, rl.steps - 1),
        )
        state = TrainingState(
            progress=batch.progress,
            step=step,
            total_steps=rl.steps,
            entropy=float(seq_entropy.mean()),
        )
        adv_raw = _call(module.compute_advantages, "compute_advantages", step, batch, cfg)
        adv = _expand_advantages(adv_raw, b, t, step)
        model.train()
        order = torch.randperm(b, generator=sample_gen, device=dev)
        clipfracs, gnorms, losses, rmax, rmin = [], [], [], [], []
        for mb in order.chunk(rl.minibatches):
            logp, ent_mb = response_logprobs(model, prompts[mb], responses[mb], rl.temperature)
            out = _call(
                call_policy_loss,
                "policy_loss",
                step,
                module.policy_loss,
                logp,
                old_logp[mb],
                adv[mb],
                mask[mb],
                cfg,
                ref_log_prob=ref_logp[mb],
                entropy=ent_mb,
                state=state,
            )
            if not (
                isinstance(out, tuple)
                and len(out) == 2
                and isinstance(out[0], torch.Tensor)
                and out[0].dim() == 0
            ):
                raise CandidateFailure(
                    f"policy_loss must return (scalar Tensor, dict) (step {step})"
                )
            loss, _metrics = out
            if not _finite(loss):
                raise CandidateFailure(f"policy_loss produced NaN/inf (step {step})")
            opt.zero_grad()
            try:
                loss.backward()
            except Exception as exc:
                raise CandidateFailure(
                    f"policy_loss backward failed: {type(exc).__name__}: {exc} (step {step})"
                ) from exc
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), rl.grad_clip)
            if not _finite(gn):
                raise CandidateFailure(f"non-finite gradient norm (step {step})")
            updates += 1
            opt.step(rl.lr * min(1.0, updates / warmup))
            with torch.no_grad():
                # measured by the harness (a candidate's own metrics are not trusted): the fraction of
                # tokens whose ratio left [0.8, 1.2] against their advantage's sign, and the extremes
                ratio = torch.exp((logp.detach() - old_logp[mb]).clamp(-20, 20))
                m = mf[mb]
                lo = adv[mb] < 0
                clipped = torch.where(lo, ratio < 0.8, ratio > 1.2)
                cf = float((clipped.float() * m).sum() / m.sum().clamp(min=1))
                on = m > 0
                if bool(on.any()):
                    rmax.append(float(ratio[on].max()))
                    rmin.append(float(ratio[on].min()))
            clipfracs.append(float(cf))
            gnorms.append(float(gn))
            losses.append(float(loss.detach()))
        if step >= rl.steps - rl.tail_average:
            tail = _tail_mean(tail, model, step - (rl.steps - rl.tail_average) + 1)
        with torch.no_grad():
            kl = float(((old_logp - ref_logp) * mf).sum() / mf.sum().clamp(min=1))
        a = adv[:, 0] if adv_raw.dim() == 1 else (adv * mf).sum(1) / mf.sum(1).clamp(min=1)
        row = {
            "train/reward_mean": float(rewards.mean()),
            "train/valid_rate": float(valid.float().mean()),
            "train/correct_rate": float(correct.float().mean()),
            "train/entropy": float(seq_entropy.mean()),
            "train/kl": kl,
            "train/response_length": float(lengths.float().mean()),
            "train/clipfrac": sum(clipfracs) / len(clipfracs),
            "train/ratio_max": max(rmax, default=1.0),
            "train/ratio_min": min(rmin, default=1.0),
            "train/grad_norm": sum(gnorms) / len(gnorms),
            "train/adv_mean": float(a.mean()),
            "train/adv_std": float(a.std()) if b > 1 else 0.0,
            "train/adv_min": float(a.min()),
            "train/adv_max": float(a.max()),
            "train/pg_loss": sum(losses) / len(losses),
            "train/step_s": time.perf_counter() - t0,
        }
        trajectory.setdefault("step", []).append(step)
        for k, v in row.items():
            trajectory.setdefault(k, []).append(v if math.isfinite(v) else None)
        _check_collapse(trajectory, rl, step, first)
        if on_step:
            on_step(step)
    if tail is not None:
        model.load_state_dict(tail)
    return model


@torch.no_grad()
def _tail_mean(
    mean: dict[str, torch.Tensor] | None, model: TinyGPT, n: int
) -> dict[str, torch.Tensor]:
    """The running mean of ``model``'s weights, ``mean`` over n - 1 steps, updated with the n-th."""
    state = model.state_dict()
    if mean is None:
        return {k: v.detach().clone() for k, v in state.items()}
    for k, v in state.items():
        if v.is_floating_point():
            mean[k] += (v - mean[k]) / n
    return mean


def _check_collapse(traj: dict[str, list], rl: RL, step: int, first: dict[str, float]) -> None:
    """Collapse: the rolling reward or valid rate falls below collapse_ratio x its first-window value."""
    w = rl.collapse_window
    if step + 1 == w:
        for key in ("train/reward_mean", "train/valid_rate"):
            first[key] = sum(traj[key][:w]) / w
    if step + 1 < 2 * w or not first:
        return
    for key, label in (("train/reward_mean", "reward"), ("train/valid_rate", "valid rate")):
        base = first[key]
        now = sum(traj[key][-w:]) / w
        if base >= 0.05 and now < rl.collapse_ratio * base:
            raise CandidateFailure(
                f"collapsed: rolling {label} {now:.3f} fell below {rl.collapse_ratio:g} x its "
                f"initial {base:.3f} (step {step})"
            )
