"""A batch of torchrec inputs (:class:`Batch`: dense features, a KeyedJaggedTensor of ids, labels)
and how its ids travel to a device (:class:`SparseLayout`); :class:`OneIdPerSample` builds the
KJT of a batch with one id per sample and feature once per batch size.

What the loader (:mod:`.loader`) yields, `predict`'s raw input is batched into, and the trainer and
bench step over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


class SparseLayout(Protocol):
    """How a batch's KeyedJaggedTensor is built (by the loader) and moved to a device."""

    def sparse_to(
        self, kjt: KeyedJaggedTensor, device: torch.device, copy: bool = False
    ) -> KeyedJaggedTensor:
        """``kjt`` on ``device``, copied asynchronously from pinned memory (``copy``: even where it
        already is on ``device``)."""
        ...


@dataclass
class Batch:
    dense: torch.Tensor  # [b, 13] float32: this rank's rows
    # every feature's ids of this rank's rows (int32 ids unless a table needs int64): one per
    # sample, or lists in a multi-hot dataset; under sharded embeddings: this rank's shards over
    # the whole global batch (OwnedShards)
    sparse: KeyedJaggedTensor
    labels: torch.Tensor  # [b] float32
    layout: SparseLayout | None = None  # how ``sparse`` travels; None: all of its tensors
    # the shards (paths in the dataset) the rows of its global batch came from: what an error
    # about this batch names (the same on every rank, whatever the placement)
    source: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return self.labels.numel()

    def to(self, device: torch.device, copy: bool = False) -> Batch:
        """This batch on ``device``: asynchronous copies (from pinned memory), nothing read back;
        the source stays attached.  ``copy``: new tensors even where the batch
        already is on ``device`` (the tests' stream recorder sees the copy)."""
        if self.layout is not None:
            sparse = self.layout.sparse_to(self.sparse, device, copy)
        else:
            sparse = self.sparse.to(device, non_blocking=True)
        return Batch(
            self.dense.to(device, non_blocking=True, copy=copy),
            sparse,
            self.labels.to(device, non_blocking=True, copy=copy),
            self.layout,
            self.source,
        )


class OneIdPerSample:
    """KeyedJaggedTensors of batches with exactly one id per sample and feature.

    Lengths (all 1) and offsets (0..n) depend only on the batch size and the device, so they are
    built once per pair and shared by every batch (also across threads: they are never written).
    """

    def __init__(self, keys: list[str]) -> None:
        self.keys = list(keys)
        self._layouts: dict[
            tuple[int, torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]
        ] = {}

    def kjt(self, ids: torch.Tensor) -> KeyedJaggedTensor:
        """``ids`` [features, b] (feature-major, contiguous) as a KJT on their own device."""
        f, b = ids.shape
        if f != len(self.keys):
            raise ValueError(f"{f} id rows for {len(self.keys)} features")
        key = (b, ids.device, ids.dtype)
        layout = self._layouts.get(key)
        if layout is None:
            # fbgemm wants offsets of the ids' dtype; lengths stay int32 as torchrec makes them
            lengths = torch.ones(f * b, dtype=torch.int32, device=ids.device)
            offsets = torch.arange(f * b + 1, dtype=ids.dtype, device=ids.device)
            layout = self._layouts.setdefault(key, (lengths, offsets))
        return KeyedJaggedTensor(
            keys=self.keys,
            values=ids.reshape(-1),
            lengths=layout[0],
            offsets=layout[1],
            stride=b,
            length_per_key=[b] * f,  # known: saves a reduction over the lengths per consumer
            offset_per_key=[b * i for i in range(f + 1)],
        )

    def batch(self, dense: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor) -> Batch:
        return Batch(dense, self.kjt(ids), labels, layout=self)

    def sparse_to(
        self, kjt: KeyedJaggedTensor, device: torch.device, copy: bool = False
    ) -> KeyedJaggedTensor:
        """Only the ids travel (asynchronously): the lengths and offsets of that batch size
        already live on ``device``."""
        if kjt.values().device == device and not copy:
            return kjt
        ids = kjt.values().view(len(self.keys), kjt.stride())
        return self.kjt(ids.to(device, non_blocking=True, copy=copy))
