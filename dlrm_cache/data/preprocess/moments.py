"""Exact sums for ``standardize`` columns: the mean and std of the training split's values, the same
however the rows were cut into parts or counted by workers (float sums would depend on the order).

A float32 value is m * 2**e with m an integer of 24 bits; per exponent the mantissas (and the
squares' 24-bit halves) are summed as int64, then combined exactly as fractions.  The std is the
population std, sqrt(E[x**2] - E[x]**2) rounded once to float64; a constant column gets std 1.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

Sums = tuple[int, Fraction, Fraction]  # (count, sum of x, sum of x**2), exact


def exact_sums(x: np.ndarray) -> Sums:
    """Exact (n, sum, sum of squares) of float32 values."""
    frac, exp = np.frexp(np.asarray(x, dtype=np.float64))
    m = np.round(frac * (1 << 24)).astype(np.int64)  # exact: float32 has 24 mantissa bits
    e = exp.astype(np.int64) - 24
    sq = m * m  # < 2**48: exact in int64; split so that per-exponent sums cannot overflow
    total = _sum_by_exponent(m, e)
    squares = _sum_by_exponent(sq >> 24, 2 * e + 24) + _sum_by_exponent(sq & 0xFFFFFF, 2 * e)
    return len(m), total, squares


def _sum_by_exponent(m: np.ndarray, e: np.ndarray) -> Fraction:
    out = Fraction(0)
    for k in np.unique(e):
        out += int(m[e == k].sum()) * Fraction(2) ** int(k)
    return out


def add(a: Sums, b: Sums) -> Sums:
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]


def mean_std(s: Sums) -> list[float]:
    """[mean, std] of the summed values (std 1 when it is 0 or there are no values)."""
    n, total, squares = s
    if n == 0:
        return [0.0, 1.0]
    mean = total / n
    var = squares / n - mean * mean
    std = math.sqrt(float(var)) if var > 0 else 0.0
    return [float(mean), std if std > 0 else 1.0]
