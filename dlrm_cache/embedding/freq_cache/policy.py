"""Eviction policies over the dynamic slots: which resident rows make room for a batch's misses.

Every policy gives a resident row a score (lower = evicted first); empty slots come before every
row, slots pinned by the look-ahead window are never victims.

* ``freq``: the row's dataset access count (``refresh_counts``: plus the accesses observed during
  training, so rows whose popularity drifts up are kept).
* ``lfu``: observed accesses only (counted per row since training started, across evictions).
* ``lru``: when the row was last requested by a placed batch.

Victims in O(victims) host work, not O(cache): the dynamic slots sit in FIFO queues, one per
score *bucket* (a quarter of a power of two of the count: ``freq``/``lfu``; one queue in order of
last use: ``lru``; a queue of empty slots before all).  ``choose`` takes the oldest entries of the
lowest buckets; a pinned one goes to the back of its queue (a second chance, as in CLOCK).  A
slot whose score changes is queued again (its old entry goes stale: each entry carries the stamp
its slot had when queued).  Plain ``freq`` scores never change, so its queues only grow by
admissions.  Within a bucket the order is by admission (``freq``/``lfu``), so victims are the
lowest-scored rows up to a quarter of a power of two.
"""

from __future__ import annotations

import numpy as np

from .slots import SlotTable

POLICIES = ("freq", "lfu", "lru")

BUCKETS_PER_OCTAVE = 4
NUM_BUCKETS = 2 + 64 * BUCKETS_PER_OCTAVE  # empty slots, then scores 0 .. 2**64
EMPTY = 0


class _Queue:
    """A FIFO of (slot, stamp) entries in two growable arrays."""

    __slots__ = ("slots", "stamps", "head", "tail")

    def __init__(self) -> None:
        self.slots = np.zeros(0, dtype=np.int64)
        self.stamps = np.zeros(0, dtype=np.int64)
        self.head = self.tail = 0

    def __len__(self) -> int:
        return self.tail - self.head

    def push(self, slots: np.ndarray, stamps: np.ndarray) -> None:
        n = len(slots)
        if self.tail + n > len(self.slots):
            live = self.tail - self.head
            cap = max(2 * (live + n), 1024)
            new_slots, new_stamps = np.empty(cap, np.int64), np.empty(cap, np.int64)
            new_slots[:live] = self.slots[self.head : self.tail]
            new_stamps[:live] = self.stamps[self.head : self.tail]
            self.slots, self.stamps, self.head, self.tail = new_slots, new_stamps, 0, live
        self.slots[self.tail : self.tail + n] = slots
        self.stamps[self.tail : self.tail + n] = stamps
        self.tail += n

    def peek(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        end = min(self.tail, self.head + n)
        return self.slots[self.head : end], self.stamps[self.head : end]

    def keep_valid(self, stamp: np.ndarray) -> None:
        s, t = self.slots[self.head : self.tail], self.stamps[self.head : self.tail]
        valid = stamp[s] == t
        self.slots, self.stamps = s[valid].copy(), t[valid].copy()
        self.head, self.tail = 0, len(self.slots)


class EvictionPolicy:
    def __init__(
        self,
        name: str,
        slots: SlotTable,
        counts: np.ndarray | None,
        observed: np.ndarray | None,
    ) -> None:
        if name not in POLICIES:
            raise ValueError(f"embedding.policy={name!r}: choose one of {list(POLICIES)}")
        self.name = name
        self.slots = slots
        self.counts = counts if name == "freq" else None
        self.observed = observed
        # plain freq scores never change; lru's change at every use, lfu's with the counts
        self.rescores = name != "freq" or observed is not None
        self._queues = [_Queue() for _ in range(NUM_BUCKETS)]
        self._stamp = np.zeros(slots.num_slots, dtype=np.int64)  # each slot's current stamp
        self._bucket = np.zeros(slots.num_slots, dtype=np.int16)  # and the queue it is in
        self._next_stamp = 1
        self._queued = 0  # entries in all queues, stale ones included
        dynamic = np.arange(slots.num_static, slots.num_slots, dtype=np.int64)
        self._push(EMPTY, dynamic)

    # -- scores ----------------------------------------------------------------------------
    def _buckets(self, rows: np.ndarray) -> np.ndarray:
        """The queue of each of ``rows`` by its score (never ``EMPTY``)."""
        if self.name == "lru":
            return np.ones(rows.shape, dtype=np.int16)
        score = np.zeros(rows.shape, dtype=np.float64)
        if self.counts is not None:
            score += self.counts[rows]
        if self.observed is not None:
            score += self.observed[rows]
        # int16: a stable argsort of them is a radix sort
        return (1 + np.log2(1.0 + score) * BUCKETS_PER_OCTAVE).astype(np.int16)

    def _stamps(self, slots: np.ndarray, buckets: np.ndarray | int) -> np.ndarray:
        """New stamps for ``slots`` (their old entries go stale), now in ``buckets``."""
        stamps = np.arange(self._next_stamp, self._next_stamp + len(slots), dtype=np.int64)
        self._next_stamp += len(slots)
        self._stamp[slots] = stamps
        self._bucket[slots] = buckets
        self._queued += len(slots)
        return stamps

    def _push(self, bucket: int, slots: np.ndarray) -> None:
        self._queues[bucket].push(slots, self._stamps(slots, bucket))
        self._maybe_compact()

    def _push_by_bucket(self, slots: np.ndarray, buckets: np.ndarray) -> None:
        if len(slots) == 0:
            return
        order = np.argsort(buckets, kind="stable")
        slots, buckets = slots[order], buckets[order]
        stamps = self._stamps(slots, buckets)
        starts = np.flatnonzero(np.r_[True, buckets[1:] != buckets[:-1]])
        for a, b in zip(starts.tolist(), [*starts[1:].tolist(), len(slots)]):
            self._queues[int(buckets[a])].push(slots[a:b], stamps[a:b])
        self._maybe_compact()

    def _maybe_compact(self) -> None:
        if self._queued > 4 * max(self.slots.num_dynamic, 1024):
            self._compact()

    def _compact(self) -> None:
        for q in self._queues:
            q.keep_valid(self._stamp)
        self._queued = sum(len(q) for q in self._queues)

    # -- what the cache tells the policy ---------------------------------------------------
    def admitted(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """``rows`` now live in ``slots`` (dynamic)."""
        self._push_by_bucket(slots, self._buckets(rows))

    def used(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """A placed batch uses dynamic ``slots`` holding ``rows`` (distinct).  The observed counts
        were updated by the caller; slots whose score changed are queued again."""
        if not self.rescores or len(slots) == 0:
            return
        if self.name == "lru":
            self._push(1, slots)
            return
        buckets = self._buckets(rows)
        moved = buckets != self._bucket[slots]
        self._push_by_bucket(slots[moved], buckets[moved])

    def emptied(self, slots: np.ndarray) -> None:
        """``slots`` (dynamic) hold nothing any more: first in line."""
        self._push(EMPTY, slots)

    def best(self, rows: np.ndarray, k: int) -> np.ndarray:
        """The ``k`` of (distinct, not resident) ``rows`` most worth caching, when not all fit."""
        if k >= len(rows):
            return rows
        if self.name == "lru":  # all equally recent: the lowest rows, each table's hottest ranks
            return np.sort(rows)[:k]
        score = np.zeros(rows.shape, dtype=np.float64)
        if self.counts is not None:
            score += self.counts[rows]
        if self.observed is not None:
            score += self.observed[rows]
        return rows[np.argpartition(-score, k - 1)[:k]]

    # -- victims ---------------------------------------------------------------------------
    def choose(self, k: int) -> np.ndarray | None:
        """``k`` unpinned dynamic slots to (re)fill, lowest scores first, or None (nothing
        changed but the queues' order) when fewer than ``k`` are unpinned."""
        if k == 0:
            return np.zeros(0, dtype=np.int64)
        pin, stamp = self.slots.pin, self._stamp
        victims: list[np.ndarray] = []
        need = k
        for bucket, q in enumerate(self._queues):
            if not need:
                break
            unseen = len(q)  # each entry is looked at once (pinned ones go back behind these)
            while need and unseen:
                s, st = q.peek(min(unseen, need + need // 4 + 256))
                valid = stamp[s] == st
                free = valid & (pin[s] == 0)
                taken = np.cumsum(free)
                # consume up to the need-th free entry: later free ones stay at the head
                end = len(s) if taken[-1] < need else int(np.searchsorted(taken, need)) + 1
                s, valid, free = s[:end], valid[:end], free[:end]
                q.head += end
                unseen -= end
                self._queued -= end
                victims.append(s[free])
                need -= int(np.count_nonzero(free))
                again = valid & ~free  # pinned: a second chance, at the back
                if again.any():
                    self._push(bucket, s[again])
        out = np.concatenate(victims) if victims else np.zeros(0, dtype=np.int64)
        if need:  # not enough: queue them again (empty ones first in line)
            rows = self.slots.slot_row[out]
            empty = rows < 0
            self.emptied(out[empty])
            self.admitted(out[~empty], rows[~empty])
            return None
        return out
