"""Placement per id through the dense row map: how a cache without streams (a CPU) places a batch.

On a CPU the cache's work cannot hide behind the step (planner.py says why), so what counts is
its cost per batch, paid in whole-batch passes and in small operations' dispatch.  Most of a
batch's ids hit resident rows, so this path works per id and touches the batch as a whole only in
a few passes; it deduplicates nothing but the rows it must load.

* Analysis: each id's global row (one broadcast add where every table has the same number of
  ids, as with Criteo's one id per sample and table) and, per id, the position of its row's first
  occurrence in the batch (``SlotTable.first_positions``: O(ids), no sort), which gives the
  batch's number of distinct rows.
* Placement: one gather of every id's slot from the map.  The missing ids' first occurrences are
  the rows to load, in order of first occurrence (the order of ``SlotTable.dedup``'s distinct
  rows, so victims are chosen and filled as from that dedup); victims are unpinned dynamic slots
  holding none of the batch's rows; then only the missing ids' slots are gathered again.  Pins
  count ids, not rows (a row used by 3 ids of a batch holds 3 pins until the batch retires): the
  same "pinned while a window batch uses it", without deduplicating the hits.
* Statistics: hits per table and distinct rows hit, from the misses at the first placement
  (kept with the batch, counted when it is forwarded); the policy observes ids
  (``EvictionPolicy.observe_ids``).

A batch too large for the whole window is deduplicated in full when it takes the overflow path.
With streams (a GPU) or the sorted map, ``FreqCacheBackend._analyze``/``_prepare`` place batches
from a sort instead, reading sizes once per placement.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from .batch import Analysis, WindowBatch, id_tables, uniform_length
from .counters import Counters
from .mover import Mover
from .policy import EvictionPolicy
from .slots import SlotTable


class IdPath:
    """The per-id placement of :class:`~.backend.FreqCacheBackend` (a mixin over its state)."""

    # The backend's state and helpers this path uses (declared for the type checker only).
    slots: SlotTable
    policy: EvictionPolicy
    _counters: Counters
    _t_rows: torch.Tensor
    _t_row_off: torch.Tensor
    _queue: deque[WindowBatch]
    mover: Mover
    _evict_and_load: Callable[[torch.Tensor, torch.Tensor], None]
    _raise_bad_id: Callable[[WindowBatch], None]

    def _global_rows(self, v: torch.Tensor, lpk: np.ndarray) -> tuple[torch.Tensor, bool]:
        """Each id's global row (int64) and whether any id is outside its table (those ids then
        map to their table's row 0: the batch is refused at placement, with the offending id)."""
        per = uniform_length(lpk)
        if per:  # one length per table: no per-id table needed
            ids = v.view(len(lpk), per)
            lo, hi = torch.aminmax(ids, dim=1)
            if not bool(((lo < 0) | (hi >= self._t_rows)).any()):
                return (ids + self._t_row_off[:-1, None]).view(-1), False
        table = id_tables(lpk)
        v = v.long()
        bad_id = (v < 0) | (v >= self._t_rows.index_select(0, table))
        bad = bool(bad_id.any())
        if bad:
            v = torch.where(bad_id, 0, v)
        return v + self._t_row_off.index_select(0, table), bad

    @torch.no_grad()
    def _analyze_ids(self, kjt: KeyedJaggedTensor, lpk: np.ndarray) -> Analysis:
        grow, bad = self._global_rows(kjt.values(), lpk)
        first_pos = self.slots.first_positions(grow)
        n_uniq = int(np.count_nonzero(first_pos == self.slots.positions(grow.numel())))
        return Analysis(
            kjt,
            grow.numel(),
            grow,
            lpk,
            None,
            None,
            None,
            n_uniq,
            bad,
            torch.from_numpy(first_pos),
        )

    @torch.no_grad()
    def _prepare_ids(self, b: WindowBatch) -> bool:
        """``_prepare`` for a batch analysed per id: resident and pinned, or False (nothing
        changed) when its missing rows do not fit beside the pinned window."""
        s = self.slots
        assert b.first is not None and b.grow is not None  # analysed per id
        if b.bad:  # the batch is dropped: the cache stays as it was
            if b in self._queue:
                self._queue.remove(b)
            self._raise_bad_id(b)
        su = s.row_slot.index_select(0, b.grow).long()  # every id's slot, -1: not resident
        missing = torch.nonzero(su < 0).squeeze(1)  # ids of rows not resident
        # the first id of each missing row, in order of first occurrence
        loads = missing[b.first.index_select(0, missing) == missing]
        if loads.numel():
            # Victims: unpinned dynamic slots, none of them holding one of this batch's rows
            # (the misses mark the extra last entry, which nothing reads).
            busy = torch.ones(s.num_slots + 1, dtype=torch.bool)
            torch.ne(s.pin, 0, out=busy[: s.num_slots])
            busy.index_fill_(0, torch.where(su >= 0, su, s.num_slots), True)
            free = ~busy[s.num_static : s.num_slots]
            if loads.numel() > int(free.sum()):
                return False
            victims = self.policy.choose(loads.numel(), free)
            assert victims is not None  # given ``free``
            self._evict_and_load(victims, b.grow.index_select(0, loads))
            rows = b.grow.index_select(0, missing)
            su.index_copy_(0, missing, s.row_slot.index_select(0, rows).long())
        s.pin_add(su, 1)
        b.pinned = b.indices = su
        b.prepared = True
        if b.first_hits is None:  # resident before the batch's first placement: counted at forward
            assert isinstance(b.n_uniq, int)  # known from the analysis
            misses = np.bincount(
                self._table_of_ids(missing.numpy(), b.table_accesses),
                minlength=len(b.table_accesses),
            )
            b.first_hits = (torch.from_numpy(b.table_accesses - misses), b.n_uniq - loads.numel())
        if b.train:
            s.mark_dirty(su)
        self.policy.observe_ids(b.grow, su)
        b.event = None  # no streams: the rows are in place when this returns
        b.signal(self.mover.streams)
        return True

    @staticmethod
    def _table_of_ids(pos: np.ndarray, lpk: np.ndarray) -> np.ndarray:
        """The table of each id at positions ``pos`` of a batch (ids are feature-major)."""
        per = uniform_length(lpk)
        if per:
            return pos // per
        return np.searchsorted(np.cumsum(lpk), pos, side="right")
