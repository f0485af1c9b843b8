"""Batches larger than the whole dynamic region: a temporary TBE holding exactly their rows.

Slower, but correct: the planner is idle (the training thread called it and got the batch back
marked ``needs_overflow``), the device is synchronized, and nothing else is placed until the
batch retires, when its trained rows go back to their slots or to the host store.  Counted in
``overflow_batches``; the window sizing keeps normal runs out of this path.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
)
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..base import SparseOptim
from ..tbe import make_tbe, momentum_view, weights_view
from .batch import WindowBatch
from .placement import Placer, global_rows, tables_of


@dataclasses.dataclass
class _InFlight:
    tbe: SplitTableBatchedEmbeddingBagsCodegen
    optim: SparseOptim
    rows: np.ndarray  # its distinct global rows, in the temporary table's order
    slots: np.ndarray  # the slot of each (-1: not resident, in the host store)
    train: bool


class OverflowPath:
    def __init__(self, placer: Placer, optim: SparseOptim, dim: int, device: torch.device) -> None:
        self.placer = placer
        self.optim = optim
        self.dim = dim
        self.device = device

    @torch.no_grad()
    def _admit(self, rows: np.ndarray, resident: np.ndarray) -> None:
        """Still admit what fits (the best of the misses by policy), so that a cache too small for
        its batches keeps serving the hot rows.  Nothing is pinned now (the window was released)."""
        p = self.placer
        misses = rows[~resident]
        k = min(len(misses), p.slots.num_dynamic)
        if not k:
            return
        admit = p.policy.best(misses, k)
        victims = p.policy.choose(k)
        assert victims is not None  # nothing is pinned: every dynamic slot is free
        wb_slots, wb_rows = p.admit(victims, admit)
        sources = np.full(len(admit), -1)  # every write-back applied: all in the host store
        p.transfers.place(victims, admit, sources, wb_slots, wb_rows, None)
        p.transfers.sync()
        p.transfers.write_backs.settle(keep=0)

    def forward(self, b: WindowBatch, features: KeyedJaggedTensor, lr: float) -> torch.Tensor:
        try:
            return self._forward(b, features, lr)
        except BaseException as e:  # the bookkeeping may be half changed: nothing goes on
            self.placer.broken = e
            raise

    def _forward(self, b: WindowBatch, features: KeyedJaggedTensor, lr: float) -> torch.Tensor:
        p, a = self.placer, b.analysis
        assert a is not None  # analysed
        p.counters.add("overflow_batches", 1)
        p.transfers.sync()
        p.transfers.write_backs.settle(keep=0)
        grow = global_rows(a, p.row_off)
        first, inverse = p.slots.dedup_rows(grow)
        rows = grow[first]
        slots = p.slots.row_slot[rows].astype(np.int64)
        resident = slots >= 0
        missed = np.bincount(
            tables_of(np.flatnonzero(~resident[inverse]), a.table_accesses),
            minlength=len(a.table_accesses),
        )
        p.counters.forwarded(
            a.table_accesses, a.table_accesses - missed, len(rows), int(resident.sum())
        )
        self._admit(rows, resident)
        slots = p.slots.row_slot[rows].astype(np.int64)
        resident = slots >= 0
        held = slots >= p.slots.num_static
        p.used(rows[held], slots[held])
        optim = dataclasses.replace(self.optim, lr=lr)
        tbe = make_tbe(
            [len(rows)], self.dim, optim, self.device, feature_table_map=[0] * len(a.table_accesses)
        )
        records = torch.empty((len(rows), p.store.record_cols), device=self.device)
        if resident.any():
            records[p.transfers.index(np.flatnonzero(resident))] = p.transfers.slot_records(
                slots[resident]
            )
        if (~resident).any():
            records[p.transfers.index(np.flatnonzero(~resident))] = p.transfers.host_records(
                rows[~resident]
            )
        _set_records(tbe, optim, self.dim, records)
        p.counters.add("rows_loaded", int((~resident).sum()))
        b.overflow = _InFlight(tbe, optim, rows, slots, torch.is_grad_enabled())
        indices = p.transfers.index(inverse)
        offsets = features.offsets().to(self.device, dtype=torch.int64)
        return tbe(indices, offsets)

    def retire(self, b: WindowBatch) -> None:
        """After ``b``'s backward: its trained rows back to their slots or the host store."""
        try:
            self._retire(b)
        except BaseException as e:  # rows may be lost: nothing goes on
            self.placer.broken = e
            raise

    @torch.no_grad()
    def _retire(self, b: WindowBatch) -> None:
        o, b.overflow = b.overflow, None
        if not o.train:
            return
        p = self.placer
        p.transfers.sync()
        records = _get_records(o.tbe, o.optim, self.dim)
        res = o.slots >= 0
        if res.any():
            idx = p.transfers.index(np.flatnonzero(res))
            p.transfers.to_slots(o.slots[res], records[idx])
            p.slots.dirty[o.slots[res]] = True
            p.slots.static_dirty = True
        if (~res).any():
            idx = p.transfers.index(np.flatnonzero(~res))
            p.transfers.to_host(o.rows[~res], records[idx])
            p.counters.add("rows_written_back", int((~res).sum()))
        p.transfers.sync()


def _set_records(tbe, optim: SparseOptim, dim: int, records: torch.Tensor) -> None:
    tw, tm = weights_view(tbe, dim), momentum_view(tbe, optim, dim)
    tw.copy_(records[:, :dim])
    if tm is not None:
        tm.copy_(records[:, dim:].reshape(tm.shape))


def _get_records(tbe, optim: SparseOptim, dim: int) -> torch.Tensor:
    tw, tm = weights_view(tbe, dim), momentum_view(tbe, optim, dim)
    if tm is None:
        return tw
    return torch.cat([tw, tm.reshape(tw.shape[0], -1)], dim=1)
