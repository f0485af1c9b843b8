"""The freq_cache's settings and dataset counts, checked before a byte is allocated."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..base import TableSpec
from .scores import POLICIES


def check_settings(
    cache_ratio: Any,
    policy: str,
    static_fraction: float,
    lookahead: Any,
    batch_size: Any,
    planner_threads: Any,
    counts: Any,
) -> None:
    """One line naming the key for the first setting out of its range."""
    if not (isinstance(cache_ratio, (int, float)) and 0 < cache_ratio <= 1):
        raise ValueError(f"embedding.cache_ratio={cache_ratio!r}: must be in (0, 1]")
    if policy not in POLICIES:
        raise ValueError(f"embedding.policy={policy!r}: choose one of {list(POLICIES)}")
    if not 0 <= static_fraction <= 1:
        raise ValueError(f"embedding.static_fraction={static_fraction!r}: must be in [0, 1]")
    if int(lookahead) != lookahead or lookahead < 0:
        raise ValueError(f"embedding.lookahead={lookahead!r}: must be an integer >= 0")
    if int(batch_size) != batch_size or batch_size < 0:
        raise ValueError(f"embedding.batch_size={batch_size!r}: must be an integer >= 0")
    if int(planner_threads) != planner_threads or planner_threads < 0:
        raise ValueError(
            f"embedding.planner_threads={planner_threads!r}: must be an integer >= 0 (0: auto)"
        )
    if policy == "freq" and counts is None:
        raise ValueError(
            "embedding.policy='freq' ranks rows by their dataset access counts, but no counts "
            "were given (the trainer reads them from the dataset's stats/counts.parquet); use "
            "embedding.policy=lfu or lru without them"
        )


def flatten_counts(tables: list[TableSpec], counts: dict[str, Any]) -> np.ndarray:
    """Per-row dataset counts of every table, concatenated in table order (float64)."""
    parts = []
    for t in tables:
        if t.name not in counts or counts[t.name] is None:
            raise ValueError(f"embedding counts: no per-row counts for table {t.name}")
        c = counts[t.name]
        c = c.detach().cpu().numpy() if isinstance(c, torch.Tensor) else np.asarray(c)
        if c.ndim != 1 or c.shape[0] != t.num_rows:
            raise ValueError(
                f"embedding counts for table {t.name}: {c.shape[0] if c.ndim == 1 else c.shape} "
                f"entries but the table has {t.num_rows} rows (dataset stats and "
                "manifest disagree: preprocess again)"
            )
        if c.size and c.min() < 0:
            raise ValueError(f"embedding counts for table {t.name}: negative counts")
        parts.append(c.astype(np.float64))
    return np.concatenate(parts)
