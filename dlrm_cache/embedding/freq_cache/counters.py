"""The cache's counters between two ``stats()`` calls: hits, row traffic, stalls, window events.

A batch is counted once, when its round is first placed.  Its accesses per table are host numbers
(the KJT's per-key lengths); its misses per table are counted on the device by the round's commit
(``RoundPlanner.miss_counts``) and read back only when ``stats()`` is asked for, on the plan
stream.  Distinct rows are the round's rows outside the static region.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_COUNTS = (
    "distinct",
    "distinct_hits",
    "evictions",
    "rows_loaded",
    "rows_written_back",
    "stall_s",
    "overflow_batches",
    "deferred_batches",
)


class Counters:
    def __init__(self, table_names: list[str], row_bytes: int) -> None:
        self.table_names = table_names
        self.row_bytes = row_bytes
        self.reset()

    def reset(self) -> None:
        self.c: dict[str, float] = dict.fromkeys(_COUNTS, 0)
        self.table_accesses = np.zeros(len(self.table_names), dtype=np.int64)
        self.host_misses = np.zeros(len(self.table_names), dtype=np.int64)  # the overflow path's

    def add(self, key: str, value: float) -> None:
        self.c[key] += value

    def placed(self, batches: list[Any], p: Any, count: bool, written: bool) -> None:
        """A round placed: its row traffic, and (``count``) its batches' accesses and distinct
        rows (``p``: the plan's Proposal)."""
        self.c["rows_loaded"] += p.misses
        self.c["evictions"] += p.misses
        if written:
            self.c["rows_written_back"] += p.misses
        if count:
            for b in batches:
                self.table_accesses += np.asarray(b.kjt.length_per_key(), dtype=np.int64)
            static = int(p.has_static)
            self.c["distinct"] += p.distinct - static
            self.c["distinct_hits"] += p.distinct - static - p.misses

    def overflowed(self, accesses: np.ndarray, misses: np.ndarray, distinct: int, hits: int) -> None:
        """A batch served by the overflow path, counted on the host."""
        self.c["overflow_batches"] += 1
        self.table_accesses += accesses
        self.host_misses += misses
        self.c["distinct"] += distinct
        self.c["distinct_hits"] += hits

    def report(self, device_misses: np.ndarray) -> dict[str, float]:
        """The counters as ``stats()`` reports them (``device_misses``: the plan's, read back)."""
        c = self.c
        misses = device_misses + self.host_misses
        hits = self.table_accesses - misses
        acc, dist = int(self.table_accesses.sum()), c["distinct"]
        out: dict[str, float] = {}  # a rate of no accesses is left out (base.RATE_WEIGHTS)
        if acc:
            out["hit_rate"] = float(hits.sum()) / acc
        if dist:
            out["hit_rate_distinct"] = c["distinct_hits"] / dist
        for name, a, h in zip(self.table_names, self.table_accesses, hits):
            if a:
                out[f"hit_rate/{name}"] = h / a
            out[f"accesses/{name}"] = float(a)
        out.update(
            accesses=acc,
            distinct_ids=dist,
            rows_loaded=c["rows_loaded"],
            bytes_loaded=c["rows_loaded"] * self.row_bytes,
            rows_written_back=c["rows_written_back"],
            bytes_written_back=c["rows_written_back"] * self.row_bytes,
            evictions=c["evictions"],
            stall_s=c["stall_s"],
            overflow_batches=c["overflow_batches"],
            deferred_batches=c["deferred_batches"],
        )
        return {k: float(v) for k, v in out.items()}
