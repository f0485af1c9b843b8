"""Batches that do not fit even with nothing else placed: a temporary TBE holding exactly their rows.

Slower, but correct: the planner is idle (the training thread called it and got the batch back
marked ``needs_overflow``), the device is synchronized and host reads are allowed (this is not
the step's path), and nothing else is placed until the batch retires, when its trained rows go
back to their slots or to the host store.  What fits is still admitted first (each set's
unpinned ways, lowest eviction key first), so a cache too small for its batches keeps serving the
hot rows.  Counted in ``overflow_batches``; the window sizing keeps normal runs out of this path.
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
from .counters import Counters
from .plan import RoundPlanner
from .sets import PIN
from .transfer import Transfers


@dataclasses.dataclass
class _InFlight:
    tbe: SplitTableBatchedEmbeddingBagsCodegen
    optim: SparseOptim
    rows: np.ndarray  # its distinct global rows, in the temporary table's order
    slots: np.ndarray  # the slot of each (-1: not resident, in the host store)
    train: bool


class OverflowPath:
    def __init__(
        self,
        planner: RoundPlanner,
        transfers: Transfers,
        counters: Counters,
        optim: SparseOptim,
        dim: int,
        device: torch.device,
    ) -> None:
        self.planner = planner
        self.transfers = transfers
        self.counters = counters
        self.optim = optim
        self.dim = dim
        self.device = device
        self.written_back = False  # training happened: evicted rows go back to the host store
        self.seq = 0  # the round number the window gives the batch (lru's clock)

    def forward(self, b: WindowBatch, features: KeyedJaggedTensor, lr: float) -> torch.Tensor:
        p, tr = self.planner, self.transfers
        tr.sync()
        tr.write_backs.settle(keep=0)
        lpk = np.asarray(b.kjt.length_per_key(), dtype=np.int64)
        table = np.repeat(np.arange(len(lpk)), lpk)
        values = b.kjt.values().cpu().numpy().astype(np.int64)
        row_off, static_rows, _, static_at = p.params.host
        rows, inverse = np.unique(values + row_off[table], return_inverse=True)
        t = np.searchsorted(row_off, rows, side="right") - 1
        rank = rows - row_off[t]
        static = rank < static_rows[t]
        st = tr.streams
        with st.use(st.plan):  # the device map is the plan stream's
            slots = np.where(static, static_at[t] + rank, self._resident(rows))
        missed = slots < 0
        self.counters.overflowed(
            lpk,
            np.bincount(t[inverse][~missed[inverse]], minlength=len(lpk)),
            int((~static).sum()),
            int((~static & ~missed).sum()),
        )
        with st.use(st.plan):
            self._used(slots[~missed & ~static])
            slots[missed] = self._admit(rows[missed], slots[~missed & ~static])
        optim = dataclasses.replace(self.optim, lr=lr)
        tbe = make_tbe([len(rows)], self.dim, optim, self.device, feature_table_map=[0] * len(lpk))
        records = torch.empty((len(rows), tr.cols), device=self.device)
        held = slots >= 0
        if held.any():
            records[tr.index(np.flatnonzero(held))] = tr.slot_records(tr.index(slots[held]))
        if (~held).any():
            records[tr.index(np.flatnonzero(~held))] = tr.host_records(rows[~held])
        _set_records(tbe, optim, self.dim, records)
        b.overflow = _InFlight(tbe, optim, rows, slots, torch.is_grad_enabled())
        offsets = features.offsets().to(self.device, dtype=torch.int64)
        return tbe(tr.index(inverse), offsets)

    def _resident(self, rows: np.ndarray) -> np.ndarray:
        """The slot of each of ``rows`` in the dynamic region, -1 where not resident."""
        sets = self.planner.sets
        keys = sets.keys2d.cpu().numpy()
        g = sets.geometry
        match = keys[rows % g.sets] == rows[:, None]
        col = match.argmax(axis=1)
        return np.where(match.any(axis=1), (rows % g.sets) * g.cols + col, -1)

    def _used(self, slots: np.ndarray) -> None:
        """The batch's resident rows (``slots``) scored as used by it (a touch and its pins taken
        back: the batch is not a round, nothing holds them)."""
        if not len(slots):
            return
        p, index = self.planner, self.transfers.index(slots)
        every = torch.ones(len(slots), dtype=torch.bool, device=index.device)
        p.scores.touch(p.sets.evict, index, every, self.seq)
        p.scores.untouch(p.sets.evict, index, every)

    @torch.no_grad()
    def _admit(self, rows: np.ndarray, held: np.ndarray) -> np.ndarray:
        """Admit what fits of (missed, distinct) ``rows``: each set's unpinned ways but the
        batch's own (``held``), lowest eviction key first, for its rows in order.  Their slots
        (-1: not admitted)."""
        p, tr = self.planner, self.transfers
        g = p.sets.geometry
        out = np.full(len(rows), -1, dtype=np.int64)
        if not len(rows):
            return out
        evict = p.sets.evict2d.cpu().numpy().copy()
        evict.reshape(-1)[held] = PIN  # the batch's resident rows stay where they are
        order = np.argsort(rows % g.sets, kind="stable")
        sets = (rows % g.sets)[order]
        rank = np.arange(len(sets)) - np.searchsorted(sets, sets)
        ranked = np.argsort(evict[sets], axis=1, kind="stable")
        col = np.take_along_axis(ranked, np.minimum(rank, g.cols - 1)[:, None], 1)[:, 0]
        free = (rank < g.cols) & (evict[sets, col] < PIN)
        if not free.any():
            return out
        chosen, slots = order[free], sets[free] * g.cols + col[free]
        victims = tr.index(slots)
        evicted = p.sets.keys.cpu().numpy()[slots]
        if self.written_back:
            written = tr.slot_records(victims)
            tr.to_host(evicted, written)
            self.counters.add("rows_written_back", len(slots))
        row_dev = tr.index(rows[chosen])
        p.sets.keys.index_copy_(0, victims, row_dev)
        p.scores.admit(p.sets.evict, victims, row_dev, self.seq)
        p.scores.untouch(p.sets.evict, victims)  # admitted, not pinned: nothing else is placed
        tr.to_slots(victims, tr.host_records(rows[chosen]))
        tr.sync()
        self.counters.add("rows_loaded", len(slots))
        self.counters.add("evictions", len(slots))
        out[chosen] = slots
        return out

    def retire(self, b: WindowBatch) -> None:
        """After ``b``'s backward: its trained rows back to their slots or the host store."""
        o, b.overflow = b.overflow, None
        if o is None or not o.train:
            return
        tr = self.transfers
        with torch.no_grad():
            tr.sync()
            records = _get_records(o.tbe, o.optim, self.dim)
            res = o.slots >= 0
            if res.any():
                tr.to_slots(tr.index(o.slots[res]), records[tr.index(np.flatnonzero(res))])
            if (~res).any():
                tr.to_host(o.rows[~res], records[tr.index(np.flatnonzero(~res))])
                self.counters.add("rows_written_back", int((~res).sum()))
            tr.sync()


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
