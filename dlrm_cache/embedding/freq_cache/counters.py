"""The cache's counters between two ``stats()`` calls: hits, row traffic, stalls, window events.

The planner decides every placement on the host, so every count is a host number: ``report``
reads nothing from the device.
"""

from __future__ import annotations

import numpy as np

_COUNTS = (
    "accesses",
    "hits",
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
    def __init__(self, num_tables: int) -> None:
        self.c: dict[str, float] = dict.fromkeys(_COUNTS, 0)
        self.table_accesses = np.zeros(num_tables, dtype=np.int64)
        self.table_hits = np.zeros(num_tables, dtype=np.int64)

    def forwarded(
        self, table_accesses: np.ndarray, table_hits: np.ndarray, distinct: int, distinct_hits: int
    ) -> None:
        """A forwarded batch: ``table_accesses`` per table to ``distinct`` rows; ``table_hits`` of
        each table's accesses and ``distinct_hits`` of the rows were resident before it was
        placed."""
        self.c["accesses"] += int(table_accesses.sum())
        self.c["hits"] += int(table_hits.sum())
        self.c["distinct"] += distinct
        self.c["distinct_hits"] += distinct_hits
        self.table_accesses += table_accesses
        self.table_hits += table_hits

    def add(self, key: str, value: float) -> None:
        self.c[key] += value

    def report(self, row_bytes: int, table_names: list[str]) -> dict[str, float]:
        """The counters as ``stats()`` reports them."""
        c = self.c
        acc, dist = c["accesses"], c["distinct"]
        out: dict[str, float] = {}  # a rate of no accesses is left out (base.RATE_WEIGHTS)
        if acc:
            out["hit_rate"] = c["hits"] / acc
        if dist:
            out["hit_rate_distinct"] = c["distinct_hits"] / dist
        for name, a, h in zip(table_names, self.table_accesses, self.table_hits):
            if a:
                out[f"hit_rate/{name}"] = h / a
            out[f"accesses/{name}"] = float(a)
        out.update(
            accesses=acc,
            distinct_ids=dist,
            rows_loaded=c["rows_loaded"],
            bytes_loaded=c["rows_loaded"] * row_bytes,
            rows_written_back=c["rows_written_back"],
            bytes_written_back=c["rows_written_back"] * row_bytes,
            evictions=c["evictions"],
            stall_s=c["stall_s"],
            overflow_batches=c["overflow_batches"],
            deferred_batches=c["deferred_batches"],
        )
        return {k: float(v) for k, v in out.items()}
