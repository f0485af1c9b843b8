"""The cache's counters between two ``stats()`` calls: hits, row traffic, stalls, window events.

A batch is counted when it is forwarded: its accesses per table are host numbers (the KJT's
per-key lengths); its hits per table were counted on the device by its round's commit and are
added to the totals then, on the plan stream (``RoundPlanner.count``), read back only when
``stats()`` is asked for.  Distinct rows are a round's rows outside the static region, counted
with its first batch forwarded.  Row traffic is counted when it is issued.
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
        self.host_hits = np.zeros(len(self.table_names), dtype=np.int64)  # the overflow path's

    def add(self, key: str, value: float) -> None:
        self.c[key] += value

    def placed(self, misses: int, written: bool) -> None:
        """A round placed: ``misses`` rows loaded into as many ways (``written``: what they held
        written back)."""
        self.c["rows_loaded"] += misses
        self.c["evictions"] += misses
        if written:
            self.c["rows_written_back"] += misses

    def forwarded(self, b: Any, distinct: tuple[int, int] | None) -> None:
        """A batch forwarded: its accesses (its hits: the device's), and with the first of its
        round, the round's ``distinct`` rows and of those resident."""
        self.table_accesses += np.asarray(b.kjt.length_per_key(), dtype=np.int64)
        if distinct is not None:
            self.c["distinct"] += distinct[0]
            self.c["distinct_hits"] += distinct[1]

    def overflowed(self, accesses: np.ndarray, hits: np.ndarray, distinct: int, dhits: int) -> None:
        """A batch served by the overflow path, counted on the host."""
        self.c["overflow_batches"] += 1
        self.table_accesses += accesses
        self.host_hits += hits
        self.c["distinct"] += distinct
        self.c["distinct_hits"] += dhits

    def report(self, device_hits: np.ndarray) -> dict[str, float]:
        """The counters as ``stats()`` reports them (``device_hits``: the plan's, read back)."""
        c = self.c
        hits = device_hits + self.host_hits
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
