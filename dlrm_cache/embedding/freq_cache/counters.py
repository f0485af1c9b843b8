"""The cache's counters between two ``stats()`` calls: hits, row traffic, stalls, window events.

Counts that depend on device values (hits, evictions, write-backs) stay device scalars, updated
on the plan stream with the work that produces them, and are read once per ``report`` (on the plan
stream: never after the step).  Counts the host knows (accesses, rows loaded, batch events) stay
host numbers.
"""

from __future__ import annotations

import numpy as np
import torch

# device scalars (read at report), then host numbers
_DEVICE = ("hits", "distinct_hits", "evictions", "rows_written_back")
_HOST = ("accesses", "distinct", "rows_loaded", "stall_s", "overflow_batches", "deferred_batches")


class Counters:
    def __init__(self, num_tables: int, device: torch.device) -> None:
        self.device = device
        self.dev = {k: torch.zeros((), dtype=torch.int64, device=device) for k in _DEVICE}
        self.host: dict[str, float] = dict.fromkeys(_HOST, 0)
        self.table_accesses = np.zeros(num_tables, dtype=np.int64)
        self.table_hits = torch.zeros(num_tables, dtype=torch.int64, device=device)

    def forwarded(
        self,
        num_ids: int,
        table_accesses: np.ndarray,
        distinct: int,
        table_hits: torch.Tensor,
        distinct_hits: torch.Tensor | int,
    ) -> None:
        """A forwarded batch: ``num_ids`` accesses (``table_accesses`` per table) to ``distinct``
        rows; ``table_hits`` of each table's accesses and ``distinct_hits`` of the rows were
        resident before the batch was placed."""
        self.host["accesses"] += num_ids
        self.host["distinct"] += distinct
        self.dev["hits"] += table_hits.sum()
        self.dev["distinct_hits"] += distinct_hits
        self.table_accesses += table_accesses
        self.table_hits += table_hits

    def evicted(self, occupied: torch.Tensor, written_back: torch.Tensor, loaded: int) -> None:
        """Victim slots (``occupied``: they held a row; ``written_back``: a dirty one) refilled with
        ``loaded`` rows."""
        self.dev["evictions"] += occupied.sum()
        self.dev["rows_written_back"] += written_back.sum()
        self.host["rows_loaded"] += loaded

    def add(self, key: str, value: float) -> None:
        """A host count (``_HOST``) or a known number of written-back rows."""
        if key in self.dev:
            self.dev[key] += int(value)
        else:
            self.host[key] += value

    def report(self, read, row_bytes: int, table_names: list[str]) -> dict[str, float]:
        """The counters as ``stats()`` reports them; ``read`` reads device values on the host."""
        values = read(torch.cat([torch.stack([self.dev[k] for k in _DEVICE]), self.table_hits]))
        c = {**dict(zip(_DEVICE, values[: len(_DEVICE)])), **self.host}
        table_hits = values[len(_DEVICE) :]
        acc, dist = c["accesses"], c["distinct"]
        out = {
            "hit_rate": c["hits"] / acc if acc else 0.0,
            "hit_rate_distinct": c["distinct_hits"] / dist if dist else 0.0,
        }
        for name, a, h in zip(table_names, self.table_accesses, table_hits):
            out[f"hit_rate/{name}"] = h / a if a else 0.0
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
