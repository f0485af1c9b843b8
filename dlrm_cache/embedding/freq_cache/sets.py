"""The dynamic region on the device: a set-associative map from rows to slots, and its eviction keys.

Geometry (:class:`Geometry`): the dynamic slots are ``sets`` sets of ``ways`` ways; a row lives in
set ``row % sets``, in any of its ways.  Each set is a row of ``ways + 2`` slot ids: column 0 is a
*phantom* way and column ``ways + 1`` a *sentinel*, neither ever holds a row (the phantom is where a
lookup that found nothing points, so marking "the way that matched" needs no mask; the sentinel is
where a set's victim list ends).  A last, *dummy* set (number ``sets``) stands for everything that
is not looked up (a round's static ids, hits after the lookup): its keys match :data:`SENT_ROW` and
its eviction keys are far below any pin, so it never fails a placement.  Ways beyond the usable
count are *disabled* (like sentinels), spread evenly over the sets, so the region holds exactly
the layout's ``window_rows`` rows.  Slot ids, which are the TBE's row numbers, are ``set * cols + col``;
the static region follows at ``dynamic_slots``.

State per slot id, on the device (O(cache): nothing per table row, see the GPU test
``test_freq_cache_device_memory_scales_with_the_cache``):

* ``keys``: the global row held; :data:`NEVER` for phantom, sentinel and disabled ways, the host
  store's scratch row for an empty way (a row no id has; an empty victim's write-back lands there);
* ``evict``: the eviction key, ``pins * PIN + score``: a way with a pin (a live round uses it) sorts
  after every unpinned one, and among those the lowest score goes first (scores.py).

Everything here is torch ops on the cache's device; the plan (plan.py) reads and writes it on the
plan stream only.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

WAYS = 64  # usable ways per set (fewer when the whole region is smaller)
ROW_BITS = 35  # a plan key is set << ROW_BITS | row
ROW_MASK = (1 << ROW_BITS) - 1
SENT_ROW = ROW_MASK  # the row of the dummy set's key, held by no table
NEVER = -1  # the key of phantom, sentinel and disabled ways
PIN = 1 << 36  # one live round using a slot, in its eviction key (scores stay below)
BLOCKED = 1 << 62  # eviction key of sentinel and disabled ways: never a victim
PHANTOM = 1 << 61  # eviction key of phantom ways: pinned, far from overflow either way
DUMMY = -(1 << 62)  # eviction key of the dummy set's ways: never read as a failure


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Sets and ways of a dynamic region of ``window_rows`` usable slots."""

    sets: int
    ways: int
    window_rows: int

    @classmethod
    def for_rows(cls, window_rows: int, ways: int = WAYS) -> Geometry:
        ways = max(1, min(ways, window_rows))
        return cls(max(1, math.ceil(window_rows / ways)), ways, window_rows)

    @property
    def cols(self) -> int:
        return self.ways + 2

    @property
    def dynamic_slots(self) -> int:
        """Slot ids of the dynamic region, padding included (the static region starts here)."""
        return (self.sets + 1) * self.cols

    @property
    def sent_key(self) -> int:
        """The plan key of the dummy set's row: above every real key."""
        return (self.sets << ROW_BITS) | SENT_ROW

    def usable(self) -> np.ndarray:
        """``[sets, ways]`` bool: the ways that may hold rows.  The ways beyond ``window_rows``
        are disabled evenly over the sets (the last ways of some), so no set is short."""
        per_set = np.full(self.sets, self.window_rows // self.sets)
        per_set[: self.window_rows % self.sets] += 1
        return np.arange(self.ways)[None, :] < per_set[:, None]

    def real_slots(self) -> np.ndarray:
        """``[sets, ways]`` slot ids of the real ways, usable or not."""
        return np.arange(self.sets)[:, None] * self.cols + np.arange(1, self.ways + 1)[None, :]


class SetMap:
    """The dynamic region's ``keys`` and ``evict`` on ``device`` (see the module docstring)."""

    def __init__(self, geometry: Geometry, scratch_row: int, device: torch.device) -> None:
        if scratch_row >= SENT_ROW:
            raise ValueError(f"freq_cache: {scratch_row:,} rows are too many (limit {SENT_ROW:,})")
        g = self.geometry = geometry
        self.scratch_row = scratch_row
        keys = np.full((g.sets + 1, g.cols), NEVER, dtype=np.int64)
        evict = np.full((g.sets + 1, g.cols), BLOCKED, dtype=np.int64)
        real = np.zeros_like(keys, dtype=bool)
        real[: g.sets, 1 : g.ways + 1] = g.usable()
        keys[real], evict[real] = scratch_row, 0  # empty: filled first
        evict[:, 0] = PHANTOM
        keys[g.sets], evict[g.sets] = SENT_ROW, DUMMY
        self.keys = torch.from_numpy(keys.reshape(-1)).to(device)
        self.evict = torch.from_numpy(evict.reshape(-1)).to(device)
        self.keys2d = self.keys.view(g.sets + 1, g.cols)
        self.evict2d = self.evict.view(g.sets + 1, g.cols)
        self._phantoms = torch.arange(g.sets, device=device) * g.cols  # the dummy set: none

    def fill(self, slots: np.ndarray, rows: np.ndarray, scores: np.ndarray) -> None:
        """Rows ``rows`` now live in (empty, unpinned) ``slots`` with ``scores`` (start-up)."""
        device = self.keys.device
        index = torch.from_numpy(slots.astype(np.int64)).to(device)
        self.keys[index] = torch.from_numpy(rows.astype(np.int64)).to(device)
        self.evict[index] = torch.from_numpy(scores.astype(np.int64)).to(device)

    def resident(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots, rows) of every way holding a row, read back (not on the step path)."""
        keys = self.keys.cpu().numpy()
        slots = np.flatnonzero((keys >= 0) & (keys < self.scratch_row))
        return slots, keys[slots]

    def reset_phantoms(self) -> None:
        """Phantom ways gather the pins of lookups that matched nothing, never released (they are
        never victims); set back while no round is live so their keys never run away."""
        self.evict.index_fill_(0, self._phantoms, PHANTOM)

    def pinned_ways(self) -> int:
        """Usable ways holding a pin (read back: for checks, not on the step path)."""
        g = self.geometry
        evict = self.evict2d[: g.sets, 1 : g.ways + 1].cpu().numpy()
        return int(((evict >= PIN) & g.usable()).sum())

    def bytes(self) -> int:
        return self.keys.nbytes + self.evict.nbytes


def warm_rows(
    geometry: Geometry, candidates: np.ndarray, scores: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The start-up contents of the dynamic region: ``candidates`` (global rows outside the
    static region, best first) placed greedily, each in its own set while the set has a usable way.
    Returns (slots, rows, scores) of the rows placed."""
    g = geometry
    if not len(candidates):
        return (np.zeros(0, np.int64),) * 3
    sets = candidates % g.sets
    order = np.argsort(sets, kind="stable")  # by set, best first within each
    s = sets[order]
    first = np.searchsorted(s, s, side="left")
    rank = np.arange(len(s)) - first
    capacity = g.usable().sum(axis=1)
    keep = rank < capacity[s]
    chosen = order[keep]
    slots = g.real_slots()[s[keep], rank[keep]]
    return slots, candidates[chosen], scores[chosen]
