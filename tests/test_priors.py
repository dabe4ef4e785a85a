"""The published mechanisms' advantages, exactly as the POISE appendix writes them.

Every case below can be checked on paper: the expected values are written as the equation's arithmetic
(mu, sigma, ratios) with the batch it comes from. Scenarios: one success in eight, all-fail with invalid
and valid-wrong samples, all-correct, singletons, varied lengths, several groups with shuffled ids.
"""

from __future__ import annotations

import math

import pytest
import torch

from engine.archive.edit import prior_source
from trainer_template.interface import RolloutBatch
from trainer_template.loader import load_algorithm, make_config
from trainer_template.priors import _build_registry, list_priors, prior_edit

EPS = 1e-6


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
        token_entropy=torch.tensor(
            entropy if entropy is not None else [0.1 * (i % 5 + 1) for i in range(n)],
            dtype=torch.float32,
        ),
    )


# -- the scenarios ----------------------------------------------------------------------------------
LENS = list(range(10, 18))  # mean 13.5, population variance 5.25
ONE_IN_8 = dict(rewards=[1.0] + [0.0] * 7)
ONE_IN_16 = dict(rewards=[1.0] + [0.0] * 15)
# all-fail: six valid-but-wrong answers and two invalid ones; valid lengths average 80 / 6
ALL_FAIL = dict(
    rewards=[0.0] * 8,
    valid=[True] * 6 + [False] * 2,
    lengths=[10, 10, 10, 10, 20, 20, 5, 5],
    entropy=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.9, 0.9],
)
# one success in eight with two invalid members
INVALID = dict(rewards=[1.0] + [0.0] * 7, valid=[True] * 6 + [False] * 2)
ALL_CORRECT = dict(rewards=[1.0] * 8, lengths=LENS)
SINGLETONS = dict(rewards=[1.0, 0.0], group=[0, 1])
# two successes of different length, wrong answers of varied length (mean length 22.5)
VARIED = dict(rewards=[1.0, 1.0] + [0.0] * 6, lengths=[10, 30, 20, 20, 20, 20, 20, 40])
# two groups of four under ids 5 and 2, interleaved: group 5 = members 0, 2, 5, 6 (one success),
# group 2 = members 1, 3, 4, 7 (successes 3 and 4); lengths 10, 20, ..., 80
SHUFFLED = dict(
    rewards=[1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0],
    group=[5, 2, 5, 2, 2, 5, 5, 2],
    lengths=[10, 20, 30, 40, 50, 60, 70, 80],
)
MIXED_BATCH = dict(rewards=[1.0] + [0.0] * 7 + [1.0] * 8, group=[0] * 8 + [1] * 8)

S7 = math.sqrt(7) / 8  # population std of one success in eight
U8 = math.sqrt(1 / 8)  # unbiased std of one success in eight
Z_S, Z_F = (7 / 8) / (U8 + EPS), -(1 / 8) / (U8 + EPS)  # GRPO (verl) on one success in eight
U2 = math.sqrt(8 / 7 * 3 / 16)  # unbiased std of two successes in eight
Z2_S, Z2_F = 0.75 / (U2 + EPS), -0.25 / (U2 + EPS)
# GRPO on SHUFFLED: group 5 (1 of 4, unbiased std 1/2), group 2 (2 of 4, unbiased std sqrt(1/3))
G5_S, G5_F = 0.75 / (0.5 + EPS), -0.25 / (0.5 + EPS)
G2 = 0.5 / (math.sqrt(1 / 3) + EPS)
GRPO_SHUFFLED = [G5_S, -G2, G5_F, G2, G2, G5_F, G5_F, -G2]


def per_member(shuffled_values: dict[int, float]) -> list[float]:
    return [shuffled_values[i] for i in range(8)]


def _vm_shuffled() -> list[float]:
    # group 5: mu = (1 + 1) / (4 + 2) = 1/3, sigma = sqrt(2/9); valid lengths 10, 30, 60, 70 (mean 42.5)
    s5 = math.sqrt(2 / 9)
    f5 = -(1 / 3) / s5
    # group 2: mu = (2 + 1) / 6 = 1/2, sigma = 1/2; lengths 20, 40, 50, 80 (mean 47.5); 20/47.5 -> 0.5
    return per_member(
        {
            0: (2 / 3) / s5,
            2: f5 / (30 / 42.5),
            5: f5 / (60 / 42.5),
            6: f5 / (70 / 42.5),
            1: -1.0 / 0.5,
            3: 1.0,
            4: 1.0,
            7: -1.0 / (80 / 47.5),
        }
    )


def _msa_shuffled() -> list[float]:
    s5 = math.sqrt(3 / 16)  # population std of the outcome in group 5 (1 of 4)
    r5 = {0: 10 / 42.5, 2: 30 / 42.5, 5: 60 / 42.5, 6: 70 / 42.5}
    r2 = {1: 20 / 47.5, 3: 40 / 47.5, 4: 50 / 47.5, 7: 80 / 47.5}
    out = {0: 0.75 / s5 * r5[0] ** 0.5}
    out.update({i: -0.25 / s5 * r5[i] ** -0.5 for i in (2, 5, 6)})
    out.update({i: 1.0 * r2[i] ** 0.5 for i in (3, 4)})
    out.update({i: -1.0 * r2[i] ** -0.5 for i in (1, 7)})
    return per_member(out)


def _bn_shuffled() -> list[float]:
    raw = [0.75, -0.5, -0.25, 0.5, 0.5, -0.25, -0.25, -0.5]
    sigma = math.sqrt(sum(a * a for a in raw) / 8)  # sqrt(1.75 / 8)
    return [a / (sigma + EPS) for a in raw]


DFR_FMT_V, DFR_FMT_I = (
    0.5 * 0.25 / (math.sqrt(3 / 16) + EPS),
    0.5 * -0.75 / (math.sqrt(3 / 16) + EPS),
)
H_SD = math.sqrt(0.175 / 6)  # population std of 0.1 .. 0.6
S56 = math.sqrt(5 / 36)  # population std of one success among six valid

CASES = [
    # (prior, batch, cfg overrides, expected advantages)
    ("grpo", ONE_IN_8, {}, [Z_S] + [Z_F] * 7),
    ("grpo", ALL_FAIL, {}, [0.0] * 8),
    ("grpo", ALL_CORRECT, {}, [0.0] * 8),
    ("grpo", SINGLETONS, {}, [1 / (1 + EPS), 0.0]),  # verl: singleton mean 0, std 1
    ("grpo", VARIED, {}, [Z2_S] * 2 + [Z2_F] * 6),
    ("grpo", SHUFFLED, {}, GRPO_SHUFFLED),
    ("dapo", ONE_IN_8, {}, [Z_S] + [Z_F] * 7),
    ("dapo", SHUFFLED, {}, GRPO_SHUFFLED),
    ("dr_grpo", ONE_IN_8, {}, [0.875] + [-0.125] * 7),
    ("dr_grpo", ALL_FAIL, {}, [0.0] * 8),
    ("dr_grpo", ALL_CORRECT, {}, [0.0] * 8),
    ("dr_grpo", SINGLETONS, {}, [1.0, 0.0]),
    ("dr_grpo", SHUFFLED, {}, [0.75, -0.5, -0.25, 0.5, 0.5, -0.25, -0.25, -0.5]),
    ("rloo", ONE_IN_8, {}, [1.0] + [-1 / 7] * 7),
    ("rloo", ALL_FAIL, {}, [0.0] * 8),
    ("rloo", ALL_CORRECT, {}, [0.0] * 8),
    ("rloo", SINGLETONS, {}, [1.0, 0.0]),
    ("rloo", SHUFFLED, {}, [1.0, -2 / 3, -1 / 3, 2 / 3, 2 / 3, -1 / 3, -1 / 3, -2 / 3]),
    # AV: (R - mu) / max(sqrt(mu2 - mu^2), sigma_min)
    ("av_grpo", ONE_IN_8, {}, [0.875 / S7] + [-0.125 / S7] * 7),
    ("av_grpo", ONE_IN_8, {"sigma_min": 0.5}, [1.75] + [-0.25] * 7),  # the floor above 0.33
    ("av_grpo", ALL_FAIL, {}, [0.0] * 8),
    ("av_grpo", ALL_CORRECT, {}, [0.0] * 8),
    ("av_grpo", SINGLETONS, {}, [0.0, 0.0]),
    ("av_grpo", INVALID, {}, [0.875 / S7] + [-0.125 / S7] * 7),  # validity is not read
    # graded rewards: mu = 0.5, mu2 = 0.3, sigma = sqrt(0.05)
    (
        "av_grpo",
        dict(rewards=[0.2, 0.4, 0.6, 0.8]),
        {},
        [x / math.sqrt(0.05) for x in (-0.3, -0.1, 0.1, 0.3)],
    ),
    (
        "av_grpo",
        SHUFFLED,
        {},
        per_member(
            {
                0: 0.75 / math.sqrt(3 / 16),
                2: -0.25 / math.sqrt(3 / 16),
                5: -0.25 / math.sqrt(3 / 16),
            }
            | {6: -0.25 / math.sqrt(3 / 16), 1: -1.0, 3: 1.0, 4: 1.0, 7: -1.0}
        ),
    ),
    # VM-AV: mu = (sum_V R + 1) / (|V| + 2), sigma = sqrt(mu (1 - mu)); negative valid / clip(L / mean_V L)
    ("vm_av_grpo", ONE_IN_8, {}, [0.8 / 0.4] + [-0.2 / 0.4] * 7),
    # all-fail: mu = 1/8 over the six valid; valid lengths 10 and 20 against their mean 80/6
    (
        "vm_av_grpo",
        ALL_FAIL,
        {},
        [-(1 / 8) / S7 / (10 / (80 / 6))] * 4 + [-(1 / 8) / S7 / (20 / (80 / 6))] * 2 + [-1.0] * 2,
    ),
    ("vm_av_grpo", ALL_CORRECT, {}, [0.1 / 0.3] * 8),  # mu = 9/10: positive, never length-scaled
    ("vm_av_grpo", SINGLETONS, {}, [(1 / 3) / math.sqrt(2 / 9), -(1 / 3) / math.sqrt(2 / 9)]),
    # one success among six valid: mu = 2/8, sigma = sqrt(3/16); invalid -> A_floor
    (
        "vm_av_grpo",
        INVALID,
        {},
        [0.75 / math.sqrt(3 / 16)] + [-0.25 / math.sqrt(3 / 16)] * 5 + [-1.0] * 2,
    ),
    # mu = 3/10, sigma = sqrt(0.21); wrong lengths 20 and 40 against the mean 22.5: divided, not multiplied
    (
        "vm_av_grpo",
        VARIED,
        {},
        [0.7 / math.sqrt(0.21)] * 2
        + [-0.3 / math.sqrt(0.21) / (20 / 22.5)] * 5
        + [-0.3 / math.sqrt(0.21) / (40 / 22.5)],
    ),
    ("vm_av_grpo", SHUFFLED, {}, _vm_shuffled()),
    ("vm_av_grpo", dict(rewards=[0.0] * 8, valid=[False] * 8), {}, [-1.0] * 8),
    # MSA: sigma_outcome (population std of correctness) anchors; ratio^(+-0.5)
    ("msa_grpo", ONE_IN_8, {}, [0.875 / S7] + [-0.125 / S7] * 7),
    ("msa_grpo", ALL_FAIL, {}, [0.0] * 8),
    ("msa_grpo", ALL_CORRECT, {}, [0.0] * 8),
    ("msa_grpo", SINGLETONS, {}, [0.0, 0.0]),
    (
        "msa_grpo",
        VARIED,
        {},
        [
            0.75 / math.sqrt(3 / 16) * (10 / 22.5) ** 0.5,
            0.75 / math.sqrt(3 / 16) * (30 / 22.5) ** 0.5,
        ]
        + [-0.25 / math.sqrt(3 / 16) * (20 / 22.5) ** -0.5] * 5
        + [-0.25 / math.sqrt(3 / 16) * (40 / 22.5) ** -0.5],
    ),
    # a uniform (all-incorrect) group with graded rewards: sigma_total = 0.25 anchors, alpha_uniform = 0.5
    (
        "msa_grpo",
        dict(rewards=[0.5, 0.5, 0.0, 0.0], correct=[False] * 4),
        {},
        [0.5, 0.5, -0.5, -0.5],
    ),
    ("msa_grpo", SHUFFLED, {}, _msa_shuffled()),
    # FA: R_max > 0 -> clip((R - mu) / (population std + eps), -3, 3); else -2.0 invalid, -0.5 valid
    ("fa_grpo", ONE_IN_8, {}, [0.875 / (S7 + EPS)] + [-0.125 / (S7 + EPS)] * 7),
    (
        "fa_grpo",
        ONE_IN_16,
        {},
        [3.0] + [-(1 / 16) / (math.sqrt(15) / 16 + EPS)] * 15,
    ),  # 3.87 clipped
    ("fa_grpo", ALL_FAIL, {}, [-0.5] * 6 + [-2.0] * 2),
    ("fa_grpo", ALL_CORRECT, {}, [0.0] * 8),
    ("fa_grpo", SINGLETONS, {}, [0.0, -0.5]),
    (
        "fa_grpo",
        INVALID,
        {},
        [0.875 / (S7 + EPS)] + [-0.125 / (S7 + EPS)] * 7,
    ),  # a success: GRPO-like
    (
        "fa_grpo",
        SHUFFLED,
        {},
        per_member(
            {
                0: 0.75 / math.sqrt(3 / 16),
                2: -0.25 / math.sqrt(3 / 16),
                5: -0.25 / math.sqrt(3 / 16),
            }
            | {6: -0.25 / math.sqrt(3 / 16), 1: -1.0, 3: 1.0, 4: 1.0, 7: -1.0}
        ),
    ),
    # BN: group-centred, divided by the RMS of the centred rewards over the whole batch, clipped to 3
    ("bn_grpo", ONE_IN_8, {}, [0.875 / (S7 + EPS)] + [-0.125 / (S7 + EPS)] * 7),
    (
        "bn_grpo",
        MIXED_BATCH,  # sigma_batch = sqrt((49/64 + 7/64) / 16): the success (3.74) is clipped
        {},
        [3.0] + [-0.125 / (math.sqrt(7 / 128) + EPS)] * 7 + [0.0] * 8,
    ),
    ("bn_grpo", ALL_FAIL, {}, [0.0] * 8),
    ("bn_grpo", ALL_CORRECT, {}, [0.0] * 8),
    ("bn_grpo", SINGLETONS, {}, [0.0, 0.0]),
    ("bn_grpo", SHUFFLED, {}, _bn_shuffled()),
    # SA: anchor = 0.5 group mean + 0.5 batch mean, scale 0.5
    ("sa_grpo", ONE_IN_8, {}, [(1 - 0.125) / 0.5] + [(0 - 0.125) / 0.5] * 7),
    ("sa_grpo", MIXED_BATCH, {}, [1.3125] + [-0.6875] * 7 + [0.4375] * 8),  # batch mean 9/16 leaks
    ("sa_grpo", ALL_FAIL, {}, [0.0] * 8),
    ("sa_grpo", ALL_CORRECT, {}, [0.0] * 8),
    ("sa_grpo", SINGLETONS, {}, [(1 - 0.75) / 0.5, (0 - 0.25) / 0.5]),
    (
        "sa_grpo",
        SHUFFLED,
        {},
        per_member(
            {0: 1.375, 2: -0.625, 5: -0.625, 6: -0.625, 3: 1.125, 4: 1.125, 1: -0.875, 7: -0.875}
        ),
    ),
    # DFR: A_reason + 0.5 A_format (both z-scores, population std + eps)
    ("dfr_grpo", ONE_IN_8, {}, [0.875 / (S7 + EPS)] + [-0.125 / (S7 + EPS)] * 7),
    (
        "dfr_grpo",
        ALL_FAIL,  # format: 6 of 8 valid; reasoning: 0.1 x z-score of the valid entropies 0.1 .. 0.6
        {},
        [DFR_FMT_V + 0.1 * (0.1 * (i + 1) - 0.35) / (H_SD + EPS) for i in range(6)]
        + [DFR_FMT_I] * 2,
    ),
    ("dfr_grpo", ALL_CORRECT, {}, [0.0] * 8),
    ("dfr_grpo", SINGLETONS, {}, [0.0, 0.0]),
    (
        "dfr_grpo",
        INVALID,
        {},
        [DFR_FMT_V + (5 / 6) / (S56 + EPS)]
        + [DFR_FMT_V - (1 / 6) / (S56 + EPS)] * 5
        + [DFR_FMT_I] * 2,
    ),
    (
        "dfr_grpo",
        SHUFFLED,
        {},
        per_member(
            {
                0: 0.75 / math.sqrt(3 / 16),
                2: -0.25 / math.sqrt(3 / 16),
                5: -0.25 / math.sqrt(3 / 16),
            }
            | {6: -0.25 / math.sqrt(3 / 16), 1: -1.0, 3: 1.0, 4: 1.0, 7: -1.0}
        ),
    ),
    # DACE: A_acc (1 + 0.5 (1 - PassRate)) + 0.5 A_eff PassRate 1[correct]
    ("dace_grpo", ONE_IN_8, {}, [Z_S * 1.4375] + [Z_F * 1.4375] * 7),  # one correct: A_eff = 0
    ("dace_grpo", ALL_FAIL, {}, [0.0] * 8),
    ("dace_grpo", ALL_CORRECT, {}, [0.5 * (13.5 - n) / (math.sqrt(5.25) + EPS) for n in LENS]),
    ("dace_grpo", SINGLETONS, {}, [1 / (1 + EPS), 0.0]),
    # correct lengths 10 and 30: A_eff = +1 / -1 (mean 20, std 10); PassRate 1/4
    ("dace_grpo", VARIED, {}, [Z2_S * 1.375 + 0.125, Z2_S * 1.375 - 0.125] + [Z2_F * 1.375] * 6),
    (
        "dace_grpo",
        SHUFFLED,  # group 2's successes (lengths 40, 50): A_eff +-1, PassRate 1/2
        {},
        per_member(
            {0: G5_S * 1.375, 2: G5_F * 1.375, 5: G5_F * 1.375, 6: G5_F * 1.375}
            | {3: G2 * 1.25 + 0.25, 4: G2 * 1.25 - 0.25, 1: -G2 * 1.25, 7: -G2 * 1.25}
        ),
    ),
    # CAG: A_acc + 0.5 SR^2 min((mu_L - L) / mu_L, 0) 1[correct]
    ("cag_grpo", ONE_IN_8, {}, [Z_S] + [Z_F] * 7),
    ("cag_grpo", ALL_FAIL, {}, [0.0] * 8),
    ("cag_grpo", ALL_CORRECT, {}, [0.5 * min((13.5 - n) / 13.5, 0.0) for n in LENS]),
    ("cag_grpo", SINGLETONS, {}, [1 / (1 + EPS), 0.0]),
    ("cag_grpo", VARIED, {}, [Z2_S, Z2_S + 0.5 / 16 * (-0.5)] + [Z2_F] * 6),  # shorter: no bonus
    (
        "cag_grpo",
        SHUFFLED,
        {},
        [G5_S, -G2, G5_F, G2, G2 + 0.5 * 0.25 * (-5 / 45), G5_F, G5_F, -G2],
    ),
    # DCBE: A_acc + 0.5 (N_correct / N)^2 (mu_L - L) / (mu_L + eps) 1[correct]
    ("dcbe_grpo", ONE_IN_8, {}, [Z_S] + [Z_F] * 7),
    ("dcbe_grpo", ALL_FAIL, {}, [0.0] * 8),
    ("dcbe_grpo", ALL_CORRECT, {}, [0.5 * (13.5 - n) / (13.5 + EPS) for n in LENS]),
    ("dcbe_grpo", SINGLETONS, {}, [1 / (1 + EPS), 0.0]),
    ("dcbe_grpo", VARIED, {}, [Z2_S + 0.5 / 16 * 0.5, Z2_S - 0.5 / 16 * 0.5] + [Z2_F] * 6),
    (
        "dcbe_grpo",
        SHUFFLED,
        {},
        [G5_S, -G2, G5_F, G2 + 0.125 * 5 / 45, G2 - 0.125 * 5 / 45, G5_F, G5_F, -G2],
    ),
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


def test_every_prior_has_hand_cases_in_every_scenario():
    assert {c[0] for c in CASES} == set(list_priors())
    for name in list_priors():
        if name == "dapo":
            continue  # DAPO's advantage is GRPO's (its change is the loss side)
        seen = {id(c[1]) for c in CASES if c[0] == name}
        assert {
            id(ONE_IN_8),
            id(ALL_FAIL),
            id(ALL_CORRECT),
            id(SINGLETONS),
            id(SHUFFLED),
        } <= seen, name


@pytest.mark.parametrize("name", list_priors())
@pytest.mark.parametrize("value", [0.1, 0.2, 0.3, 0.7, 0.9])
def test_identical_graded_rewards_stay_finite(modules, name, value):
    """Identical graded rewards: mu2 - mu^2 rounds below zero in float32 for some values (0.1, 0.2,
    0.9); no mechanism may answer NaN or inf, and the group carries (almost) no signal."""
    mod = modules[name]
    b = batch([value] * 8 + [1.0] + [0.0] * 7, group=[0] * 8 + [1] * 8, lengths=LENS * 2)
    adv = mod.compute_advantages(b, make_config(mod))
    assert torch.isfinite(adv).all(), adv.tolist()


def test_the_float32_trap_is_real():
    from trainer_template.interface import group_stats

    s = torch.full((8,), 0.9)
    st = group_stats(s, torch.zeros(8, dtype=torch.long))
    assert float((group_stats(s * s, torch.zeros(8, dtype=torch.long)).mean - st.mean**2)[0]) < 0


def test_dfr_needs_token_entropy(modules):
    mod = modules["dfr_grpo"]
    b = batch(**ONE_IN_8)
    b.token_entropy = None
    with pytest.raises(ValueError, match="token_entropy"):
        mod.compute_advantages(b, make_config(mod))


def test_av_grpo_is_grpo_times_a_constant_on_binary_rewards(modules):
    """Binary rewards, G = 8, sigma_min below 0.33: AV-GRPO = GRPO x sqrt(8/7) (the card says so)."""
    gen = torch.Generator().manual_seed(0)
    r = torch.randint(0, 2, (64,), generator=gen).float()
    b = batch(r.tolist(), group=torch.arange(8).repeat_interleave(8).tolist())
    av = modules["av_grpo"].compute_advantages(b, make_config(modules["av_grpo"]))
    gr = modules["grpo"].compute_advantages(b, make_config(modules["grpo"]))
    assert torch.allclose(av, gr * math.sqrt(8 / 7), atol=1e-4)


# -- field names the issue fixes (defaults: the paper's value where it gives one) --------------------
FIELDS = {
    "av_grpo": {"sigma_min": None},
    "vm_av_grpo": {
        "alpha": None,
        "beta": None,
        "sigma_floor": None,
        "invalid_advantage": None,
        "len_ratio_min": 0.5,
        "len_ratio_max": 2.0,
    },
    "msa_grpo": {"eps": None, "alpha_uniform": None, "length_lambda": None},
    "fa_grpo": {"eps": None, "adv_clip": 3.0, "invalid_penalty": -2.0, "wrong_penalty": -0.5},
    "dfr_grpo": {"format_weight": None},
    "bn_grpo": {"eps": None, "adv_clip": 3.0},
    "sa_grpo": {"anchor_weight": None, "fixed_scale": None},
    "dace_grpo": {"alpha": None, "beta": None, "eps": None},
    "cag_grpo": {"beta_base": None, "eps": None},
    "dcbe_grpo": {"length_coef": None, "eps": None},
    "grpo": {"kl_coef": 0.001, "kl_type": "low_var_kl"},
}


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_hyperparameter_names(modules, name):
    cfg = make_config(modules[name])
    for field, default in FIELDS[name].items():
        assert hasattr(cfg, field), f"{name} lacks {field}"
        if default is not None:
            assert getattr(cfg, field) == default, (name, field)


def test_registry_rejects_duplicates_and_unknown_names():
    with pytest.raises(ValueError, match="duplicate"):
        _build_registry(["grpo", "rloo", "grpo"])
    with pytest.raises(ValueError, match="needs both"):
        _build_registry(["no_such_prior"])
    with pytest.raises(KeyError):
        prior_edit("no_such_prior")
    assert len(set(list_priors())) == len(list_priors()) == 14
