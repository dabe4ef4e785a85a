"""Scores of the math6 protocol: unbiased pass@k, the weighted Overall, word-count length, bootstrap intervals."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# Overall = 0.2*AIME24 + 0.2*AIME25 + 0.15*(AMC + MATH-500 + Minerva + OlympiadBench), percentage points.
MATH6_WEIGHTS: dict[str, float] = {
    "aime24": 0.2,
    "aime25": 0.2,
    "amc": 0.15,
    "math500": 0.15,
    "minerva": 0.15,
    "olympiadbench": 0.15,
}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021): 1 - C(n-c, k) / C(n, k), as a stable product.

    ``n`` samples of which ``c`` are correct; ``k <= n``. Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i).
    """
    n, c, k = int(n), int(c), int(k)
    if n < 1 or k < 1 or k > n or c < 0 or c > n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def math6_overall(scores: Mapping[str, float]) -> float:
    """0.2*aime24 + 0.2*aime25 + 0.15*(amc + math500 + minerva + olympiadbench); the keys of
    :data:`MATH6_WEIGHTS`, in percentage points (returns the same unit)."""
    missing = [k for k in MATH6_WEIGHTS if k not in scores]
    if missing:
        raise ValueError(f"overall needs scores for {', '.join(missing)}")
    return float(sum(w * float(scores[k]) for k, w in MATH6_WEIGHTS.items()))


def word_count(text: str) -> int:
    """Length of a response in whitespace-separated words."""
    return len(str(text).split())


def mean_length(lengths: Mapping[str, float]) -> float:
    """Unweighted mean of the per-benchmark mean word counts."""
    if not lengths:
        raise ValueError("mean_length needs at least one benchmark")
    return float(sum(lengths.values()) / len(lengths))


def bootstrap_scores(per_problem: Mapping[str, Sequence[float]], n_boot: int = 1000, seed: int = 0):
    """Resample problems with replacement, independently per benchmark: ``{key: array[n_boot]}`` of
    bootstrap means (same unit as ``per_problem``)."""
    import numpy as np  # lazy: numpy is heavy (only this path needs it)

    rng = np.random.default_rng(seed)
    out = {}
    for key in sorted(per_problem):
        x = np.asarray(per_problem[key], dtype=float)
        if x.size == 0:
            raise ValueError(f"no problems for {key!r}")
        idx = rng.integers(0, x.size, size=(n_boot, x.size))
        out[key] = x[idx].mean(axis=1)
    return out


def bootstrap_intervals(
    per_problem: Mapping[str, Sequence[float]],
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    with_overall: bool = True,
) -> dict[str, list[float]]:
    """Percentile intervals ``{key: [lo, hi]}`` for each benchmark mean, and for Overall (over the
    same replicates) when every Overall key is present."""
    import numpy as np  # lazy: numpy is heavy (only this path needs it)

    boots = bootstrap_scores(per_problem, n_boot=n_boot, seed=seed)
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    out = {k: [float(v) for v in np.percentile(b, q)] for k, b in boots.items()}
    if with_overall and all(k in boots for k in MATH6_WEIGHTS):
        ov = sum(w * boots[k] for k, w in MATH6_WEIGHTS.items())
        out["overall"] = [float(v) for v in np.percentile(ov, q)]
    return out


def suite_metric_unit(key: str) -> str:
    """The unit of a suite metric: benchmark scores and Overall in percentage points, lengths in words,
    valid rates a fraction, grader failures a count."""
    if key.endswith("mean_length"):
        return "words"
    if key.endswith("valid_rate"):
        return "fraction"
    if key == "grader_failures":
        return "count"
    return "percent"
