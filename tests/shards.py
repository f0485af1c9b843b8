"""Test datasets' shards: each split's tables written as ``<split>/part-00000.parquet``, ... (the
layout a processed dataset has), with the manifest's record of them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa

from dlrm_cache.data.format import SplitInfo
from dlrm_cache.data.parquet import write_parquet


def write_split(
    root: Path,
    split: str,
    tables: Iterable[dict[str, Any]],
    write: Callable[[pa.Table, Path], None] = write_parquet,
) -> SplitInfo:
    """Every table of ``tables`` (columns by name) as the next shard of ``split`` under ``root``,
    written by ``write``; returns the split's manifest entry."""
    (root / split).mkdir(parents=True, exist_ok=True)
    shards, counts = [], []
    for k, columns in enumerate(tables):
        table = pa.table(columns)
        rel = f"{split}/part-{k:05d}.parquet"
        write(table, root / rel)
        shards.append(rel)
        counts.append(table.num_rows)
    return SplitInfo(rows=sum(counts), shards=shards, shard_rows=counts)
