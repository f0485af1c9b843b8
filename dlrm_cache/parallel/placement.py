"""Which rank owns which rows: balanced by expected load, within each rank's host memory.

The unit of placement is a *shard*: a whole table (table-wise sharding), or a range of its rows
when the table does not fit one rank's host memory or is larger than ``shard_rows_above``
(row-wise sharding).  Rows are frequency ranks, so the first shard of a table holds its hottest
rows; loads are computed per shard from the frequency statistics, which keeps hot shards apart.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ..embedding.base import SparseOptim, TableSpec
from ..embedding.freq_cache.layout import cache_rows_for

# A lookup that misses the device cache moves a row over PCIe and back: several hits' worth of work.
MISS_COST = 8.0


@dataclass(frozen=True)
class Shard:
    table: str
    lo: int  # first row
    hi: int  # one past the last row
    rows_in_table: int
    rank: int = -1

    @property
    def name(self) -> str:
        """The table's own name when the shard is the whole table, else ``<table>:<lo>-<hi>``."""
        return shard_name(self.table, self.lo, self.hi, self.rows_in_table)


def shard_name(table: str, lo: int, hi: int, rows_in_table: int) -> str:
    return table if (lo, hi) == (0, rows_in_table) else f"{table}:{lo}-{hi}"


_KEY = re.compile(r"^(?P<table>[^:.]+)(?::(?P<lo>\d+)-(?P<hi>\d+))?\.(?P<field>.+)$")


def parse_key(key: str) -> tuple[str, int | None, int | None, str]:
    """``C3:0-500.weight`` -> (C3, 0, 500, weight); ``C3.weight`` -> (C3, None, None, weight)."""
    m = _KEY.match(key)
    if not m:
        raise ValueError(f"not an embedding table key: {key!r}")
    lo, hi = m["lo"], m["hi"]
    return m["table"], int(lo) if lo else None, int(hi) if hi else None, m["field"]


@dataclass
class Placement:
    shards: list[Shard]  # in table order, then row order
    cache_rows: dict[str, int]  # shard name -> predicted cache rows
    hit_rate: dict[str, float]  # shard name -> predicted hit rate
    load: dict[str, float]  # shard name -> expected load

    def owned_by(self, rank: int) -> list[Shard]:
        return [s for s in self.shards if s.rank == rank]

    def table(self, world: int, host_bytes_per_row: int) -> str:
        lines = ["rank  shards  host rows      host GiB  cache rows   exp. hit  load share"]
        total = sum(self.load.values()) or 1.0
        for rank in range(world):
            mine = self.owned_by(rank)
            host_rows = sum(s.hi - s.lo for s in mine)
            cache = sum(self.cache_rows[s.name] for s in mine)
            w = [self.load[s.name] for s in mine]
            hit = (
                float(np.average([self.hit_rate[s.name] for s in mine], weights=w))
                if mine
                else math.nan
            )
            lines.append(
                f"{rank:>4}  {len(mine):>6}  {host_rows:>12,}  {host_rows * host_bytes_per_row / 2**30:>8.2f}"
                f"  {cache:>10,}  {hit:>8.3f}  {sum(w) / total:>10.3f}"
            )
        for rank in range(world):
            names = [s.name for s in self.owned_by(rank)]
            lines.append(f"rank {rank}: {' '.join(names) if names else '(no tables)'}")
        return "\n".join(lines)


def split_table(t: TableSpec, pieces: int) -> list[Shard]:
    bounds = np.linspace(0, t.num_rows, pieces + 1).round().astype(int)
    return [
        Shard(t.name, int(a), int(b), t.num_rows) for a, b in zip(bounds[:-1], bounds[1:]) if b > a
    ]


def plan_placement(
    tables: list[TableSpec],
    world: int,
    optim: SparseOptim,
    host_budget_bytes: float,
    cache_ratio: float | None = None,
    counts: dict[str, np.ndarray] | None = None,
    shard_rows_above: int = 0,
    extra_row_bytes: int = 0,
) -> Placement:
    """Greedy longest-processing-time assignment of shards to ranks.

    A shard's load is its expected work per step: every lookup costs 1, a predicted cache miss costs
    MISS_COST more (hit rates from the frequency statistics when there are any, else the cache
    ratio).  Without a cache (``cache_ratio`` None) every lookup is a hit.  A table larger than
    one rank's budget (or than ``shard_rows_above`` rows, when set) is split into row ranges.
    ``extra_row_bytes``: the placement's host bookkeeping per row (``host_bytes_per_row``).
    """
    per_row = optim.row_bytes(tables[0].dim) + extra_row_bytes
    need_total = sum(t.num_rows for t in tables) * per_row
    if need_total > world * host_budget_bytes:
        raise ValueError(
            f"{world} rank(s) cannot hold the tables: they need {need_total / 2**30:.2f} GiB of host "
            f"memory in all, {host_budget_bytes / 2**30:.2f} GiB per rank (host_memory_gb); "
            "launch more ranks or raise host_memory_gb"
        )
    shards: list[Shard] = []
    for t in tables:
        pieces = max(1, math.ceil(t.num_rows * per_row / host_budget_bytes))
        if shard_rows_above and t.num_rows > shard_rows_above:
            pieces = max(pieces, world)
        shards += split_table(t, min(pieces, t.num_rows))

    cache_rows, hit_rate, load = {}, {}, {}
    unit = _lookup_unit(tables, counts)
    for s in shards:
        n = s.hi - s.lo
        c = (
            None
            if counts is None or s.table not in counts
            else np.asarray(counts[s.table], dtype=np.float64)
        )
        # the shard's lookups per step: its counted accesses (every id of a multi-hot list) in
        # units of a one-hot table's (see _lookup_unit); without counts, its rows' share of one
        share = c[s.lo : s.hi].sum() / unit if c is not None else n / s.rows_in_table
        if cache_ratio is None:
            cache_rows[s.name], hit = n, 1.0
        else:
            cache_rows[s.name] = k = cache_rows_for(n, cache_ratio)  # as the shard's cache sizes it
            if c is not None:
                seg = np.sort(c[s.lo : s.hi])[::-1]
                hit = float(seg[:k].sum() / max(seg.sum(), 1.0))
            else:
                hit = min(1.0, k / n)
        hit_rate[s.name] = hit
        load[s.name] = share * (1.0 + MISS_COST * (1.0 - hit))

    loads, used = [0.0] * world, [0.0] * world
    placed: dict[str, int] = {}
    for s in sorted(shards, key=lambda s: (-load[s.name], -(s.hi - s.lo), s.name)):
        need = (s.hi - s.lo) * per_row
        fits = [r for r in range(world) if used[r] + need <= host_budget_bytes]
        if not fits:
            raise ValueError(
                f"{world} rank(s) cannot place {s.name} ({need / 2**30:.2f} GiB) within "
                f"{host_budget_bytes / 2**30:.2f} GiB per rank (host_memory_gb); launch more ranks"
            )
        r = min(fits, key=lambda k: (loads[k], used[k], k))
        placed[s.name] = r
        loads[r] += load[s.name]
        used[r] += need
    return Placement(
        shards=[Shard(s.table, s.lo, s.hi, s.rows_in_table, placed[s.name]) for s in shards],
        cache_rows=cache_rows,
        hit_rate=hit_rate,
        load=load,
    )


def _lookup_unit(tables: list[TableSpec], counts: dict[str, np.ndarray] | None) -> float:
    """Accesses that weigh 1 in a shard's load: the mean of the tables' counted totals.  Every
    one-hot table's total is the samples counted, so a one-hot shard weighs its share of its
    table; a multi-hot table, looked up several times per sample, weighs that many times more."""
    if counts is None:
        return 1.0
    totals = [float(np.sum(counts[t.name])) for t in tables if t.name in counts]
    return max(float(np.mean(totals)) if totals else 1.0, 1.0)


def available_host_bytes(local_world_size: int) -> float:
    """MemAvailable of this machine, shared by the ranks on it."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / max(1, local_world_size)
    except OSError:
        pass
    return float("inf")
