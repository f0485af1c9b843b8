"""What one rank holds of a global batch: its rows for the dense part, its shards' ids for all rows.

Data parallel: rank ``r`` of ``W`` trains on rows ``rank_rows(n, r, W)`` of a global batch of ``n``
rows (contiguous, as even as possible; an evaluation batch may split unevenly, a share may be
empty).  Model parallel: the rank owns shards of the embedding tables (whole tables or row ranges,
see plan.py) and looks up *every* sample's ids in them.  Every rank's loader decodes each global
batch whole anyway, so it keeps its own shards' ids for all ``n`` rows (:class:`OwnedShards`, numpy
on the loader thread).  At step time no ids and no id counts travel between ranks, and the sizes of
the pooled exchange follow from ``n`` and ``W`` alone: the step reads nothing back from a device.
"""

from __future__ import annotations

import numpy as np
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..embedding.jagged import JaggedLayout, assemble, segment_sums
from .placement import Shard


def rank_rows(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of a global batch of ``n`` rows that ``rank`` of ``world`` trains on."""
    return (n * rank) // world, (n * (rank + 1)) // world


def rank_sizes(n: int, world: int) -> list[int]:
    """Every rank's number of rows of a global batch of ``n`` rows, in rank order."""
    return [hi - lo for lo, hi in (rank_rows(n, r, world) for r in range(world))]


class OwnedShards(JaggedLayout):
    """KeyedJaggedTensors of one rank's shards over whole global batches (a sharded batch's ids).

    Keys are the shard names in the order given (the order of the rank's local embedding tables).
    A whole-table shard holds every sample's ids (one each in a one-hot dataset, the lists in a
    multi-hot one); a row range ``[lo, hi)`` holds the ids inside it, relative to ``lo``, so a
    sample's length is how many of its ids fall inside (0 or 1 for one-hot).  The stride is the
    global batch size, and the per-key lengths are known on the host, so no consumer has to read
    them back from a device (:class:`~dlrm_cache.embedding.jagged.JaggedLayout` moves the batch).
    """

    def __init__(self, features: list[str], shards: list[Shard]) -> None:
        index = {f: j for j, f in enumerate(features)}
        unknown = [s.table for s in shards if s.table not in index]
        if unknown:
            raise ValueError(
                f"shard of table {unknown[0]!r}, which is not a feature of the dataset"
            )
        self.shards = list(shards)
        super().__init__([s.name for s in shards])
        self._columns = [index[s.table] for s in shards]

    def kjt(self, pieces: list[np.ndarray], pin: bool = False) -> KeyedJaggedTensor:
        """The KJT of a global batch given as consecutive row pieces of ids ``[features, rows]``
        (one id per sample; host tensors, pinned when ``pin``; offsets take the ids' dtype, as
        fbgemm wants)."""
        n = sum(p.shape[1] for p in pieces)
        dtype = pieces[0].dtype if pieces else np.dtype(np.int64)
        ones = np.ones(n, np.int32)
        columns = []
        for s, j in zip(self.shards, self._columns):
            col = pieces[0][j] if len(pieces) == 1 else np.concatenate([p[j] for p in pieces])
            if (s.lo, s.hi) == (0, s.rows_in_table):
                columns.append((ones, col))
            else:  # one id per sample: its length is whether it falls inside
                mask = (col >= s.lo) & (col < s.hi)
                columns.append((mask.astype(np.int32), col[mask] - np.asarray(s.lo, dtype)))
        return assemble(self.keys, columns, n, np.dtype(dtype), pin)

    def kjt_lists(
        self, features: list[tuple[np.ndarray, np.ndarray]], dtype: np.dtype, pin: bool = False
    ) -> KeyedJaggedTensor:
        """The KJT of a global batch given per feature of the dataset as a jagged column
        ``(lengths [n], values)`` of ids of numpy ``dtype``."""
        columns = []
        n = len(features[0][0])
        for s, j in zip(self.shards, self._columns):
            lengths, values = features[j]
            if (s.lo, s.hi) == (0, s.rows_in_table):
                columns.append((lengths, values))
            else:
                mask = (values >= s.lo) & (values < s.hi)
                inside = (values[mask] - np.asarray(s.lo, values.dtype)).astype(dtype, copy=False)
                columns.append((segment_sums(mask, lengths), inside))
        return assemble(self.keys, columns, n, np.dtype(dtype), pin)
