"""Intervals the engine reports: the mean of per-seed values with its two-sided 95% Student-t interval."""

from __future__ import annotations

import math
from collections.abc import Mapping

# two-sided 95% Student-t quantiles by degrees of freedom (1..30); the expansion below beyond
_T95 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


_Z975 = 1.959963984540054
"""the normal quantile of 0.975"""


def t95(df: int) -> float:
    """The two-sided 95% Student-t quantile at ``df`` degrees of freedom (df >= 1): tabulated to 30,
    beyond it the Cornish-Fisher expansion in 1/df (within 1e-6 of the exact quantile there; the
    normal 1.96 it replaced is 4% low at 31 degrees of freedom and 2% low at 52)."""
    if df < 1:
        raise ValueError(f"a Student-t quantile needs at least 1 degree of freedom, got {df}")
    if df <= len(_T95):
        return _T95[df - 1]
    z = _Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


Z80 = 0.8416
"""the normal quantile of 0.80: the power term of :func:`seeds_to_resolve`"""


SEEDS_LIMIT = 10_000
"""the most paired seeds :func:`seeds_to_resolve` counts to (beyond it: no practical number)"""


def seeds_to_resolve(diff: float, sd: float, limit: int = SEEDS_LIMIT) -> int | None:
    """Paired seeds at which a real difference ``diff`` with paired SD ``sd`` comes out beyond the
    95% Student-t interval in 80% of evaluations: the smallest n >= 2 with
    (t95(n - 1) + Z80) * sd / sqrt(n) <= |diff| (the power term in its normal approximation). None
    for a zero difference, or beyond ``limit``; 2 for a zero SD."""
    if diff == 0:
        return None
    if sd <= 0:
        return 2
    for n in range(2, limit + 1):
        if (t95(n - 1) + Z80) * sd / math.sqrt(n) <= abs(diff):
            return n
    return None


_CHI2_LOW10 = (0.0158, 0.2107, 0.5844, 1.0636, 1.6103, 2.2041, 2.8331, 3.4895, 4.1682, 4.8652)
"""the 10% quantile of chi-square with 1..10 degrees of freedom"""


def chi2_low10(df: int) -> float:
    """The 10% quantile of chi-square with ``df`` degrees of freedom: tabulated to 10, the
    Wilson-Hilferty approximation beyond (within 0.1% there)."""
    if df < 1:
        raise ValueError(f"chi-square needs at least 1 degree of freedom, got {df}")
    if df <= len(_CHI2_LOW10):
        return _CHI2_LOW10[df - 1]
    a = 2 / (9 * df)
    return df * (1 - a - 1.2815516 * math.sqrt(a)) ** 3


def sd_upper90(sd: float, n: int) -> float:
    """The one-sided 90% upper confidence bound of a normal SD estimated as ``sd`` from ``n``
    values: sd * sqrt((n - 1) / chi2_0.10(n - 1)). From 2 values it is 8 times ``sd``."""
    return sd * math.sqrt((n - 1) / chi2_low10(n - 1))


def mean_interval(values: list[float]) -> tuple[float, list[float] | None]:
    """Mean and the 95% Student-t interval of the mean (None for a single value)."""
    n = len(values)
    m = sum(values) / n
    if n < 2:
        return m, None
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    h = t95(n - 1) * sd / math.sqrt(n)
    return m, [m - h, m + h]


def paired_differences(values: Mapping[int, float], ref: Mapping[int, float]) -> list[float]:
    """``values[s] - ref[s]`` over the seeds both have, in seed order."""
    return [values[s] - ref[s] for s in sorted(set(values) & set(ref))]


def paired_interval(
    values: Mapping[int, float], ref: Mapping[int, float]
) -> tuple[float, list[float] | None, int] | None:
    """Mean and 95% interval of ``values[s] - ref[s]`` over the seeds both have, with the number of
    those seeds; None when they share none. Paired seeds share prompts and sampling noise, so this
    resolves far smaller differences than the two means' own intervals."""
    diffs = paired_differences(values, ref)
    if not diffs:
        return None
    mean, iv = mean_interval(diffs)
    return mean, iv, len(diffs)


def tail_mean(values) -> float | None:
    """The mean of a training series over its last third (its finite numbers from index
    ``2 n // 3`` on), where a run has settled; None for fewer than 3 numbers."""
    vals = [
        float(v)
        for v in values or ()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ]
    if len(vals) < 3:
        return None
    tail = vals[len(vals) * 2 // 3 :]
    return math.fsum(tail) / len(tail)


def tail_means(trajectory: Mapping[str, object]) -> dict[str, float]:
    """:func:`tail_mean` of every series of a training trajectory (``step`` aside) that has one."""
    out = {}
    for key, vals in trajectory.items():
        if key != "step" and isinstance(vals, (list, tuple)):
            m = tail_mean(vals)
            if m is not None:
                out[key] = m
    return out


def ranks(xs: list[float]) -> list[float]:
    """Average ranks (1 = smallest), ties sharing their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def pearson(a: list[float], b: list[float]) -> float:
    """Pearson's correlation of two equally long series (nan when either is constant)."""
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    var = math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b))
    return cov / var if var else float("nan")


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (Pearson correlation of average ranks)."""
    return pearson(ranks(a), ranks(b))
