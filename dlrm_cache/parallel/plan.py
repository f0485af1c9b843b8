"""Which rank owns which table: balanced by expected load, within each rank's host memory."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..embedding.base import SparseOptim, TableSpec

# A lookup that misses the device cache moves a row over PCIe and back: several hits' worth of work.
MISS_COST = 8.0


@dataclass
class Placement:
    owner: dict[str, int]  # table -> rank
    rows: list[tuple[str, int, int, float, float]]  # (table, rank, cache rows, hit rate, load)
    table_rows: dict[str, int]  # table -> rows in host memory

    def table(self, world: int, host_bytes_per_row: int) -> str:
        lines = ["rank  tables  host rows      host GiB  cache rows   exp. hit  load share"]
        total = sum(r[4] for r in self.rows) or 1.0
        for rank in range(world):
            mine = [r for r in self.rows if r[1] == rank]
            host_rows = sum(self.table_rows[r[0]] for r in mine)
            cache = sum(r[2] for r in mine)
            hits = [r[3] for r in mine]
            hit = float(np.mean(hits)) if hits else float("nan")
            load = sum(r[4] for r in mine) / total
            lines.append(
                f"{rank:>4}  {len(mine):>6}  {host_rows:>12,}  {host_rows * host_bytes_per_row / 2**30:>8.2f}"
                f"  {cache:>10,}  {hit:>8.3f}  {load:>10.3f}"
            )
        for rank in range(world):
            names = [r[0] for r in self.rows if r[1] == rank]
            lines.append(f"rank {rank}: {' '.join(names) if names else '(no tables)'}")
        return "\n".join(lines)


def host_bytes_per_row(dim: int, optim: SparseOptim) -> int:
    state = {0: 0, 1: 1, -1: dim}[optim.state_per_row]
    return 4 * (dim + state)


def plan_placement(
    tables: list[TableSpec],
    world: int,
    optim: SparseOptim,
    host_budget_bytes: float,
    cache_ratio: float | None = None,
    counts: dict[str, np.ndarray] | None = None,
) -> Placement:
    """Greedy longest-processing-time assignment of whole tables to ranks.

    A table's load is its expected work per step: every lookup costs 1, a predicted cache miss costs
    MISS_COST more (hit rates from the frequency statistics when there are any, else the cache
    ratio).  Without a cache (``cache_ratio`` None) every lookup is a hit.
    """
    per_row = host_bytes_per_row(tables[0].dim, optim)
    need = {t.name: t.num_rows * per_row for t in tables}
    too_big = [t.name for t in tables if need[t.name] > host_budget_bytes]
    if too_big:
        raise ValueError(
            f"table(s) {', '.join(too_big)} need {max(need[n] for n in too_big) / 2**30:.2f} GiB of host "
            f"memory but a rank has {host_budget_bytes / 2**30:.2f} GiB (host_memory_gb); row-wise "
            "sharding of a single table is not implemented yet"
        )
    if sum(need.values()) > world * host_budget_bytes:
        raise ValueError(
            f"{world} rank(s) cannot hold the tables: they need {sum(need.values()) / 2**30:.2f} GiB of "
            f"host memory in all, {host_budget_bytes / 2**30:.2f} GiB per rank (host_memory_gb); "
            "launch more ranks or raise host_memory_gb"
        )
    info = []
    for t in tables:
        if cache_ratio is None:
            cache_rows, hit = t.num_rows, 1.0
        else:
            cache_rows = max(1, math.ceil(cache_ratio * t.num_rows))
            if counts is not None and t.name in counts:
                c = np.sort(np.asarray(counts[t.name], dtype=np.float64))[::-1]
                hit = float(c[:cache_rows].sum() / max(c.sum(), 1.0))
            else:
                hit = min(1.0, cache_rows / t.num_rows)
        load = 1.0 + MISS_COST * (1.0 - hit)
        info.append((t, cache_rows, hit, load))
    loads = [0.0] * world
    used = [0.0] * world
    owner: dict[str, int] = {}
    rows = []
    for t, cache_rows, hit, load in sorted(info, key=lambda x: (-x[3], -x[0].num_rows, x[0].name)):
        fits = [r for r in range(world) if used[r] + need[t.name] <= host_budget_bytes]
        if not fits:
            raise ValueError(
                f"{world} rank(s) cannot place table {t.name} ({need[t.name] / 2**30:.2f} GiB) within "
                f"{host_budget_bytes / 2**30:.2f} GiB per rank (host_memory_gb); launch more ranks"
            )
        r = min(fits, key=lambda k: (loads[k], used[k], k))
        owner[t.name] = r
        loads[r] += load
        used[r] += need[t.name]
        rows.append((t.name, r, cache_rows, hit, load))
    order = {t.name: i for i, t in enumerate(tables)}
    return Placement(
        owner=owner,
        rows=sorted(rows, key=lambda x: order[x[0]]),
        table_rows={t.name: t.num_rows for t in tables},
    )


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
