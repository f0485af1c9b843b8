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

from itertools import accumulate

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from .placement import Shard


def rank_rows(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of a global batch of ``n`` rows that ``rank`` of ``world`` trains on."""
    return (n * rank) // world, (n * (rank + 1)) // world


def rank_sizes(n: int, world: int) -> list[int]:
    """Every rank's number of rows of a global batch of ``n`` rows, in rank order."""
    return [hi - lo for lo, hi in (rank_rows(n, r, world) for r in range(world))]


class OwnedShards:
    """KeyedJaggedTensors of one rank's shards over whole global batches (a sharded batch's ids).

    Keys are the shard names in the order given (the order of the rank's local embedding tables).
    A whole-table shard holds every sample's id (length 1 each); a row range ``[lo, hi)`` holds the
    ids inside it, relative to ``lo``: length 1 for a sample whose id falls inside, else 0.  The
    stride is the global batch size, and the per-key lengths are known on the host, so no consumer
    has to read them back from a device.
    """

    def __init__(self, features: list[str], shards: list[Shard]) -> None:
        index = {f: j for j, f in enumerate(features)}
        unknown = [s.table for s in shards if s.table not in index]
        if unknown:
            raise ValueError(
                f"shard of table {unknown[0]!r}, which is not a feature of the dataset"
            )
        self.shards = list(shards)
        self.keys = [s.name for s in shards]
        self._columns = [index[s.table] for s in shards]

    def kjt(self, pieces: list[np.ndarray], pin: bool = False) -> KeyedJaggedTensor:
        """The KJT of a global batch given as consecutive row pieces of ids ``[features, rows]``
        (host tensors, pinned when ``pin``; offsets take the ids' dtype, as fbgemm wants)."""
        n = sum(p.shape[1] for p in pieces)
        dtype = pieces[0].dtype if pieces else np.dtype(np.int64)
        values: list[np.ndarray] = []
        inside: list[np.ndarray | None] = []
        for s, j in zip(self.shards, self._columns):
            col = pieces[0][j] if len(pieces) == 1 else np.concatenate([p[j] for p in pieces])
            if (s.lo, s.hi) == (0, s.rows_in_table):
                values.append(col)
                inside.append(None)
            else:
                mask = (col >= s.lo) & (col < s.hi)
                values.append(col[mask] - np.asarray(s.lo, dtype))
                inside.append(mask)
        counts = [len(v) for v in values]
        out_values = _host(sum(counts), dtype, pin)
        out_lengths = _host(len(self.shards) * n, np.dtype(np.int32), pin)
        out_offsets = _host(len(self.shards) * n + 1, dtype, pin)
        vals, lens, offs = out_values.numpy(), out_lengths.numpy(), out_offsets.numpy()
        at = 0
        for f, (v, mask) in enumerate(zip(values, inside)):
            vals[at : at + len(v)] = v
            lens[f * n : (f + 1) * n] = 1 if mask is None else mask
            at += len(v)
        offs[0] = 0
        np.cumsum(lens, out=offs[1:])
        return self._wrap(out_values, out_lengths, out_offsets, n, counts)

    def _wrap(
        self,
        values: torch.Tensor,
        lengths: torch.Tensor,
        offsets: torch.Tensor,
        n: int,
        counts: list[int],
    ) -> KeyedJaggedTensor:
        return KeyedJaggedTensor(
            keys=self.keys,
            values=values,
            lengths=lengths,
            offsets=offsets,
            stride=n,
            length_per_key=counts,
            offset_per_key=list(accumulate(counts, initial=0)),
        )

    def sparse_to(
        self, kjt: KeyedJaggedTensor, device: torch.device, copy: bool = False
    ) -> KeyedJaggedTensor:
        """``kjt`` on ``device``: its three tensors copied asynchronously (from pinned memory), the
        host-known stride and per-key lengths kept (nothing is read back from the device)."""
        if kjt.values().device == device and not copy:
            return kjt
        return self._wrap(
            kjt.values().to(device, non_blocking=True, copy=copy),
            kjt.lengths().to(device, non_blocking=True, copy=copy),
            kjt.offsets().to(device, non_blocking=True, copy=copy),
            kjt.stride(),
            list(kjt.length_per_key()),
        )


_TORCH_INT = {np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64}


def _host(n: int, dtype: np.dtype, pin: bool) -> torch.Tensor:
    return torch.empty(n, dtype=_TORCH_INT[dtype], pin_memory=pin)
