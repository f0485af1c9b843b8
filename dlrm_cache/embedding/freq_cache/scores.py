"""Eviction policies as eviction keys: what a way's score is, on admission and on each use.

A way's eviction key (sets.py) is ``pins * PIN + score``; victims are the unpinned ways of a set,
lowest score first.  A *touch* (a live round uses the way) adds a pin, and a release takes it back;
the score is the policy's:

* ``freq``: the row's dataset count, as a bucket (a quarter of a power of two: ``1 + floor(4 *
  log2(1 + count))``).  Rows are frequency ranks, so within a table the bucket only changes at a
  few rank boundaries: the buckets are kept as *segments* of global rows (their first row and
  their bucket), a handful per table, found by one search -- no array per table row.
  ``refresh_counts``: each round that uses a resident row adds one, so a row hotter than the
  dataset says outstays its bucket.
* ``lfu``: the rounds that used the row since it was admitted (one on admission).
* ``lru``: the round that last used it.

Every update is one or a few torch ops over a round's slots on the plan stream (plan.py).
"""

from __future__ import annotations

import numpy as np
import torch

from .sets import PIN

POLICIES = ("freq", "lfu", "lru")

BUCKETS_PER_OCTAVE = 4


def count_bucket(counts: np.ndarray) -> np.ndarray:
    """The ``freq`` score of rows counted ``counts`` times (1 and up: 0 is an empty way)."""
    return (1 + np.floor(np.log2(1.0 + counts) * BUCKETS_PER_OCTAVE)).astype(np.int64)


def segments(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Runs of equal ``scores`` over global rows: each run's first row and its score."""
    if not len(scores):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    start = np.flatnonzero(np.r_[True, scores[1:] != scores[:-1]])
    return start.astype(np.int64), scores[start]


class EvictionScores:
    """The ops that keep one policy's scores in a set map's eviction keys."""

    def __init__(
        self,
        policy: str,
        refresh_counts: bool,
        counts: np.ndarray | None,
        device: torch.device,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"embedding.policy={policy!r}: choose one of {list(POLICIES)}")
        self.policy = policy
        self.device = device
        # what a touch adds: a pin, and for the counting policies one use
        counting = policy == "lfu" or (policy == "freq" and refresh_counts)
        self.touch_add = PIN + 1 if counting else PIN
        self._seg_start: torch.Tensor | None = None
        self._seg_word: torch.Tensor | None = None
        if policy == "freq":
            assert counts is not None  # checked with the settings
            start, score = segments(count_bucket(counts))
            self._seg_start = torch.from_numpy(start).to(device)
            # searchsorted(right) of a row gives its run + 1: word 0 is never used
            self._seg_word = torch.from_numpy(np.r_[0, score + PIN]).to(device)
        self._adds: dict[int, torch.Tensor] = {}

    def initial(self, rows: np.ndarray, counts: np.ndarray | None) -> np.ndarray:
        """Scores of rows placed at start-up (nothing has used them yet; ``counts``: the
        dataset's, per global row)."""
        if self.policy == "freq":
            assert counts is not None
            return count_bucket(counts[rows])
        return np.zeros(len(rows), np.int64)

    def adds(self, n: int, value: int) -> torch.Tensor:
        """``n`` copies of ``value`` (a view of a kept tensor: no op per use)."""
        t = self._adds.get(value)
        if t is None or t.numel() < n:
            t = torch.full((max(n, 2 * (0 if t is None else t.numel()), 1024),), value)
            t = self._adds[value] = t.to(self.device)
        return t[:n]

    def segment_bytes(self) -> int:
        parts = (self._seg_start, self._seg_word)
        return sum(p.nbytes for p in parts if p is not None)

    # -- ops on the plan stream ------------------------------------------------------------
    def touch(self, evict: torch.Tensor, slots: torch.Tensor, hit: torch.Tensor, seq: int) -> None:
        """A live round uses ``slots`` where ``hit`` (distinct slots there): pinned and scored
        as used.  Elsewhere (a miss: its set's phantom, repeated) nothing changes, so a phantom's
        key stays what keeps it from being chosen, however many misses and refusals there are."""
        if self.policy == "lru":
            old = evict.index_select(0, slots)
            used = torch.bitwise_and(old, -PIN).add_(PIN + seq)
            evict.index_copy_(0, slots, torch.where(hit, used, old))
            return
        evict.index_add_(0, slots, torch.mul(self.adds(len(slots), self.touch_add), hit))

    def untouch(
        self, evict: torch.Tensor, slots: torch.Tensor, hit: torch.Tensor | None = None
    ) -> None:
        """The pins of ``touch`` (``hit``: the same mask) or of admission (None: every slot)
        taken back: a release or a refused plan."""
        if hit is None:
            evict.index_add_(0, slots, self.adds(len(slots), -PIN))
        else:
            evict.index_add_(0, slots, torch.mul(self.adds(len(slots), -PIN), hit))

    def admit(self, evict: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor, seq: int) -> None:
        """``rows`` now live in ``slots``, pinned once by the round that loads them."""
        if self.policy == "freq":
            assert self._seg_start is not None and self._seg_word is not None
            run = torch.searchsorted(self._seg_start, rows, right=True)
            evict.index_copy_(0, slots, self._seg_word.index_select(0, run))
        elif self.policy == "lfu":
            evict.index_fill_(0, slots, PIN + 1)
        else:
            evict.index_fill_(0, slots, PIN + seq)
