"""The range check of a shard's ids, shared by the loader (as it reads a shard) and ``verify``:
in a module of its own, without torch, so that ``verify`` (whose schema the dispatcher registers)
keeps the command line's start free of torch's import."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc


def check_ids(table: pa.Table, path: Path, names: list[str], sizes: list[int]) -> None:
    """Every id of columns ``names`` inside its table of ``sizes`` rows, from the values as stored
    (statistics can lie; a cast to int32 could wrap): checked as a shard is read, before any
    placement sees them, so the error names the shard under every placement."""
    if table.num_rows == 0:
        return
    for name, size in zip(names, sizes):
        low, high = pc.min_max(table.column(name)).values()
        low, high = low.as_py(), high.as_py()
        if low is None or low < 0 or high >= size:
            bad = low if low is None or low < 0 else high
            raise ValueError(
                f"{path}: column {name} holds ids outside [0, {size}) "
                f"(id {bad}: shard and manifest do not match; preprocess again)"
            )
