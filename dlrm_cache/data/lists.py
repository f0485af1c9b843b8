"""A multi-hot shard's ids as the loader keeps them: one jagged column per feature.

A dataset whose manifest lists ``multi_hot`` features stores those as parquet list columns (any
length per sample, 0 included) and the others as one id per sample; the loader treats every
feature of such a dataset as a list (a one-hot feature's lists have length 1), so one code path
builds its batches.  A shard is shuffled with one gather per column (:func:`~..jagged.take_lists`:
numpy over lengths and offsets, no loop per row), and rows are then sliced without copying:
:meth:`Lists.rows` keeps the values and narrows the offsets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..embedding.jagged import starts, take_lists


@dataclass
class Lists:
    """Rows of one shard, every feature jagged: row ``i``'s ids of feature ``f`` are
    ``values[f][offsets[f][i]:offsets[f][i + 1]]`` (offsets int64, absolute into ``values[f]``)."""

    offsets: list[np.ndarray]  # per feature, [rows + 1]
    values: list[np.ndarray]  # per feature, the ids (the batch's dtype)

    def __len__(self) -> int:
        return len(self.offsets[0]) - 1 if self.offsets else 0

    def rows(self, lo: int, hi: int) -> Lists:
        """Rows ``[lo, hi)`` (views: nothing is copied)."""
        return Lists([o[lo : hi + 1] for o in self.offsets], self.values)

    def column(self, f: int) -> tuple[np.ndarray, np.ndarray]:
        """Feature ``f`` of these rows as ``(lengths int32, values)`` (values a view)."""
        o = self.offsets[f]
        return np.diff(o).astype(np.int32), self.values[f][o[0] : o[-1]]


def read_lists(
    table: pa.Table,
    names: list[str],
    multi_hot: set[str],
    perm: np.ndarray | None,
    dtype: np.dtype,
) -> Lists:
    """Columns ``names`` of a shard ``table`` as jagged columns of ``dtype`` ids, in the row order
    ``perm`` (None: as stored).  A column in ``multi_hot`` is a list column, any other holds one
    id per sample (the caller checked both, :func:`~.idrange.check_ids`)."""
    offsets, values = [], []
    n = table.num_rows
    for name in names:
        col = table.column(name)
        if name in multi_hot:
            arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
            o = arr.offsets.to_numpy().astype(np.int64)
            v = arr.values.to_numpy().astype(dtype, copy=False)
        else:
            o = np.arange(n + 1, dtype=np.int64)
            v = col.to_numpy().astype(dtype, copy=False)
        if perm is not None:
            lengths, v = take_lists(o, v, perm)
            o = starts(lengths)
        offsets.append(o)
        values.append(v)
    return Lists(offsets, values)


def concat_columns(
    pieces: list[Lists], features: int, dtype: np.dtype
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per feature, the jagged column ``(lengths, values)`` of consecutive row ``pieces`` (no
    pieces: empty columns of ``dtype`` ids)."""
    out = []
    for f in range(features):
        cols = [p.column(f) for p in pieces]
        if not cols:
            out.append((np.empty(0, np.int32), np.empty(0, dtype)))
        elif len(cols) == 1:
            out.append(cols[0])
        else:
            out.append((np.concatenate([c[0] for c in cols]), np.concatenate([c[1] for c in cols])))
    return out
