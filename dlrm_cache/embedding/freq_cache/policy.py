"""Eviction policies over the dynamic slots: which resident rows make room for a batch's misses.

Every policy scores the dynamic slots (lower = evicted first); empty slots score below everything,
slots pinned by the look-ahead window are never candidates.  ``choose`` picks the ``k`` lowest
with one ``argpartition`` (no per-row Python).

* ``freq``: the dataset access count of the row (``refresh_counts``: plus the accesses observed
  during training, so rows whose popularity drifts up are kept).
* ``lfu``: observed accesses only (counted per row since training started, across evictions).
* ``lru``: the step at which the row was last requested by a (pre)fetched batch.
"""

from __future__ import annotations

import numpy as np

from .slots import SlotTable

POLICIES = ("freq", "lfu", "lru")


class EvictionPolicy:
    def __init__(
        self,
        name: str,
        slots: SlotTable,
        num_rows: int,
        counts: np.ndarray | None,
        refresh_counts: bool = False,
    ) -> None:
        if name not in POLICIES:
            raise ValueError(f"embedding.policy={name!r}: choose one of {list(POLICIES)}")
        self.name = name
        self.slots = slots
        self.counts = None if counts is None else counts.astype(np.float64, copy=False)
        self.observed = (
            np.zeros(num_rows, dtype=np.int64)
            if name == "lfu" or (name == "freq" and refresh_counts)
            else None
        )
        self.last_use = np.zeros(slots.num_slots, dtype=np.int64) if name == "lru" else None
        self.clock = 0

    def observe(self, rows: np.ndarray, hits: np.ndarray, slots: np.ndarray) -> None:
        """A batch requested distinct ``rows`` (``hits`` accesses each), held in ``slots`` (-1: not)."""
        self.clock += 1
        if self.observed is not None:
            self.observed[rows] += hits
        if self.last_use is not None:
            self.last_use[slots[slots >= 0]] = self.clock

    def admit_first(self, rows: np.ndarray, k: int) -> np.ndarray:
        """The ``k`` of ``rows`` most worth caching (when not all of them fit)."""
        if k >= rows.size:
            return rows
        if self.name == "lru":
            return rows[:k]  # all equally recent
        score = self.observed[rows].astype(np.float64) if self.observed is not None else 0.0
        if self.name == "freq":
            score = score + self.counts[rows]
        return rows[np.argpartition(-score, k - 1)[:k]]

    def _scores(self, rows: np.ndarray, dyn: slice) -> np.ndarray:
        safe = np.maximum(rows, 0)
        if self.name == "lru":
            return self.last_use[dyn].astype(np.float64)
        if self.name == "lfu":
            return self.observed[safe].astype(np.float64)
        score = self.counts[safe].copy()
        if self.observed is not None:
            score += self.observed[safe]
        return score

    def choose(self, k: int) -> np.ndarray | None:
        """``k`` unpinned dynamic slots to (re)fill, or None when fewer than ``k`` are free."""
        s = self.slots
        dyn = slice(s.num_static, s.num_slots)
        pinned = s.pin[dyn] > 0
        free = pinned.size - int(np.count_nonzero(pinned))
        if k > free:
            return None
        rows = s.slot_row[dyn]
        if k == free:
            return np.flatnonzero(~pinned) + s.num_static
        score = self._scores(rows, dyn)
        score[rows < 0] = -1.0  # empty slots first (scores are >= 0)
        score[pinned] = np.inf
        pick = np.argpartition(score, k - 1)[:k]
        return pick + s.num_static
