"""Placement of tables and row ranges over ranks."""

from __future__ import annotations

import numpy as np
import pytest

from dlrm_cache.embedding.base import SparseOptim, TableSpec
from dlrm_cache.parallel.placement import parse_key, plan_placement, shard_name

OPT = SparseOptim("rowwise_adagrad")


def test_too_big_table_is_split_row_wise_within_budget():
    tables = [TableSpec("C1", 1000, 8), TableSpec("C2", 10, 8)]
    per_row = OPT.row_bytes(8)
    assert per_row == 36  # 8 floats + 1 rowwise state
    p = plan_placement(tables, world=4, optim=OPT, host_budget_bytes=300 * per_row)
    c1 = sorted((s.lo, s.hi) for s in p.shards if s.table == "C1")
    assert len(c1) == 4 and c1[0][0] == 0 and c1[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in zip(c1, c1[1:]))  # contiguous, no row twice
    for r in range(4):
        assert sum(s.hi - s.lo for s in p.owned_by(r)) * per_row <= 300 * per_row
    assert {s.name for s in p.shards if s.table == "C2"} == {"C2"}  # small tables stay whole


def test_load_balance_uses_frequency_stats():
    """Two tables whose caches miss a lot must not land on the same rank."""
    rng = np.random.default_rng(0)
    tables = [TableSpec(f"C{i}", 1000, 8) for i in range(1, 5)]
    flat = np.ones(1000)  # every row equally hot: a 5% cache misses 95%
    skewed = np.sort(rng.pareto(0.5, 1000))[::-1] + 1  # a few rows take almost all accesses
    counts = {"C1": flat, "C2": flat, "C3": skewed, "C4": skewed}
    p = plan_placement(
        tables, world=2, optim=OPT, host_budget_bytes=1e9, cache_ratio=0.05, counts=counts
    )
    owner = {s.table: s.rank for s in p.shards}
    assert owner["C1"] != owner["C2"]
    assert p.hit_rate["C3"] > 0.5 > p.hit_rate["C1"]
    assert "exp. hit" in p.table(2, OPT.row_bytes(8))


def test_not_enough_ranks_is_a_clear_error():
    with pytest.raises(ValueError, match="2 rank\\(s\\) cannot hold the tables"):
        plan_placement([TableSpec("C1", 1000, 8)], world=2, optim=OPT, host_budget_bytes=100)


def test_shard_keys_round_trip():
    assert shard_name("C3", 0, 10, 10) == "C3"
    assert parse_key(f"{shard_name('C3', 5, 10, 20)}.momentum1") == ("C3", 5, 10, "momentum1")
    assert parse_key("C3.weight") == ("C3", None, None, "weight")
