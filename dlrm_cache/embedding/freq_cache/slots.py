"""Bookkeeping of the device slot buffer, kept on the cache's device and sized by the cache.

The device holds ``num_slots`` rows (one fbgemm table that every feature maps onto).  Slots
``[0, num_static)`` are the static region: table ``t``'s hottest ``static_rows[t]`` rows sit there
permanently at ``static_offsets[t] + rank`` (no lookup, never evicted).  Slots
``[num_static, num_slots)`` are the dynamic region, managed by the eviction policy.

Per slot: the global row it holds (-1: empty), a pin refcount (batches of the look-ahead window
that use it), a dirty bit (touched by a training step since it was loaded).

Which slot holds a row (``row_map``):
* ``sorted`` (the default on a GPU): binary search in the dynamic region's rows kept sorted
  (re-sorted on the device after every batch that loads rows).  No per-row map at all: every
  structure here scales with the cache, about 30 bytes a slot, whatever the size of the tables.
* ``dense`` (the default on the CPU): an int32 slot per row of the tables, static rows included.
  On the CPU that map is host memory like the tables themselves, and it updates in O(rows moved)
  where a CPU sort of the dynamic region costs tens of milliseconds per batch at Criteo sizes.
  A second row-sized array serves ``first_positions`` and ``dedup`` (a batch's distinct rows in
  O(ids), no sort).
Both place every batch correctly (training equals the uncached tables'); where scores tie (lru,
equal counts) they may evict different rows, since the dense dedup lists a batch's rows in order
of first occurrence and the sorted one in row order.  The tests run both.
"""

from __future__ import annotations

import numpy as np
import torch


def resolve_row_map(row_map: str, device: torch.device) -> str:
    """``auto``: ``sorted`` on a GPU, ``dense`` elsewhere (see the module docstring)."""
    if row_map == "auto":
        return "sorted" if device.type == "cuda" else "dense"
    return row_map


class SlotTable:
    def __init__(
        self,
        num_slots: int,
        num_static: int,
        device: torch.device,
        num_rows: int,
        row_map: str = "auto",
    ) -> None:
        if num_slots >= 2**31:
            raise ValueError(f"embedding.cache_ratio: {num_slots} slots are too many (limit 2**31)")
        row_map = resolve_row_map(row_map, device)
        if row_map not in ("sorted", "dense"):
            raise ValueError(f"embedding.row_map={row_map!r}: choose auto, sorted or dense")
        self.row_map = row_map
        # Row ids as sort and search keys: int32 where they fit (half the radix-sort passes of int64
        # on a GPU); ``num_rows`` itself is the scratch/padding id (never resident).
        self.key_dtype = torch.int32 if num_rows < 2**31 - 1 else torch.int64
        self.scratch_row = num_rows
        self.num_slots = num_slots
        self.num_static = num_static
        self.slot_row = torch.full((num_slots,), -1, dtype=torch.int64, device=device)
        self.pin = torch.zeros(num_slots, dtype=torch.int32, device=device)
        self.dirty = torch.zeros(num_slots, dtype=torch.bool, device=device)
        if row_map == "dense":
            self.row_slot = torch.full((num_rows + 1,), -1, dtype=torch.int32, device=device)
            # first_positions' (and dedup's) scratch, made at its first use
            self._first: torch.Tensor | None = None
            self._arange = np.zeros(0, dtype=np.int32)
        else:
            self._resort()

    @property
    def num_dynamic(self) -> int:
        return self.num_slots - self.num_static

    def _resort(self) -> None:
        self.sorted_rows, order = torch.sort(self.slot_row[self.num_static :].to(self.key_dtype))
        self.sorted_slots = order + self.num_static

    def first_positions(self, rows: torch.Tensor) -> np.ndarray:
        """Per id of ``rows``: the position of its row's first occurrence in ``rows``.

        A minimum of positions over the row-sized scratch array (only the entries of ``rows`` are
        written and then read back, so it is never cleared): O(ids), where a sort of a batch's ids
        costs several times more on a CPU.  Dense map, CPU tensors, one thread at a time."""
        if self._first is None:
            self._first = torch.zeros_like(self.row_slot)
        scratch, r = self._first.numpy(), rows.numpy()
        scratch[r] = r.size
        np.minimum.at(scratch, r, self.positions(r.size))
        return scratch.take(r)

    def positions(self, n: int) -> np.ndarray:
        """``arange(n)`` as int32 (kept: a batch's size rarely changes)."""
        if self._arange.size < n:
            self._arange = np.arange(max(n, 2 * self._arange.size), dtype=np.int32)
        return self._arange[:n]

    def dedup(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Deduplicate ``rows``: the position of each distinct row's first occurrence (ascending),
        each id's index among the distinct rows, and each distinct row's number of ids (the
        distinct rows in order of first occurrence).  As ``first_positions``: dense map, CPU."""
        first_pos = torch.from_numpy(self.first_positions(rows))
        first = first_pos == torch.from_numpy(self.positions(rows.numel()))
        where = torch.nonzero(first).squeeze(1)
        rank = torch.cumsum(first, 0, dtype=torch.int64) - 1
        inverse = rank.index_select(0, first_pos)
        return where, inverse, torch.bincount(inverse, minlength=where.numel())

    def lookup(self, rows: torch.Tensor) -> torch.Tensor:
        """The slot holding each of ``rows`` (global ids, or the scratch id), -1 where none does:
        static or dynamic with the dense map, dynamic only with the sorted one."""
        if self.row_map == "dense":
            return self.row_slot.index_select(0, rows).long()
        if self.num_dynamic == 0 or rows.numel() == 0:
            return torch.full_like(rows, -1)
        keys = rows.to(self.key_dtype)
        pos = torch.searchsorted(self.sorted_rows, keys).clamp_(max=self.num_dynamic - 1)
        return torch.where(self.sorted_rows[pos] == keys, self.sorted_slots[pos], -1)

    def assign(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """``rows`` (not resident) now live in ``slots`` (whatever they held is dropped), clean."""
        if self.row_map == "dense":
            old = self.slot_row.index_select(0, slots)
            # no boolean mask: no sync
            self.row_slot.index_fill_(0, torch.where(old >= 0, old, self.scratch_row), -1)
            self.row_slot.index_copy_(0, rows, slots.to(torch.int32))
        self.slot_row.index_copy_(0, slots, rows)
        self.dirty.index_fill_(0, slots, False)
        if self.row_map == "sorted" and slots.numel() and self.num_dynamic:
            self._resort()

    def pin_add(self, slots: torch.Tensor, delta: int) -> None:
        """Add ``delta`` to the pin count of each of ``slots`` (once per occurrence)."""
        one = torch.ones((), dtype=torch.int32, device=slots.device).expand(slots.numel())
        self.pin.index_add_(0, slots, one, alpha=delta)

    def mark_dirty(self, slots: torch.Tensor) -> None:
        self.dirty.index_fill_(0, slots, True)

    def resident(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(slots, rows) of every occupied slot."""
        slots = torch.nonzero(self.slot_row >= 0).squeeze(1)
        return slots, self.slot_row[slots]
