"""The range check of a shard's ids, shared by the loader (as it reads a shard) and ``verify``:
in a module of its own, without torch, so that ``verify`` (whose schema the dispatcher registers)
keeps the command line's start free of torch's import."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc


def check_ids(
    table: pa.Table,
    path: Path,
    names: list[str],
    sizes: list[int],
    multi_hot: Sequence[str] = (),
) -> None:
    """Every id of columns ``names`` inside its table of ``sizes`` rows, from the values as stored
    (statistics can lie; a cast to int32 could wrap): checked as a shard is read, before any
    placement sees them, so the error names the shard under every placement.  A column of
    ``multi_hot`` must be a list column without nulls (every element is checked), any other
    a column of integers (one id per sample)."""
    for name, size in zip(names, sizes):
        col = table.column(name)
        if name in multi_hot:
            if not pa.types.is_list(col.type) or col.null_count:
                raise ValueError(
                    f"{path}: column {name} is not a list of ids per sample without nulls "
                    f"(the manifest says multi-hot; found {col.type}); preprocess again"
                )
            col = pc.list_flatten(col)
        elif not pa.types.is_integer(col.type):
            raise ValueError(
                f"{path}: column {name} holds {col.type}, not one integer id per sample "
                "(the manifest does not list it as multi-hot); preprocess again"
            )
        if len(col) == 0:
            continue
        low, high = pc.min_max(col).values()
        low, high = low.as_py(), high.as_py()
        if low is None or low < 0 or high >= size:
            bad = low if low is None or low < 0 else high
            raise ValueError(
                f"{path}: column {name} holds ids outside [0, {size}) "
                f"(id {bad}: shard and manifest do not match; preprocess again)"
            )
