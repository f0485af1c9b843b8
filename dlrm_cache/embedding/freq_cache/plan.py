"""Hit-rate predictions from dataset counts: what a cache of a given size can achieve.

A static frequency cache holding the ``k`` most frequent rows serves exactly the accesses to those
rows; on i.i.d. batches that is also what the ``freq`` policy converges to (its dynamic region keeps
the highest-count rows seen, plus the current batches' cold rows).  The freq_cache pools its slots
over all tables (see backend.py), so its prediction is the top-``sum(cache_rows)`` rows over the
concatenated counts; the per-table numbers are what separate per-table caches would get.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np


def _as_counts(counts) -> np.ndarray:
    c = counts.detach().cpu().numpy() if hasattr(counts, "detach") else np.asarray(counts)
    return c.astype(np.float64, copy=False).reshape(-1)


def predict_hit_rate(counts, cache_rows: int) -> float:
    """Fraction of all accesses that go to the ``cache_rows`` most frequent rows."""
    c = _as_counts(counts)
    total = c.sum()
    if total <= 0 or cache_rows <= 0:
        return 0.0
    k = min(int(cache_rows), c.size)
    top = np.partition(c, c.size - k)[c.size - k:] if k < c.size else c
    return float(top.sum() / total)


def cache_rows_for(num_rows: int, ratio: float) -> int:
    """The slots a table contributes to the cache at ``ratio`` (as the backend sizes it)."""
    return min(num_rows, max(1, math.ceil(ratio * num_rows - 1e-9)))


def plan_table(counts_by_table: Mapping[str, object], ratios: Sequence[float]) -> list[dict]:
    """One dict per ratio: ``ratio``, ``cache_rows`` (all tables), ``hit_rate`` (pooled cache, what
    the freq_cache predicts), ``hit_rate_per_table_caches`` and ``per_table`` {name: hit rate}."""
    tables = {name: _as_counts(c) for name, c in counts_by_table.items()}
    flat = np.concatenate(list(tables.values())) if tables else np.zeros(0)
    total = flat.sum()
    out = []
    for r in ratios:
        if not 0 < r <= 1:
            raise ValueError(f"cache ratio {r}: must be in (0, 1]")
        rows = {n: cache_rows_for(c.size, r) for n, c in tables.items()}
        per = {n: predict_hit_rate(c, rows[n]) for n, c in tables.items()}
        weighted = sum(per[n] * c.sum() for n, c in tables.items()) / total if total > 0 else 0.0
        k = sum(rows.values())
        out.append(
            dict(
                ratio=float(r),
                cache_rows=int(k),
                hit_rate=predict_hit_rate(flat, k),
                hit_rate_per_table_caches=float(weighted),
                per_table=per,
            )
        )
    return out
