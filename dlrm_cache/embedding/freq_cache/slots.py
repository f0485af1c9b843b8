"""Host bookkeeping of the device slot buffer: which row each slot holds, and the reverse map.

The device holds ``num_slots`` rows (one fbgemm table that every feature maps onto).  Slots
``[0, num_static)`` are the static region: table ``t``'s hottest ``static_rows[t]`` rows sit there
permanently at ``static_offsets[t] + rank`` (found without a lookup, never evicted).  Slots
``[num_static, num_slots)`` are the dynamic region, managed by the eviction policy.

Everything here is host memory, owned by the planner thread (the device never reads it):

* ``slot_row``: the global row each slot holds (-1: empty);
* ``row_slot``: the reverse, one int32 per table row, so a batch's ids find their slots with one
  gather: -1 where the row is not resident, and below -1 (``pending_code``) where it was evicted
  dirty and its write-back has not reached the host store yet (transfer.py then loads it from
  that write-back's device buffer);
* ``pin``: per dynamic slot, how many ids of placed, not yet retired batches use it (a pinned slot
  is never a victim);
* ``dirty``: per slot, touched by a training batch since it was loaded or flushed
  (``static_dirty`` for the whole static region, which is never evicted);
* a scratch array (one int32 per row) in which a batch's misses are deduplicated in O(ids),
  without a sort.

Host memory: 8 B per table row (map and scratch) beside the row's own record, ~13 B per slot.
"""

from __future__ import annotations

import numpy as np
import torch

# row_slot codes of rows whose write-back has not reached the host store: -2 - (a position in the
# pending write-backs, counted modulo PENDING_SPAN)
PENDING_SPAN = 1 << 30


def pending_code(position: np.ndarray) -> np.ndarray:
    return (-2 - position % PENDING_SPAN).astype(np.int32)


def pending_position(code: np.ndarray) -> np.ndarray:
    return (-2 - code.astype(np.int64)) % PENDING_SPAN


class SlotTable:
    def __init__(self, num_slots: int, num_static: int, num_rows: int) -> None:
        if num_slots >= 2**31:
            raise ValueError(f"embedding.cache_ratio: {num_slots} slots are too many (limit 2**31)")
        self.num_slots = num_slots
        self.num_static = num_static
        self.num_rows = num_rows
        self.slot_row = np.full(num_slots, -1, dtype=np.int64)
        self.row_slot = np.full(num_rows, -1, dtype=np.int32)
        # a torch view for index_add_ (numpy's add.at is several times slower at batch sizes)
        self._pin = torch.zeros(num_slots, dtype=torch.int32)
        self.pin = self._pin.numpy()
        self.dirty = np.zeros(num_slots, dtype=bool)
        self.static_dirty = False
        self._row_scratch = np.zeros(num_rows, dtype=np.int32)
        self._arange = np.zeros(0, dtype=np.int32)

    @property
    def num_dynamic(self) -> int:
        return self.num_slots - self.num_static

    def positions(self, n: int) -> np.ndarray:
        """``arange(n)`` as int32 (kept: a batch's size rarely changes)."""
        if self._arange.size < n:
            self._arange = np.arange(max(n, 2 * self._arange.size), dtype=np.int32)
        return self._arange[:n]

    def dedup_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Deduplicate global ``rows``: the positions of one occurrence of each distinct row
        (ascending), and each entry's index among them.  O(len(rows)) through the row scratch
        array (only the entries of ``rows`` are written, then read back: it is never cleared)."""
        return _dedup(self._row_scratch, rows, self.positions(rows.size))

    def pin_add(self, slots: np.ndarray, delta: int) -> None:
        """Add ``delta`` to the pin count of each of ``slots`` (once per occurrence)."""
        if slots.size:
            idx = torch.from_numpy(slots)
            one = torch.ones((), dtype=torch.int32).expand(slots.size)
            self._pin.index_add_(0, idx, one, alpha=delta)

    def assign(self, slots: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """``rows`` (not resident) now live in ``slots`` (clean); what the slots held is dropped.
        Returns the dropped rows that were dirty, with their slots (they must be written back: the
        caller gives them their ``pending_code`` until ``written_back``), and how many rows were
        dropped."""
        old = self.slot_row[slots]
        occupied = old >= 0
        wb = occupied & self.dirty[slots]
        self.row_slot[old[occupied & ~wb]] = -1
        wb_rows = old[wb]
        self.row_slot[rows] = slots
        self.slot_row[slots] = rows
        self.dirty[slots] = False
        return slots[wb], wb_rows, int(np.count_nonzero(occupied))

    def written_back(self, rows: np.ndarray, codes: np.ndarray) -> None:
        """``rows`` are in the host store again: those still marked with the ``codes`` of this
        write-back are now just not resident (a row loaded or evicted again since keeps its
        entry; a flush writes back rows that stay resident)."""
        mapped = self.row_slot[rows]
        self.row_slot[rows] = np.where(mapped == codes, -1, mapped)

    def resident(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots, rows) of every occupied slot."""
        slots = np.flatnonzero(self.slot_row >= 0)
        return slots, self.slot_row[slots]

    def dirty_slots(self) -> np.ndarray:
        """Occupied slots whose rows differ from the host store's (the whole static region once
        a training batch touched it)."""
        dirty = self.dirty.copy()
        if self.static_dirty:
            dirty[: self.num_static] = True
        return np.flatnonzero(dirty & (self.slot_row >= 0))

    def clean(self) -> None:
        self.dirty[:] = False
        self.static_dirty = False


def _dedup(scratch: np.ndarray, keys: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One representative position per distinct key of ``keys`` and each entry's index among the
    representatives, with ``scratch`` (indexed by key) as the only extra memory.  Every entry
    writes its position at its key, then reads back the position that stayed: whichever write
    wins, all entries of a key read the same one, and exactly that entry is its representative."""
    scratch[keys] = pos
    rep = scratch[keys]
    first = rep == pos
    rank = np.cumsum(first, dtype=np.int32) - 1
    return np.flatnonzero(first), rank[rep]
