"""Batches larger than the whole dynamic region: a temporary TBE holding exactly their rows.

Slower, but correct: the planner is idle (the training thread called it and got the batch back
marked ``needs_overflow``), the device is synchronized, and nothing else is placed until the
batch retires, when its trained rows go back to their slots or to the host store.  Counted in
``overflow_batches``; the window sizing keeps normal runs out of this path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..base import SparseOptim, TableSpec
from ..tbe import make_tbe, momentum_view, weights_view
from .batch import WindowBatch
from .counters import Counters
from .mover import Mover
from .policy import EvictionPolicy
from .slots import SlotTable
from .store import HostStore


class OverflowPath:
    """The overflow path of :class:`~.backend.FreqCacheBackend` (a mixin over its state)."""

    # The backend's state and helpers this path uses (declared for the type checker only).
    tables: list[TableSpec]
    optim: SparseOptim
    dim: int
    device: torch.device
    store: HostStore
    slots: SlotTable
    policy: EvictionPolicy
    mover: Mover
    _lr: float
    _counters: Counters
    _inflight: list[WindowBatch]
    _slot_of: Callable[[torch.Tensor], torch.Tensor]
    _evict_and_load: Callable[[torch.Tensor, torch.Tensor], None]
    _hit_sums: Callable[[WindowBatch, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    _count_forwarded: Callable[[WindowBatch, torch.Tensor, torch.Tensor | int], None]
    _deduplicate: Callable[[WindowBatch], None]

    def _forward_overflow(self, b: WindowBatch, features: KeyedJaggedTensor) -> torch.Tensor:
        self._counters.add("overflow_batches", 1)
        with torch.no_grad(), self.mover.planning():
            # uniq is trimmed (from a sort: its _prepare read the sizes) or made now (per id)
            self._deduplicate(b)
            rows, inverse, counts = b.uniq, b.inverse, b.counts
            assert rows is not None and inverse is not None and counts is not None
            resident = self._slot_of(rows) >= 0  # for the hit rate, before admissions
            # Still admit what fits (the best of the misses by policy), so that a cache too small for
            # its batches keeps serving the hot rows instead of staying empty.  Nothing is pinned now
            # (the window was released), and nothing else is prepared until this batch retires.
            misses = rows[~resident]
            k = min(misses.numel(), self.slots.num_dynamic)
            if k:
                admit = self.policy.admit_first(misses, k)
                victims = self.policy.choose(k)
                assert victims is not None  # nothing is pinned: every dynamic slot is free
                self._evict_and_load(victims, admit)
            slots = self._slot_of(rows)
            self.policy.observe(rows, counts, slots, all_held=False)
            self._count_forwarded(b, *self._hit_sums(b, resident))
        self.mover.sync()
        self.mover.use_on_compute(
            rows, slots, inverse
        )  # plan-stream tensors read on compute from here
        res = slots >= 0
        optim = dataclasses.replace(self.optim, lr=self._lr)
        tmp = make_tbe(
            [rows.numel()], self.dim, optim, self.device, feature_table_map=[0] * len(self.tables)
        )
        tw = weights_view(tmp, self.dim)
        tm = momentum_view(tmp, optim, self.dim)
        with torch.no_grad():
            tw[res] = self.mover.cache_w[slots[res]]
            tw[~res] = self.store.weight[rows[~res]]
            if tm is not None:
                cache_m, store_m = self.mover.cache_m, self.store.momentum
                assert cache_m is not None and store_m is not None  # the optimizer keeps momentum
                tm[res] = cache_m[slots[res]]
                tm[~res] = store_m[rows[~res]]
        self._counters.add("rows_loaded", int((~res).sum()))
        b.train = torch.is_grad_enabled()
        b.overflow = dict(tbe=tmp, rows=rows, slots=slots, res=res, optim=optim)
        offsets = features.offsets().to(self.device, dtype=torch.int64)
        out = tmp(inverse.reshape(-1), offsets)
        self._inflight.append(b)
        return out

    @torch.no_grad()
    def _retire_overflow(self, b: WindowBatch) -> None:
        o, b.overflow = b.overflow, None
        if not b.train:
            return
        assert o is not None  # called for overflow batches only
        self.mover.sync()
        tw = weights_view(o["tbe"], self.dim)
        tm = momentum_view(o["tbe"], o["optim"], self.dim)
        res, slots, rows = o["res"], o["slots"], o["rows"]
        cache_w, cache_m, store = self.mover.cache_w, self.mover.cache_m, self.store
        cache_w.index_copy_(0, slots[res], tw[res])
        store.weight.index_copy_(0, rows[~res], tw[~res])
        if tm is not None:
            assert cache_m is not None and store.momentum is not None  # momentum kept
            cache_m.index_copy_(0, slots[res], tm[res])
            store.momentum.index_copy_(0, rows[~res], tm[~res])
        self.slots.dirty[slots[res]] = True
        self._counters.add("rows_written_back", int((~res).sum()))
        self.mover.sync()
