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
        # Each slot's current score, kept up to date as rows are admitted and requested, so that
        # choosing victims is one masked argpartition over this array (no per-candidate gathers
        # from the big per-row arrays).  Empty slots stay at -inf: filled first.
        self.slot_score = np.full(slots.num_slots, -np.inf)
        self.clock = 0

    def _row_score(self, rows: np.ndarray) -> np.ndarray:
        if self.name == "lru":
            return np.full(rows.size, float(self.clock))
        score = self.observed[rows].astype(np.float64) if self.observed is not None else 0.0
        if self.name == "freq":
            score = score + self.counts[rows]
        return np.broadcast_to(score, rows.shape)

    def admitted(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """``rows`` now live in ``slots``."""
        self.slot_score[slots] = self._row_score(rows)

    def observe(self, rows: np.ndarray, hits: np.ndarray, slots: np.ndarray) -> None:
        """A batch requested distinct ``rows`` (``hits`` accesses each), held in ``slots`` (-1: not)."""
        self.clock += 1
        if self.observed is not None:
            self.observed[rows] += hits
        if self.name != "freq" or self.observed is not None:  # plain freq scores never change
            held = slots >= 0
            self.slot_score[slots[held]] = self._row_score(rows[held])

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

    def choose(self, k: int) -> np.ndarray | None:
        """``k`` unpinned dynamic slots to (re)fill, or None when fewer than ``k`` are free."""
        s = self.slots
        dyn = slice(s.num_static, s.num_slots)
        unpinned = s.pin[dyn] == 0
        free = int(np.count_nonzero(unpinned))
        if k > free:
            return None
        if k == free:
            return np.flatnonzero(unpinned) + s.num_static
        empty = s.slot_row[dyn] < 0  # never pinned
        n_empty = int(np.count_nonzero(empty))
        if n_empty >= k:
            return np.flatnonzero(empty)[:k] + s.num_static
        # All empty slots, plus the k - n_empty lowest-scored occupied unpinned ones.  Only those
        # candidates enter argpartition: pinned slots as +inf ties make it much slower.
        cand = np.flatnonzero(unpinned & ~empty)
        need = k - n_empty
        score = self.slot_score[cand + s.num_static]
        pick = cand[np.argpartition(score, need - 1)[:need]] if need < cand.size else cand
        return np.concatenate([np.flatnonzero(empty), pick]) + s.num_static
