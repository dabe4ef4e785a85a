"""The published mechanisms: hand-computed cases from each card's equations, and the protocol for all."""

from __future__ import annotations

import math

import pytest
import torch

from trainer_template.interface import RolloutBatch
from trainer_template.loader import load_algorithm, make_config
from trainer_template.priors import _build_registry, list_priors, prior_card, prior_source

G8 = 8
S_UNB = math.sqrt(1 / 8)  # unbiased std of one success in eight
S_POP = math.sqrt(7 / 64)  # population std = sqrt(mu (1 - mu)) at mu = 1/8


def batch(
    rewards, valid=None, lengths=None, group=None, correct=None, entropy=None
) -> RolloutBatch:
    r = torch.tensor(rewards, dtype=torch.float32)
    n = r.numel()
    return RolloutBatch(
        rewards=r,
        group=torch.tensor(group if group is not None else [0] * n),
        valid=torch.tensor(valid if valid is not None else [True] * n),
        correct=torch.tensor(correct) if correct is not None else r > 0.5,
        lengths=torch.tensor(lengths if lengths is not None else [10] * n),
        token_entropy=None if entropy is None else torch.tensor(entropy, dtype=torch.float32),
    )


LENS = list(range(10, 18))  # mean 13.5
ALL_CORRECT = dict(rewards=[1.0] * 8, lengths=LENS)
ALL_WRONG = dict(rewards=[0.0] * 8, lengths=LENS)
ONE_IN_8 = dict(rewards=[1.0] + [0.0] * 7)
INVALID = dict(rewards=[1.0] + [0.0] * 7, valid=[True] * 6 + [False] * 2)
SINGLETONS = dict(rewards=[1.0, 0.0], group=[0, 1])
TWO_CORRECT = dict(rewards=[1.0, 1.0] + [0.0] * 6, lengths=[10, 30] + [20] * 6)
MIXED_BATCH = dict(rewards=[1.0] + [0.0] * 7 + [1.0] * 8, group=[0] * 8 + [1] * 8)

z_s, z_f = (7 / 8) / (S_UNB + 1e-6), -(1 / 8) / (S_UNB + 1e-6)  # GRPO one in eight
s2 = math.sqrt(8 / 7 * 0.1875)  # unbiased std of two successes in eight
z2_s, z2_f = 0.75 / s2, -0.25 / s2
rho = [n / 13.5 for n in LENS]

CASES = [
    # (prior, batch, cfg overrides, expected advantages)
    ("grpo", ALL_CORRECT, {}, [0.0] * 8),
    ("grpo", ALL_WRONG, {}, [0.0] * 8),
    ("grpo", ONE_IN_8, {}, [z_s] + [z_f] * 7),
    ("grpo", INVALID, {}, [z_s] + [z_f] * 7),  # validity is ignored
    ("grpo", SINGLETONS, {}, [1.0, 0.0]),
    ("dapo", ONE_IN_8, {}, [z_s] + [z_f] * 7),
    ("dr_grpo", ONE_IN_8, {}, [0.875] + [-0.125] * 7),
    ("dr_grpo", ALL_CORRECT, {}, [0.0] * 8),
    ("dr_grpo", SINGLETONS, {}, [1.0, 0.0]),
    ("rloo", ONE_IN_8, {}, [1.0] + [-1 / 7] * 7),
    ("rloo", ALL_WRONG, {}, [0.0] * 8),
    ("rloo", SINGLETONS, {}, [1.0, 0.0]),
    ("av_grpo", ONE_IN_8, {}, [0.875 / S_POP] + [-0.125 / S_POP] * 7),
    (
        "av_grpo",
        ONE_IN_8,
        {"sigma_min": 0.5},
        [1.75] + [-0.25] * 7,
    ),  # the floor is active above 0.33
    ("av_grpo", ALL_CORRECT, {}, [0.0] * 8),
    ("av_grpo", SINGLETONS, {}, [0.0, 0.0]),
    ("av_grpo", ALL_WRONG, {}, [0.0] * 8),  # mu = 0: scale is the floor, numerator 0
    ("av_grpo", INVALID, {}, [0.875 / S_POP] + [-0.125 / S_POP] * 7),  # validity is ignored
    ("vm_av_grpo", ALL_CORRECT, {}, [0.1 / 0.3] * 8),
    ("vm_av_grpo", ALL_WRONG, {}, [-0.1 / 0.3 * r for r in rho]),
    ("vm_av_grpo", ONE_IN_8, {}, [2.0] + [-0.5] * 7),
    (
        "vm_av_grpo",
        INVALID,
        {},
        [0.75 / math.sqrt(0.1875)] + [-0.25 / math.sqrt(0.1875)] * 5 + [-1.0] * 2,
    ),
    # all-fail with two invalid: mu = (0 + 1) / (6 + 2) = 1/8, so the six valid get -0.125 / sqrt(7/64)
    (
        "vm_av_grpo",
        dict(rewards=[0.0] * 8, valid=[True] * 6 + [False] * 2),
        {},
        [-0.125 / S_POP] * 6 + [-1.0] * 2,
    ),
    ("vm_av_grpo", dict(rewards=[0.0] * 8, valid=[False] * 8), {}, [-1.0] * 8),  # no valid member
    ("vm_av_grpo", SINGLETONS, {}, [(1 / 3) / math.sqrt(2 / 9), -(1 / 3) / math.sqrt(2 / 9)]),
    (
        "vm_av_grpo",
        dict(rewards=[1.0, 0.0, 0.0], lengths=[10, 10, 1000]),
        {"alpha": 0.0, "beta": 0.0},
        [
            (2 / 3) / math.sqrt(2 / 9),
            -(1 / 3) / math.sqrt(2 / 9) * 0.5,
            -(1 / 3) / math.sqrt(2 / 9) * 2.0,
        ],
    ),
    ("msa_grpo", ALL_CORRECT, {}, [0.0] * 8),
    ("msa_grpo", ALL_WRONG, {}, [0.0] * 8),
    ("msa_grpo", ONE_IN_8, {}, [0.875 / S_POP] + [-0.125 / S_POP] * 7),
    (
        "msa_grpo",
        dict(rewards=[1.0] + [0.0] * 7, lengths=[5] + [10] * 7),
        {},
        [0.875 / S_POP * (5 / 9.375) ** -0.5] + [-0.125 / S_POP * (10 / 9.375) ** 0.5] * 7,
    ),
    ("msa_grpo", SINGLETONS, {}, [0.0, 0.0]),
    ("msa_grpo", INVALID, {}, [0.875 / S_POP] + [-0.125 / S_POP] * 7),  # validity is ignored
    ("fa_grpo", ALL_CORRECT, {}, [0.0] * 8),
    ("fa_grpo", ALL_WRONG, {}, [-0.1] * 8),
    ("fa_grpo", dict(rewards=[0.0] * 8, valid=[True] * 7 + [False]), {}, [-0.1] * 7 + [-0.5]),
    ("fa_grpo", ONE_IN_8, {}, [z_s] + [z_f] * 7),
    ("fa_grpo", INVALID, {}, [z_s] + [z_f] * 5 + [-0.5] * 2),
    ("fa_grpo", SINGLETONS, {}, [0.0, -0.1]),
    ("bn_grpo", ALL_CORRECT, {}, [0.0] * 8),
    ("bn_grpo", ONE_IN_8, {}, [0.875 / S_UNB] + [-0.125 / S_UNB] * 7),
    (
        "bn_grpo",
        MIXED_BATCH,
        {},
        [0.875 / math.sqrt(0.875 / 15)] + [-0.125 / math.sqrt(0.875 / 15)] * 7 + [0.0] * 8,
    ),
    ("bn_grpo", ONE_IN_8, {"adv_clip": 1.0}, [1.0] + [-0.125 / S_UNB] * 7),
    ("bn_grpo", SINGLETONS, {}, [0.0, 0.0]),
    ("bn_grpo", ALL_WRONG, {}, [0.0] * 8),
    (
        "bn_grpo",
        INVALID,
        {},
        [0.875 / (S_UNB + 1e-6)] + [-0.125 / (S_UNB + 1e-6)] * 7,
    ),  # validity is ignored
    (
        "sa_grpo",
        MIXED_BATCH,
        {},
        [1.3125] + [-0.6875] * 7 + [0.4375] * 8,
    ),  # all-correct group leaks +0.44
    ("sa_grpo", ALL_WRONG, {}, [0.0] * 8),
    ("sa_grpo", SINGLETONS, {}, [(1 - 0.5 * 1 - 0.25) / 0.5, (0 - 0.25) / 0.5]),
    ("sa_grpo", ALL_CORRECT, {}, [0.0] * 8),
    (
        "sa_grpo",
        ONE_IN_8,
        {},
        [(1 - 0.125) / 0.5] + [(0 - 0.125) / 0.5] * 7,
    ),  # group mean = batch mean
    ("sa_grpo", INVALID, {}, [1.75] + [-0.25] * 7),  # validity is ignored
    ("dfr_grpo", ONE_IN_8, {}, [0.875 / S_POP] + [-0.125 / S_POP] * 7),
    (
        "dfr_grpo",
        INVALID,
        {},
        [0.125 + (5 / 6) / math.sqrt(5 / 36)]
        + [0.125 - (1 / 6) / math.sqrt(5 / 36)] * 5
        + [-0.375] * 2,
    ),
    ("dfr_grpo", ALL_WRONG, {}, [0.0] * 8),  # no entropy given: silent
    (
        "dfr_grpo",
        dict(rewards=[0.0] * 8, entropy=[0.1 * (i + 1) for i in range(8)]),
        {},
        [0.1 * (0.1 * (i + 1) - 0.45) / math.sqrt(0.0525) for i in range(8)],
    ),
    ("dfr_grpo", ALL_CORRECT, {}, [0.0] * 8),
    ("dfr_grpo", SINGLETONS, {}, [0.0, 0.0]),
    # all-fail with two invalid: format stream +0.125 / -0.375; entropy z-scored over the six valid
    (
        "dfr_grpo",
        dict(
            rewards=[0.0] * 8,
            valid=[True] * 6 + [False] * 2,
            entropy=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.9, 0.9],
        ),
        {},
        [0.125 + 0.1 * (0.1 * (i + 1) - 0.35) / math.sqrt(0.175 / 6) for i in range(6)]
        + [-0.375] * 2,
    ),
    ("dace_grpo", ALL_CORRECT, {}, [0.2 * (1 - r) for r in rho]),
    ("dace_grpo", TWO_CORRECT, {}, [z2_s + 0.2 * 0.25 * 0.5, z2_s - 0.2 * 0.25 * 0.5] + [z2_f] * 6),
    ("dace_grpo", ONE_IN_8, {}, [z_s] + [z_f] * 7),
    ("dace_grpo", ALL_WRONG, {}, [0.0] * 8),
    ("dace_grpo", SINGLETONS, {}, [1.0, 0.0]),
    ("dace_grpo", INVALID, {}, [z_s] + [z_f] * 7),  # equal lengths: no bonus; validity is ignored
    ("cag_grpo", ALL_CORRECT, {}, [-0.2 * (r - 1) for r in rho]),
    ("cag_grpo", TWO_CORRECT, {}, [z2_s, z2_s] + [z2_f] * 6),  # success rate 0.25 < gate
    ("cag_grpo", TWO_CORRECT, {"gate": 0.2}, [z2_s + 0.1, z2_s - 0.1] + [z2_f] * 6),
    ("cag_grpo", ALL_WRONG, {}, [0.0] * 8),
    ("cag_grpo", SINGLETONS, {}, [1.0, 0.0]),
    ("cag_grpo", ONE_IN_8, {}, [z_s] + [z_f] * 7),  # success rate 1/8 < gate
    ("cag_grpo", INVALID, {}, [z_s] + [z_f] * 7),
    ("dcbe_grpo", ALL_CORRECT, {}, [0.2 * (1 - r) for r in rho]),
    ("dcbe_grpo", TWO_CORRECT, {}, [z2_s + 0.1, z2_s - 0.1] + [z2_f] * 6),
    ("dcbe_grpo", TWO_CORRECT, {"length_coef": 10.0}, [z2_s + 5.0, 0.05] + [z2_f] * 6),  # sign kept
    ("dcbe_grpo", ALL_WRONG, {}, [0.0] * 8),
    ("dcbe_grpo", SINGLETONS, {}, [0.0, 0.0]),
    (
        "dcbe_grpo",
        ONE_IN_8,
        {},
        [z_s] + [z_f] * 7,
    ),  # a lone correct answer is its own length reference
    ("dcbe_grpo", INVALID, {}, [z_s] + [z_f] * 7),
]


@pytest.fixture(scope="module")
def modules():
    return {n: load_algorithm(prior_source(n), n) for n in list_priors()}


@pytest.mark.parametrize(
    "name,spec,overrides,expected", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_hand_computed(modules, name, spec, overrides, expected):
    mod = modules[name]
    adv = mod.compute_advantages(batch(**spec), make_config(mod, overrides))
    assert adv.shape == (len(expected),)
    assert torch.allclose(adv, torch.tensor(expected, dtype=torch.float32), atol=1e-5), adv.tolist()


def test_every_prior_has_hand_cases():
    assert {c[0] for c in CASES} == set(list_priors())


def test_av_grpo_caveat_is_true_and_stated(modules):
    """Binary rewards, G=8, floor below 0.33: AV-GRPO is GRPO times the constant sqrt(8/7)."""
    gen = torch.Generator().manual_seed(0)
    r = torch.randint(0, 2, (64,), generator=gen).float()
    b = batch(r.tolist(), group=torch.arange(8).repeat_interleave(8).tolist())
    av = modules["av_grpo"].compute_advantages(b, make_config(modules["av_grpo"]))
    gr = modules["grpo"].compute_advantages(b, make_config(modules["grpo"]))
    assert torch.allclose(av, gr * math.sqrt(8 / 7), atol=1e-4)
    card = prior_card("av_grpo")
    assert "0.33" in card and "Adam" in card and "format penalty" in card


@pytest.mark.parametrize("name", list_priors())
def test_protocol(modules, name):
    """Every prior: advantages [B] finite on a random ragged batch; loss a differentiable scalar."""
    mod = modules[name]
    cfg = make_config(mod)
    gen = torch.Generator().manual_seed(1)
    group = torch.tensor([0] * 8 + [1] * 8 + [2] + [3] * 3)
    n = group.numel()
    valid = torch.rand(n, generator=gen) > 0.2
    correct = (torch.rand(n, generator=gen) > 0.5) & valid
    b = RolloutBatch(
        rewards=correct.float(),
        group=group,
        valid=valid,
        correct=correct,
        lengths=torch.randint(1, 50, (n,), generator=gen),
        token_entropy=torch.rand(n, generator=gen),
        progress=0.3,
    )
    adv = mod.compute_advantages(b, cfg)
    assert adv.shape == (n,) and torch.isfinite(adv).all()
    t = 7
    mask = (torch.rand(n, t, generator=gen) > 0.3).float()
    old = -torch.rand(n, t, generator=gen)
    logp = (old + 0.1 * torch.randn(n, t, generator=gen)).requires_grad_(True)
    ref = old.detach() - 0.05
    ent = torch.rand(n, t, generator=gen)
    loss, metrics = mod.policy_loss(
        logp, old, adv.unsqueeze(-1).expand(n, t), mask, cfg, ref_log_prob=ref, entropy=ent
    )
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(logp.grad).all() and logp.grad.abs().sum() > 0
    assert all(isinstance(v, float) for v in metrics.values())


@pytest.mark.parametrize("name", list_priors())
def test_card(name):
    card = prior_card(name)
    for section in ("**Motivation.**", "**Method.**", "**Equations.**", "**Reported results.**"):
        assert section in card


SEED_PAPER = (
    "av_grpo",
    "vm_av_grpo",
    "msa_grpo",
    "fa_grpo",
    "bn_grpo",
    "sa_grpo",
    "dfr_grpo",
    "dace_grpo",
    "cag_grpo",
    "dcbe_grpo",
)


@pytest.mark.parametrize("name", SEED_PAPER)
def test_seed_paper_cards_cite_and_state_what_is_unconfirmed(name):
    """The appendix equations are unverified: each card cites the paper, says what is assumed, labels its figures."""
    card = prior_card(name)
    assert "arXiv:2603.23951" in card
    assert "Unconfirmed" in card
    results = card.split("**Reported results.**")[1].split("**Notes.**")[0]
    assert "(abstract)" in results and "(secondary)" in results


def test_registry_rejects_duplicates_and_unknown_names():
    with pytest.raises(ValueError, match="duplicate"):
        _build_registry(["grpo", "rloo", "grpo"])
    with pytest.raises(ValueError, match="needs both"):
        _build_registry(["no_such_prior"])
    with pytest.raises(KeyError):
        prior_source("no_such_prior")
    assert len(set(list_priors())) == len(list_priors()) == 14


def test_dapo_clips_higher_and_dr_grpo_sums(modules):
    assert make_config(modules["dapo"]).clip_ratio_high == pytest.approx(0.28)
    assert make_config(modules["dr_grpo"]).loss_agg_mode == "seq-mean-token-sum-norm"


def test_every_prior_spawns_as_a_node(archive):
    for name in list_priors():
        if name == "grpo":
            continue  # the root node already carries that name
        node = archive.spawn("grpo", name, algorithm=prior_source(name))
        assert node.parents == ("grpo",)
        assert archive.algorithm(name) == prior_source(name)
