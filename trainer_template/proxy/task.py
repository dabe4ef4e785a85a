"""The proxy task: chained one-digit +/- arithmetic mod 100, with a delimited answer (verifiable).

A problem is a start value a in [0, 100) and k operations (sign, digit in 1..9). The running result is
r_0 = a, r_i = (r_{i-1} +/- d_i) mod 100; the gold answer is r_k. The prompt has a fixed width::

    BOS a1 a0 s1 d1 s2 d2 ... s8 d8 =          (unused operation slots are ". .")

and the reference response writes every running result, then the answer between the delimiters
``<`` and ``>`` (the stand-in for ``\\boxed{}``), then EOS::

    r1 r1 ; r2 r2 ; ... < a a > EOS

A response is *valid* iff it ends in ``< d d > EOS`` with no other delimiter; *correct* iff valid and
the two digits are the gold answer. Reward = 1.0 iff correct. Difficulty is the chain length k.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

MOD = 100
MAX_K = 8
TOKENS = ["<pad>", "<bos>", "<eos>", *"0123456789", "+", "-", "=", ";", "<", ">", "."]
VOCAB = {t: i for i, t in enumerate(TOKENS)}
PAD, BOS, EOS = VOCAB["<pad>"], VOCAB["<bos>"], VOCAB["<eos>"]
DIGIT0 = VOCAB["0"]
PLUS, MINUS, EQ, SEP, OPEN, CLOSE, NOOP = (VOCAB[t] for t in "+-=;<>.")
VOCAB_SIZE = len(TOKENS)
PROMPT_LEN = 3 + 2 * MAX_K + 1
MAX_RESPONSE = 3 * MAX_K + 5 + 3
"""room for the longest reference response (29 tokens) plus slack"""

SPLITS = {"easy": (1, 2), "medium": (3, 5), "hard": (6, 8)}
"""difficulty splits as inclusive ranges of the chain length k"""


@dataclass(frozen=True)
class Problem:
    start: int
    ops: tuple[tuple[int, int], ...]  # (sign +1/-1, digit 1..9)

    @property
    def k(self) -> int:
        return len(self.ops)

    def running(self) -> list[int]:
        r, out = self.start, []
        for s, d in self.ops:
            r = (r + s * d) % MOD
            out.append(r)
        return out

    @property
    def answer(self) -> int:
        return self.running()[-1]


def sample_problem(gen: torch.Generator, k: int) -> Problem:
    """One problem of chain length ``k`` drawn with ``gen`` (deterministic given the generator state)."""
    vals = torch.randint(0, 1 << 30, (1 + 2 * k,), generator=gen).tolist()
    start = vals[0] % MOD
    ops = tuple((1 if vals[1 + 2 * i] % 2 == 0 else -1, 1 + vals[2 + 2 * i] % 9) for i in range(k))
    return Problem(start, ops)


def sample_ks(gen: torch.Generator, n: int, weights: Sequence[float]) -> list[int]:
    """n chain lengths with P(k) proportional to weights[k-1] (k = 1..len(weights))."""
    w = torch.tensor(list(weights), dtype=torch.float64)
    return (torch.multinomial(w, n, replacement=True, generator=gen) + 1).tolist()


def k_weights(power: float, k_max: int = MAX_K) -> list[float]:
    """P(k) proportional to k^-power: power 0 is uniform, larger powers favour short chains."""
    return [float(k) ** -power for k in range(1, k_max + 1)]


def split_of(k: int) -> str:
    for name, (lo, hi) in SPLITS.items():
        if lo <= k <= hi:
            return name
    raise ValueError(f"chain length {k} is in no split")


def _two(v: int) -> list[int]:
    return [DIGIT0 + v // 10, DIGIT0 + v % 10]


def encode_prompt(p: Problem) -> list[int]:
    toks = [BOS, *_two(p.start)]
    for s, d in p.ops:
        toks += [PLUS if s > 0 else MINUS, DIGIT0 + d]
    toks += [NOOP, NOOP] * (MAX_K - p.k)
    return toks + [EQ]


def encode_response(p: Problem, broken: int = 0) -> list[int]:
    """The reference response; ``broken`` in 1..3 damages the delimiters (1: no '<', 2: no '>',
    3: ';' instead of '<') so the warm start learns some invalid formats."""
    toks: list[int] = []
    for r in p.running():
        toks += [*_two(r), SEP]
    ans = _two(p.answer)
    if broken == 1:
        toks += [*ans, CLOSE]
    elif broken == 2:
        toks += [OPEN, *ans]
    elif broken == 3:
        toks += [SEP, *ans, CLOSE]
    else:
        toks += [OPEN, *ans, CLOSE]
    return toks + [EOS]


def prompts_tensor(problems: Sequence[Problem]) -> torch.Tensor:
    return torch.tensor([encode_prompt(p) for p in problems], dtype=torch.long)


def response_mask(responses: torch.Tensor) -> torch.Tensor:
    """[N, T] bool: response tokens up to and including the first EOS (all T when there is none)."""
    is_eos = responses == EOS
    before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return before == 0


def score(
    responses: torch.Tensor, problems: Sequence[Problem]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """valid [N] bool, correct [N] bool, lengths [N] long (tokens incl. EOS) of sampled responses [N, T]."""
    n = responses.shape[0]
    valid = torch.zeros(n, dtype=torch.bool)
    correct = torch.zeros(n, dtype=torch.bool)
    mask = response_mask(responses)
    lengths = mask.sum(1)
    rows = responses.tolist()
    for i, (row, p) in enumerate(zip(rows, problems)):
        if EOS not in row:
            continue
        body = row[: row.index(EOS)]
        if len(body) < 4 or body[-4] != OPEN or body[-1] != CLOSE:
            continue
        d1, d0 = body[-3] - DIGIT0, body[-2] - DIGIT0
        if not (0 <= d1 <= 9 and 0 <= d0 <= 9) or OPEN in body[:-4] or CLOSE in body[:-4]:
            continue
        valid[i] = True
        correct[i] = 10 * d1 + d0 == p.answer
    return valid, correct, lengths


def decode(tokens: Sequence[int]) -> str:
    return " ".join(TOKENS[t] for t in tokens if t != PAD)
