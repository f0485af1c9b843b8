"""Eviction policies over the dynamic slots: which resident rows make room for a batch's misses.

Every policy scores the dynamic slots (lower = evicted first); empty slots score below everything,
slots pinned by the look-ahead window are never candidates.  ``choose`` picks the ``k`` lowest
with one ``topk`` on the cache's device (no per-row Python, no host round trip of the scores).

* ``freq``: the dataset access count of the row (``refresh_counts``: plus the accesses observed
  during training, so rows whose popularity drifts up are kept).
* ``lfu``: observed accesses only (counted per row since training started, across evictions).
* ``lru``: the step at which the row was last requested by a (pre)fetched batch.

Per-row counts (dataset and observed) live in the host store (host-mapped under CUDA); the policy
keeps one score per slot, so its device memory scales with the cache.
"""

from __future__ import annotations

import torch

from .slots import SlotTable
from .store import HostStore

POLICIES = ("freq", "lfu", "lru")


class EvictionPolicy:
    def __init__(self, name: str, slots: SlotTable, store: HostStore) -> None:
        if name not in POLICIES:
            raise ValueError(f"embedding.policy={name!r}: choose one of {list(POLICIES)}")
        self.name = name
        self.slots = slots
        self.counts = store.counts if name == "freq" else None
        self.observed = store.observed
        # Each slot's current score, updated as rows are admitted and requested; empty slots stay
        # at -inf (filled first).
        self.slot_score = torch.full(
            (slots.num_slots,), -torch.inf, dtype=torch.float64, device=slots.slot_row.device
        )
        self.clock = 0

    def _row_score(self, rows: torch.Tensor) -> torch.Tensor:
        if self.name == "lru":
            return torch.full(
                rows.shape, float(self.clock), dtype=torch.float64, device=rows.device
            )
        score = torch.zeros(rows.shape, dtype=torch.float64, device=rows.device)
        if self.observed is not None:
            score += self.observed.index_select(0, rows)
        if self.counts is not None:
            score += self.counts.index_select(0, rows)
        return score

    def admitted(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """``rows`` now live in ``slots``."""
        self.slot_score.index_copy_(0, slots, self._row_score(rows))

    def observe(
        self, rows: torch.Tensor, hits: torch.Tensor, slots: torch.Tensor, all_held: bool = True
    ) -> None:
        """A batch requested distinct ``rows`` (``hits`` accesses each), held in ``slots`` (-1: not)."""
        self.clock += 1
        if self.observed is not None:
            # rows are distinct: a gather and a scatter, no atomics on (host-mapped) memory
            self.observed.index_copy_(0, rows, self.observed.index_select(0, rows) + hits)
        if self.name != "freq" or self.observed is not None:  # plain freq scores never change
            if not all_held:
                held = slots >= 0
                rows, slots = rows[held], slots[held]
            self.slot_score[slots] = self._row_score(rows)

    def observe_ids(self, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """``observe`` per id: a batch requested ``rows`` (one per id, repeats included), all
        held, in ``slots``.  Repeats add up in the counts; a slot written more than once gets the
        same score each time (its row's), so the order of the writes does not matter."""
        self.clock += 1
        if self.observed is not None:
            one = torch.ones((), dtype=self.observed.dtype, device=rows.device)
            self.observed.index_add_(0, rows, one.expand(rows.numel()))
        if self.name != "freq" or self.observed is not None:  # plain freq scores never change
            self.slot_score.index_copy_(0, slots, self._row_score(rows))

    def admit_first(self, rows: torch.Tensor, k: int) -> torch.Tensor:
        """The ``k`` of ``rows`` most worth caching (when not all of them fit)."""
        if k >= rows.numel():
            return rows
        if self.name == "lru":
            # all equally recent: the lowest rows, which are each table's most frequent ranks
            return torch.sort(rows).values[:k]
        return rows[torch.topk(self._row_score(rows), k).indices]

    def choose(self, k: int, free: torch.Tensor | None = None) -> torch.Tensor | None:
        """``k`` unpinned dynamic slots to (re)fill, or None when fewer than ``k`` are free.

        ``free``: the dynamic slots' unpinned mask, from a caller that already checked it has ``k``.
        """
        s = self.slots
        if free is None:
            free = s.pin[s.num_static :] == 0
            if k > int(free.sum()):
                return None
        score = torch.where(free, self.slot_score[s.num_static :], torch.inf)
        return torch.topk(score, k, largest=False, sorted=False).indices + s.num_static
