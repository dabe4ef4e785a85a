"""Every prior's vectorized advantages against a plain loop over groups, written here from the paper's
equations in float64 Python, on random ragged batches with shuffled group ids."""

from __future__ import annotations

import math
import random

import pytest
import torch

from engine.archive.edit import prior_source
from trainer_template.interface import RolloutBatch
from trainer_template.loader import load_algorithm, make_config
from trainer_template.priors import list_priors


def mean(xs):
    return sum(xs) / len(xs) if xs else 0.0


def pstd(xs):
    m = mean(xs)
    return math.sqrt(mean([(x - m) ** 2 for x in xs])) if xs else 0.0


def ustd(xs):
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def by_group(b):
    groups: dict = {}
    for i, g in enumerate(b["group"]):
        groups.setdefault(g, []).append(i)
    return groups.values()


def ref_grpo(b, cfg):
    out = [0.0] * len(b["r"])
    for idx in by_group(b):
        r = [b["r"][i] for i in idx]
        m, s = (0.0, 1.0) if len(idx) == 1 else (mean(r), ustd(r))
        for i in idx:
            out[i] = (b["r"][i] - m) / (s + cfg.eps) if cfg.norm_adv_by_std else b["r"][i] - m
    return out


def ref_rloo(b, cfg):
    out = [0.0] * len(b["r"])
    for idx in by_group(b):
        for i in idx:
            others = [b["r"][j] for j in idx if j != i]
            out[i] = b["r"][i] - (mean(others) if others else 0.0)
    return out


def ref_av(b, cfg):
    out = [0.0] * len(b["r"])
    for idx in by_group(b):
        r = [b["r"][i] for i in idx]
        mu, mu2 = mean(r), mean([x * x for x in r])
        sigma = math.sqrt(max(mu2 - mu * mu, 0.0))
        for i in idx:
            out[i] = (b["r"][i] - mu) / max(sigma, cfg.sigma_min)
    return out


def ref_vm_av(b, cfg):
    out = [0.0] * len(b["r"])
    for idx in by_group(b):
        v = [i for i in idx if b["valid"][i]]
        mu = (sum(b["r"][i] for i in v) + cfg.alpha) / (len(v) + cfg.alpha + cfg.beta)
        sigma = math.sqrt(max(mu * (1 - mu), 0.0))
        mean_len = max(mean([b["len"][i] for i in v]), 1.0)
        for i in idx:
            if not b["valid"][i]:
                out[i] = cfg.invalid_advantage
                continue
            a = (b["r"][i] - mu) / max(sigma, cfg.sigma_floor)
            if a < 0:
                a /= min(max(b["len"][i] / mean_len, cfg.len_ratio_min), cfg.len_ratio_max)
            out[i] = a
    return out


def ref_msa(b, cfg):
    out = [0.0] * len(b["r"])
    for idx in by_group(b):
        r = [b["r"][i] for i in idx]
        c = [1.0 if b["correct"][i] else 0.0 for i in idx]
        s_out, s_tot = pstd(c), pstd(r)
        anchor = s_out if s_out > cfg.eps else (s_tot if s_tot > cfg.eps else 0.0)
        mixed = 0 < sum(c) < len(c)
        lens = [max(b["len"][i], 1) for i in idx]
        for k, i in enumerate(idx):
            a = (r[k] - mean(r)) / anchor if anchor > 0 else 0.0
            a = a if mixed else cfg.alpha_uniform * a
            ratio = lens[k] / mean(lens)
            out[i] = a * ratio**cfg.length_lambda if a > 0 else a * ratio ** (-cfg.length_lambda)
    return out


def ref_fa(b, cfg):
    out = [0.0] * len(b["r"])
    for idx in by_group(b):
        r = [b["r"][i] for i in idx]
        for i in idx:
            if max(r) > 0:
                z = (b["r"][i] - mean(r)) / (pstd(r) + cfg.eps)
                out[i] = min(max(z, -cfg.adv_clip), cfg.adv_clip)
            else:
                out[i] = cfg.wrong_penalty if b["valid"][i] else cfg.invalid_penalty
    return out


def ref_bn(b, cfg):
    raw = [0.0] * len(b["r"])
    for idx in by_group(b):
        m = mean([b["r"][i] for i in idx])
        for i in idx:
            raw[i] = b["r"][i] - m
    sigma = math.sqrt(mean([a * a for a in raw]))
    return [min(max(a / (sigma + cfg.eps), -cfg.adv_clip), cfg.adv_clip) for a in raw]


def ref_sa(b, cfg):
    out = [0.0] * len(b["r"])
    mu_batch = mean(b["r"])
    for idx in by_group(b):
        anchor = cfg.anchor_weight * mean([b["r"][i] for i in idx])
        anchor += (1 - cfg.anchor_weight) * mu_batch
        for i in idx:
            out[i] = (b["r"][i] - anchor) / cfg.fixed_scale
    return out


def ref_dfr(b, cfg):
    out = [0.0] * len(b["r"])
    for idx in by_group(b):
        v = [1.0 if b["valid"][i] else 0.0 for i in idx]
        valid = [i for i in idx if b["valid"][i]]
        c = {i: 1.0 if (b["correct"][i] and b["valid"][i]) else 0.0 for i in idx}
        cv, hv = [c[i] for i in valid], [b["ent"][i] for i in valid]
        for k, i in enumerate(idx):
            fmt = (v[k] - mean(v)) / (pstd(v) + cfg.eps)
            if not b["valid"][i]:
                reason = 0.0
            elif sum(c.values()) > 0:
                reason = (c[i] - mean(cv)) / (pstd(cv) + cfg.eps)
            else:
                reason = cfg.fail_entropy_weight * (b["ent"][i] - mean(hv)) / (pstd(hv) + cfg.eps)
            out[i] = reason + cfg.format_weight * fmt
    return out


def ref_dace(b, cfg):
    acc = ref_grpo(b, cfg)
    out = [0.0] * len(b["r"])
    for idx in by_group(b):
        pass_rate = mean([1.0 if b["r"][i] > 0.5 else 0.0 for i in idx])
        cl = [b["len"][i] for i in idx if b["correct"][i]]
        for i in idx:
            eff = 0.0
            if b["correct"][i] and len(cl) >= 2:
                eff = (mean(cl) - b["len"][i]) / (pstd(cl) + cfg.eps)
            out[i] = acc[i] * (1 + cfg.alpha * (1 - pass_rate)) + cfg.beta * eff * pass_rate
    return out


def ref_cag(b, cfg):
    acc = ref_grpo(b, cfg)
    out = list(acc)
    for idx in by_group(b):
        sr = mean([1.0 if b["correct"][i] else 0.0 for i in idx])
        cl = [b["len"][i] for i in idx if b["correct"][i]]
        for i in idx:
            if b["correct"][i]:
                mu_l = max(mean(cl), 1.0)
                out[i] += cfg.beta_base * sr**2 * min((mu_l - b["len"][i]) / mu_l, 0.0)
    return out


def ref_dcbe(b, cfg):
    acc = ref_grpo(b, cfg)
    out = list(acc)
    for idx in by_group(b):
        alpha_diff = mean([1.0 if b["correct"][i] else 0.0 for i in idx]) ** 2
        cl = [b["len"][i] for i in idx if b["correct"][i]]
        for i in idx:
            if b["correct"][i]:
                rli = (mean(cl) - b["len"][i]) / (mean(cl) + cfg.eps)
                out[i] += cfg.length_coef * alpha_diff * rli
    return out


REFERENCES = {
    "grpo": ref_grpo,
    "dr_grpo": ref_grpo,
    "dapo": ref_grpo,
    "rloo": ref_rloo,
    "av_grpo": ref_av,
    "vm_av_grpo": ref_vm_av,
    "msa_grpo": ref_msa,
    "fa_grpo": ref_fa,
    "bn_grpo": ref_bn,
    "sa_grpo": ref_sa,
    "dfr_grpo": ref_dfr,
    "dace_grpo": ref_dace,
    "cag_grpo": ref_cag,
    "dcbe_grpo": ref_dcbe,
}


def random_batch(seed: int, graded: bool):
    """Groups of 1-10 members under shuffled large ids; valid ~80%, binary or graded rewards."""
    rng = random.Random(seed)
    sizes = [rng.choice([1, 2, 3, 5, 8, 8, 10]) for _ in range(rng.randint(3, 9))]
    ids = rng.sample(range(10_000), len(sizes))
    group = [ids[k] for k, s in enumerate(sizes) for _ in range(s)]
    n = len(group)
    valid = [rng.random() < 0.8 for _ in range(n)]
    correct = [v and rng.random() < rng.choice([0.1, 0.5, 0.9]) for v in valid]
    r = [
        (0.5 + 0.5 * rng.random() if c else 0.4 * rng.random()) if graded else float(c)
        for c in correct
    ]
    lengths = [rng.randint(1, 400) for _ in range(n)]
    ent = [0.05 + rng.random() for _ in range(n)]
    perm = list(range(n))
    rng.shuffle(perm)
    cols = {"r": r, "group": group, "valid": valid, "correct": correct, "len": lengths, "ent": ent}
    return {k: [v[i] for i in perm] for k, v in cols.items()}


def to_batch(b) -> RolloutBatch:
    return RolloutBatch(
        rewards=torch.tensor(b["r"], dtype=torch.float32),
        group=torch.tensor(b["group"]),
        valid=torch.tensor(b["valid"]),
        correct=torch.tensor(b["correct"]),
        lengths=torch.tensor(b["len"]),
        token_entropy=torch.tensor(b["ent"], dtype=torch.float32),
    )


@pytest.fixture(scope="module")
def modules():
    return {n: load_algorithm(prior_source(n), n) for n in list_priors()}


def test_every_prior_has_a_reference():
    assert set(REFERENCES) == set(list_priors())


@pytest.mark.parametrize("name", list_priors())
@pytest.mark.parametrize("graded", [False, True], ids=["binary", "graded"])
def test_vectorized_equals_loop_over_groups(modules, name, graded):
    mod = modules[name]
    cfg = make_config(mod)
    for seed in range(12):
        b = random_batch(seed, graded)
        ours = mod.compute_advantages(to_batch(b), cfg).tolist()
        ref = REFERENCES[name](b, cfg)
        for i, (x, y) in enumerate(zip(ours, ref)):
            assert math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-4), (name, seed, i, x, y)


def degenerate_batch():
    """Legal but degenerate groups in one batch, shuffled ids: zero-length responses (correct and
    wrong), a correct subset of only zero-length answers, equal lengths, an all-invalid group, an
    all-correct group, all-wrong valid, a singleton success and a singleton failure."""
    groups = [
        # (rewards, valid, lengths)
        ([1, 1, 0, 0], [1, 1, 1, 1], [0, 4, 0, 8]),
        ([1, 1, 0], [1, 1, 1], [0, 0, 5]),
        ([1, 0, 1, 0], [1, 1, 1, 1], [7, 7, 7, 7]),
        ([0, 0, 0], [0, 0, 0], [3, 0, 9]),
        ([1, 1, 1], [1, 1, 1], [2, 6, 10]),
        ([0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 2, 6]),
        ([1], [1], [0]),
        ([0], [1], [5]),
    ]
    ids = [41, -3, 7, 1000, 0, 12, 5, 99]
    b = {"r": [], "group": [], "valid": [], "correct": [], "len": [], "ent": []}
    for gid, (r, v, ln) in zip(ids, groups):
        for k, (ri, vi, li) in enumerate(zip(r, v, ln)):
            b["r"].append(float(ri))
            b["group"].append(gid)
            b["valid"].append(bool(vi))
            b["correct"].append(bool(ri))
            b["len"].append(li)
            b["ent"].append(0.1 + 0.2 * k)
    perm = random.Random(5).sample(range(len(b["r"])), len(b["r"]))
    return {k: [v[i] for i in perm] for k, v in b.items()}


@pytest.mark.parametrize("name", list_priors())
def test_degenerate_groups_equal_the_loop_and_stay_finite(modules, name):
    """Every prior on the degenerate batch equals the loop written from the paper (with the floors the
    cards declare), is finite, leaves its input unchanged and is the same in float64."""
    mod = modules[name]
    cfg = make_config(mod)
    b = degenerate_batch()
    batch = to_batch(b)
    before = {k: v.clone() for k, v in vars(batch).items() if isinstance(v, torch.Tensor)}
    adv = mod.compute_advantages(batch, cfg)
    assert torch.isfinite(adv).all(), adv.tolist()
    for k, v in before.items():
        assert torch.equal(getattr(batch, k), v), f"{name} mutated batch.{k}"
    ref = REFERENCES[name](b, cfg)
    for i, (x, y) in enumerate(zip(adv.tolist(), ref)):
        assert math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-4), (name, i, x, y)
    wide = to_batch(b)
    wide.rewards, wide.token_entropy = wide.rewards.double(), wide.token_entropy.double()
    assert torch.allclose(mod.compute_advantages(wide, cfg).double(), adv.double(), atol=1e-5)
