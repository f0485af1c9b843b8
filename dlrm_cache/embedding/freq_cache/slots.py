"""Bookkeeping of the device slot buffer, all of it in host memory.

The device holds ``num_slots`` rows (one fbgemm table that every feature maps onto).  Slots
``[0, num_static)`` are the static region: table ``t``'s hottest ``static_rows[t]`` rows sit there
permanently at ``static_offsets[t] + rank`` (no lookup, never evicted).  Slots
``[num_static, num_slots)`` are the dynamic region, managed by the eviction policy.

Per slot: the global row it holds (-1: empty), a pin refcount (batches of the look-ahead window
that use it), a dirty bit (touched by a training step since it was loaded).  Per global row: the
slot holding it (int32, -1: not resident).  Only the per-row map scales with the tables, and it is
4 bytes a row of host memory; device memory scales with the cache alone.
"""

from __future__ import annotations

import numpy as np


class SlotTable:
    def __init__(self, num_rows: int, num_slots: int, num_static: int) -> None:
        if num_slots >= 2**31:
            raise ValueError(f"embedding.cache_ratio: {num_slots} slots do not fit int32 slot ids")
        self.num_slots = num_slots
        self.num_static = num_static
        self.row_slot = np.full(num_rows, -1, dtype=np.int32)
        self.slot_row = np.full(num_slots, -1, dtype=np.int64)
        self.pin = np.zeros(num_slots, dtype=np.int32)
        self.dirty = np.zeros(num_slots, dtype=bool)

    @property
    def num_dynamic(self) -> int:
        return self.num_slots - self.num_static

    def assign(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """``rows`` (not resident) now live in ``slots`` (empty), clean."""
        self.row_slot[rows] = slots
        self.slot_row[slots] = rows
        self.dirty[slots] = False

    def release(self, slots: np.ndarray) -> None:
        """Unmap whatever ``slots`` hold (the caller wrote dirty ones back first)."""
        rows = self.slot_row[slots]
        self.row_slot[rows[rows >= 0]] = -1
        self.slot_row[slots] = -1
        self.dirty[slots] = False

    def resident(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots, rows) of every occupied slot."""
        slots = np.flatnonzero(self.slot_row >= 0)
        return slots, self.slot_row[slots]
