"""Jagged id lists on the host, numpy only (no Python loop per sample), and the KeyedJaggedTensors
built from them.

A jagged column is ``(lengths [n], values)``: sample ``i``'s ids are ``values[o[i]:o[i+1]]`` with
``o = [0, cumsum(lengths)]``.  The loader (data/loader.py, a multi-hot dataset) and the sharded
batches (parallel/owned.py) both build their KJTs here, in one layout: feature-major values,
``int32`` lengths ``[F*b]``, offsets of the ids' dtype (as fbgemm wants), and the per-key lengths
known on the host, so no consumer reads them back from a device.  A module of its own so both
packages use it without importing each other; torch is imported only by the functions that build
tensors (``synth`` uses the numpy ones, and a data command's start stays free of torch).
"""

from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


def host(n: int, dtype: np.dtype, pin: bool) -> torch.Tensor:
    """An uninitialized host tensor of ``n`` integers of numpy ``dtype`` (pinned when ``pin``)."""
    import torch

    return torch.empty(n, dtype=getattr(torch, np.dtype(dtype).name), pin_memory=pin)


def starts(lengths: np.ndarray) -> np.ndarray:
    """Offsets ``[n + 1]`` (int64) of lists of ``lengths``."""
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def take_lists(
    offsets: np.ndarray, values: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Lists ``rows`` (in that order) of the jagged column ``(offsets, values)``: their lengths
    (int32) and their values, concatenated; one gather, no loop over rows (lists all of one
    length, as in MLPerf's multi-hot set, are gathered as the rows of a matrix)."""
    size = np.diff(offsets)
    if len(size) and (size == size[0]).all():
        block = values[offsets[0] : offsets[-1]].reshape(len(size), int(size[0]))
        return np.full(len(rows), size[0], np.int32), block[rows].reshape(-1)
    lo = offsets[rows]
    lengths = (offsets[rows + 1] - lo).astype(np.int32)
    new = starts(lengths)
    index = np.repeat(lo - new[:-1], lengths) + np.arange(new[-1], dtype=np.int64)
    return lengths, values[index]


def segment_sums(mask: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per list of ``lengths``, how many of its elements ``mask`` (bool, over all elements) holds."""
    cum = np.zeros(len(mask) + 1, np.int64)
    np.cumsum(mask, out=cum[1:])
    o = starts(lengths)
    return (cum[o[1:]] - cum[o[:-1]]).astype(np.int32)


def assemble(
    keys: list[str],
    columns: list[tuple[np.ndarray, np.ndarray]],
    b: int,
    dtype: np.dtype,
    pin: bool,
) -> KeyedJaggedTensor:
    """One KJT of per-key jagged columns ``(lengths [b], values)`` over the same ``b`` samples
    (no keys: an empty KJT of stride ``b``), copied into one (pinned when ``pin``) tensor each."""
    counts = [len(v) for _, v in columns]
    values = host(sum(counts), dtype, pin)
    lengths = host(len(columns) * b, np.dtype(np.int32), pin)
    offsets = host(len(columns) * b + 1, dtype, pin)
    vals, lens, offs = values.numpy(), lengths.numpy(), offsets.numpy()
    at = 0
    for f, (ln, v) in enumerate(columns):
        vals[at : at + len(v)] = v
        lens[f * b : (f + 1) * b] = ln
        at += len(v)
    offs[0] = 0
    np.cumsum(lens, out=offs[1:])
    return wrap(keys, values, lengths, offsets, b, counts)


def wrap(
    keys: list[str],
    values: torch.Tensor,
    lengths: torch.Tensor,
    offsets: torch.Tensor,
    stride: int,
    counts: list[int],
) -> KeyedJaggedTensor:
    """The KJT of these tensors with the host-known per-key lengths ``counts``."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    return KeyedJaggedTensor(
        keys=keys,
        values=values,
        lengths=lengths,
        offsets=offsets,
        stride=stride,
        length_per_key=counts,
        offset_per_key=list(accumulate(counts, initial=0)),
    )


class JaggedLayout:
    """How a jagged batch's KJT travels (the loader's SparseLayout): its three tensors copied
    asynchronously (from pinned memory); the stride and the per-key lengths, known on the host,
    kept (nothing is read back from the device)."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = list(keys)

    def sparse_to(
        self, kjt: KeyedJaggedTensor, device: torch.device, copy: bool = False
    ) -> KeyedJaggedTensor:
        if kjt.values().device == device and not copy:
            return kjt
        return wrap(
            self.keys,
            kjt.values().to(device, non_blocking=True, copy=copy),
            kjt.lengths().to(device, non_blocking=True, copy=copy),
            kjt.offsets().to(device, non_blocking=True, copy=copy),
            kjt.stride(),
            list(kjt.length_per_key()),
        )
