"""Bookkeeping of the device slot buffer, kept on the cache's device and sized by the cache.

The device holds ``num_slots`` rows (one fbgemm table that every feature maps onto).  Slots
``[0, num_static)`` are the static region: table ``t``'s hottest ``static_rows[t]`` rows sit there
permanently at ``static_offsets[t] + rank`` (no lookup, never evicted).  Slots
``[num_static, num_slots)`` are the dynamic region, managed by the eviction policy.

Per slot: the global row it holds (-1: empty), a pin refcount (batches of the look-ahead window
that use it), a dirty bit (touched by a training step since it was loaded).  Which slot holds a row
is found by binary search in the dynamic region's rows kept sorted (re-sorted after every batch
that loads rows: one device sort of the dynamic region), so there is no per-row map at all: every
structure here scales with the cache, about 30 bytes a slot, whatever the size of the tables.
"""

from __future__ import annotations

import torch


class SlotTable:
    def __init__(self, num_slots: int, num_static: int, device: torch.device) -> None:
        if num_slots >= 2**31:
            raise ValueError(f"embedding.cache_ratio: {num_slots} slots are too many (limit 2**31)")
        self.num_slots = num_slots
        self.num_static = num_static
        self.slot_row = torch.full((num_slots,), -1, dtype=torch.int64, device=device)
        self.pin = torch.zeros(num_slots, dtype=torch.int32, device=device)
        self.dirty = torch.zeros(num_slots, dtype=torch.bool, device=device)
        self._resort()

    @property
    def num_dynamic(self) -> int:
        return self.num_slots - self.num_static

    def _resort(self) -> None:
        self.sorted_rows, order = torch.sort(self.slot_row[self.num_static:])
        self.sorted_slots = order + self.num_static

    def lookup(self, rows: torch.Tensor) -> torch.Tensor:
        """The dynamic slot holding each of ``rows`` (global ids), -1 where none does."""
        if self.num_dynamic == 0 or rows.numel() == 0:
            return torch.full_like(rows, -1)
        pos = torch.searchsorted(self.sorted_rows, rows).clamp_(max=self.num_dynamic - 1)
        return torch.where(self.sorted_rows[pos] == rows, self.sorted_slots[pos], -1)

    def assign(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """``rows`` (not resident) now live in ``slots``, clean; the dynamic map is rebuilt."""
        self.slot_row[slots] = rows
        self.dirty[slots] = False
        if slots.numel() and self.num_dynamic:
            self._resort()

    def resident(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(slots, rows) of every occupied slot."""
        slots = torch.nonzero(self.slot_row >= 0).squeeze(1)
        return slots, self.slot_row[slots]
