"""The phenomena the published mechanisms act on exist in the proxy, measured on the shipped warm start:
rare successes on hard prompts, an accuracy-length trade-off the policy controls, format validity as a
learnable failure mode, and entropy that collapses under plain GRPO. Fixed seeds, real RL steps."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainer_template import ALGORITHM_FILE
from trainer_template.loader import load_algorithm, make_config
from trainer_template.proxy import rl, task
from trainer_template.proxy.evalset import pass_at_k
from trainer_template.proxy.model import generate
from trainer_template.proxy.protocol import get_protocol
from trainer_template.proxy.warmstart import ensure_warmstart, load_warmstart


@pytest.fixture(scope="module")
def start():
    torch.set_num_threads(1)
    proto = get_protocol("default")
    return proto, ensure_warmstart(proto)


def style(row: list[int]) -> str:
    """direct | chain | ramble | giveup | cut, read off a sampled response."""
    toks = [t for t in row if t != task.PAD]
    if task.EOS not in toks:
        return "cut"
    body = toks[: toks.index(task.EOS)]
    if not body or body[-1] != task.CLOSE:
        return "giveup"
    if body[0] == task.OPEN:
        return "direct"
    return "ramble" if task.NOOP in body else "chain"


def sample_split(model, split: str, prompts: int, samples: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    lo, hi = task.SPLITS[split]
    problems = [task.sample_problem(gen, lo + i % (hi - lo + 1)) for i in range(prompts)]
    rep = task.prompts_tensor(problems).repeat_interleave(samples, 0)
    out = generate(
        model,
        rep,
        task.MAX_RESPONSE,
        task.EOS,
        task.PAD,
        generator=torch.Generator().manual_seed(1),
    )
    valid, correct, lengths = task.score(out, [p for p in problems for _ in range(samples)])
    return out, valid, correct, lengths


def test_hard_prompts_are_rare_success_and_longer_chains_help(start):
    proto, path = start
    model = load_warmstart(path, proto.warmstart).eval()
    out, valid, correct, lengths = sample_split(model, "hard", 48, 16)
    c = correct.view(48, 16).sum(1).tolist()
    p1 = sum(c) / (48 * 16)
    p8 = sum(pass_at_k(16, x, 8) for x in c) / 48
    assert 0.005 < p1 < 0.10, p1  # a few percent
    assert p8 < 0.7, p8  # well below 1
    styles = [style(r) for r in out.tolist()]
    acc = {
        s: correct[[i for i, x in enumerate(styles) if x == s]].float().mean().item()
        for s in ("direct", "chain")
        if s in styles
    }
    # the written chain is the only way to hard answers: direct answers are guesses
    assert acc["chain"] > acc["direct"] + 0.05, acc
    assert styles.count("direct") > styles.count("chain")  # and the start rarely writes it
    # format failures are real: give-ups and rambles cut off at the response cap
    assert 0.05 < 1 - valid.float().mean().item() < 0.5
    assert "cut" in styles and "giveup" in styles
    assert lengths.float().std() > 3  # the policy's lengths vary within the split


def _mechanism(edit: str | None = None):
    from engine.archive.edit import apply_edit

    src = ALGORITHM_FILE.read_text()
    module = load_algorithm(apply_edit(src, edit) if edit else src, "m")
    return module, make_config(module)


IGNORES_VALIDITY = '''
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """GRPO over the valid samples only; invalid ones get 0 (the format is never taught)."""
    adv = grpo_advantages(batch, cfg)
    return torch.where(batch.valid, adv, torch.zeros_like(adv))
'''
PENALIZES_INVALID = '''
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """GRPO over the valid samples; every invalid one gets -1, in every group."""
    adv = grpo_advantages(batch, cfg)
    return torch.where(batch.valid, adv, torch.full_like(adv, -1.0))
'''


def _train(start, edit, steps: int, lr: float, seed: int = 0):
    proto, path = start
    module, cfg = _mechanism(edit)
    short = dataclasses.replace(proto.rl, steps=steps, lr=lr, warmup_steps=2, prompts=12)
    traj: dict[str, list] = {}
    model = load_warmstart(path, proto.warmstart)
    rl.train(model, module, cfg, short, seed, trajectory=traj)
    return traj, model.eval()


def _late(traj: dict, key: str, n: int = 5) -> float:
    v = traj[key][-n:]
    return sum(v) / len(v)


def test_validity_is_learned_only_by_a_mechanism_that_penalizes_invalid_outputs(start):
    """Invalid outputs concentrate on hard prompts, where most groups have no success: there only a
    mechanism that scores invalid below valid teaches the format (seed 0, 16 steps)."""
    ignore, m_ignore = _train(start, IGNORES_VALIDITY, steps=16, lr=2e-4)
    penal, m_penal = _train(start, PENALIZES_INVALID, steps=16, lr=2e-4)
    assert ignore["train/valid_rate"][0] == penal["train/valid_rate"][0]  # paired: same start
    assert _late(penal, "train/valid_rate") > _late(ignore, "train/valid_rate")
    _, v_ignore, _, _ = sample_split(m_ignore, "hard", 48, 8)
    _, v_penal, _, _ = sample_split(m_penal, "hard", 48, 8)
    invalid_ignore = 1 - v_ignore.float().mean().item()
    invalid_penal = 1 - v_penal.float().mean().item()
    assert invalid_penal < 0.6 * invalid_ignore, (invalid_penal, invalid_ignore)


@pytest.mark.slow  # 30 RL steps (~8 CPU-seconds)
def test_entropy_collapses_under_plain_grpo_at_the_protocol_step_size(start):
    """The per-token entropy GRPO trains with falls to under 40% of the warm start's within 30 steps
    at lr 2e-4 (the default protocol's): the collapse entropy-aware mechanisms act on (seed 0)."""
    grpo, _ = _train(start, None, steps=30, lr=2e-4)
    first = grpo["train/entropy"][0]
    assert first > 0.4, first  # the warm start explores
    assert _late(grpo, "train/entropy") < 0.4 * first, grpo["train/entropy"]
