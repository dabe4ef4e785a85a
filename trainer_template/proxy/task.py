"""The proxy task: chained one-digit arithmetic mod 100 with a delimited answer (verifiable).

A problem is a start value a in [0, 100) and k operations: + d or - d (d in 1..9), or * d (d in 2..9).
The running result is r_0 = a, r_i = (r_{i-1} op d_i) mod 100; the gold answer is r_k. Hard prompts
(k = 6..8) also multiply (each operation is * d with probability ``MUL_RATE``): a product mod 100 is a
table the policy knows only partly, so hard prompts stay hard after the right response style is found.
The prompt has a fixed width::

    BOS a1 a0 s1 d1 s2 d2 ... s8 d8 =          (unused operation slots are ". .")

A response may take one of several *styles*, and the policy chooses (its first tokens decide)::

    direct   < a a > EOS                              5 tokens: the answer in one go
    chain    r1 r1 ; r2 r2 ; ... ; < a a > EOS         3k + 5 tokens: every running result first
    ramble   a chain with filler "." tokens between its steps (longer, same content)
    give-up  a partial chain that stops with EOS and no answer (format-invalid)

A chain may also write a multiplication step *decomposed*: ``= u u t`` before the running result,
where ``u u`` is the product of the previous result's units digit and d and ``t`` the product of
its tens digit and d mod 10, so the result is (10 t + u u) mod 100. Four more tokens per step buy a
step the policy gets right more often than a product mod 100 written at once; a warm start that
decomposes (``WarmStart.skill_decompose`` / ``habit_decompose``, off by default) makes that a
graded length-accuracy trade-off, bounded by the cap.

Writing the chain makes every step a one-operation update, so it is accurate on long chains where the
direct answer is a guess: longer responses help on hard prompts. Filler costs length and, past the
response cap ``MAX_RESPONSE``, the answer is cut off (format-invalid). A response is *valid* iff it ends
in ``< d d > EOS`` within the cap with no other delimiter; *correct* iff valid and the two digits are
the gold answer. Reward = 1.0 iff correct. Difficulty is the chain length k.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

MOD = 100
MAX_K = 8
TOKENS = ["<pad>", "<bos>", "<eos>", *"0123456789", "+", "-", "=", ";", "<", ">", ".", "*"]
VOCAB = {t: i for i, t in enumerate(TOKENS)}
PAD, BOS, EOS = VOCAB["<pad>"], VOCAB["<bos>"], VOCAB["<eos>"]
DIGIT0 = VOCAB["0"]
PLUS, MINUS, EQ, SEP, OPEN, CLOSE, NOOP, TIMES = (VOCAB[t] for t in "+-=;<>.*")
MUL = 0
"""the sign value of a multiplication in ``Problem.ops``"""
VOCAB_SIZE = len(TOKENS)
PROMPT_LEN = 3 + 2 * MAX_K + 1
MAX_RESPONSE = 36
"""response cap (tokens): the longest chain (k = 8) takes 29, so up to 7 filler tokens fit"""

SPLITS = {"easy": (1, 2), "medium": (3, 5), "hard": (6, 8)}
"""difficulty splits as inclusive ranges of the chain length k"""
MUL_RATE = {"easy": 0.0, "medium": 0.0, "hard": 0.3}
"""probability that an operation of a prompt in the split is a multiplication"""
STYLES = ("direct", "chain", "ramble", "giveup")


@dataclass(frozen=True)
class Problem:
    start: int
    ops: tuple[tuple[int, int], ...]  # (sign +1 / -1 / MUL, digit 1..9)

    @property
    def k(self) -> int:
        return len(self.ops)

    def running(self) -> list[int]:
        r, out = self.start, []
        for s, d in self.ops:
            r = (r * d if s == MUL else r + s * d) % MOD
            out.append(r)
        return out

    @property
    def answer(self) -> int:
        return self.running()[-1]


def sample_problem(gen: torch.Generator, k: int, mul_rate: float | None = None) -> Problem:
    """One problem of chain length ``k`` drawn with ``gen`` (deterministic given the generator state);
    each operation multiplies with probability ``mul_rate`` (default: its split's ``MUL_RATE``)."""
    rate = MUL_RATE[split_of(k)] if mul_rate is None else mul_rate
    vals = torch.randint(0, 1 << 30, (1 + 3 * k,), generator=gen).tolist()
    start = vals[0] % MOD
    ops = []
    for i in range(k):
        a, b, c = vals[1 + 3 * i : 4 + 3 * i]
        if c / (1 << 30) < rate:
            ops.append((MUL, 2 + b % 8))
        else:
            ops.append((1 if a % 2 == 0 else -1, 1 + b % 9))
    return Problem(start, tuple(ops))


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
        toks += [TIMES if s == MUL else PLUS if s > 0 else MINUS, DIGIT0 + d]
    toks += [NOOP, NOOP] * (MAX_K - p.k)
    return toks + [EQ]


def encode_response(
    p: Problem,
    style: str = "chain",
    filler: Sequence[int] = (),
    stop: int = 0,
    decompose: Sequence[bool] = (),
) -> list[int]:
    """A reference response in ``style`` (untruncated; :data:`MAX_RESPONSE` caps it when sampled).

    ramble: ``filler[i]`` "." tokens after running result i (missing entries: none);
    giveup: the first ``stop`` running results (0 <= stop < k), then EOS without an answer;
    decompose: step i written as ``= u u t`` and its result where ``decompose[i]`` is true and step i
    multiplies (missing entries, and steps that add or subtract: written at once)."""
    if style == "direct":
        return [OPEN, *_two(p.answer), CLOSE, EOS]
    steps = p.running()
    if style == "giveup":
        steps = steps[:stop]
    toks: list[int] = []
    prev = p.start
    for i, r in enumerate(steps):
        sign, d = p.ops[i]
        if sign == MUL and i < len(decompose) and decompose[i]:
            toks += [EQ, *_two(prev % 10 * d), DIGIT0 + prev // 10 * d % 10]
        toks += [*_two(r), SEP]
        prev = r
        if style == "ramble" and i < len(filler):
            toks += [NOOP] * int(filler[i])
    if style == "giveup":
        return toks + [EOS]
    if style not in ("chain", "ramble"):
        raise ValueError(f"unknown response style {style!r} (known: {', '.join(STYLES)})")
    return toks + [OPEN, *_two(p.answer), CLOSE, EOS]


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
    """valid [N] bool, correct [N] bool, lengths [N] long (tokens incl. EOS) of sampled responses [N, T].

    Vectorized: the answer is the four tokens before the first EOS; a response with no EOS (cut off at
    the cap) is invalid, as is one with a delimiter anywhere else."""
    n, t = responses.shape
    dev = responses.device
    is_eos = responses == EOS
    has_eos = is_eos.any(1)
    lengths = response_mask(responses).sum(1)
    eos_at = torch.where(has_eos, is_eos.long().argmax(1), torch.full_like(lengths, t))
    pos = eos_at[:, None] - torch.arange(4, 0, -1, device=dev)[None, :]  # the 4 answer positions
    ok = has_eos & (eos_at >= 4)
    ans = responses.gather(1, pos.clamp(min=0))
    d1, d0 = ans[:, 1] - DIGIT0, ans[:, 2] - DIGIT0
    digits = (d1 >= 0) & (d1 <= 9) & (d0 >= 0) & (d0 <= 9)
    shape = ok & (ans[:, 0] == OPEN) & (ans[:, 3] == CLOSE) & digits
    idx = torch.arange(t, device=dev)[None, :]
    before = idx < (eos_at[:, None] - 4)
    stray = (((responses == OPEN) | (responses == CLOSE)) & before).any(1)
    valid = shape & ~stray
    gold = torch.tensor([p.answer for p in problems], dtype=torch.long, device=dev)
    correct = valid & (10 * d1 + d0 == gold)
    return valid, correct, lengths


def decode(tokens: Sequence[int]) -> str:
    return " ".join(TOKENS[t] for t in tokens if t != PAD)
