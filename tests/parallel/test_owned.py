"""A sharded rank's batches: its rows' dense part, its own shards' ids over the global batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dlrm_cache.data.format import Manifest
from dlrm_cache.data.loader import ShardStream
from dlrm_cache.embedding.base import SparseOptim, TableSpec
from dlrm_cache.parallel.owned import OwnedShards, rank_sizes
from dlrm_cache.parallel.placement import Shard, plan_placement


def _placement(m: Manifest, world: int, shard_rows_above: int) -> list[Shard]:
    tables = [TableSpec(n, r, 8) for n, r in zip(m.sparse_names, m.table_sizes)]
    return plan_placement(
        tables, world, SparseOptim("sgd"), 1e12, shard_rows_above=shard_rows_above
    ).shards


def _expected(global_ids: np.ndarray, keys: list[str], shards: list[Shard]):
    """The rank's KJT recomputed sample by sample from the global batch (plain Python)."""
    values, lengths, per_key = [], [], []
    for s in shards:
        column = global_ids[keys.index(s.table)].tolist()
        inside = [s.lo <= i < s.hi for i in column]
        values += [i - s.lo for i in column if s.lo <= i < s.hi]
        lengths += [int(x) for x in inside]
        per_key.append(sum(inside))
    return values, lengths, per_key


@pytest.mark.parametrize(
    "split,batch,world,rows_above",
    [
        ("train", 256, 2, 100),  # row-wise and whole tables, shuffled training batches
        (
            "val",
            1999,
            2,
            100,
        ),  # evaluation: the last global batch has 1 row, rank 0 gets none of it
        ("val", 700, 7, 0),  # 5 whole tables over 7 ranks: two ranks own no shard
    ],
)
def test_owned_ids_match_a_recomputation_from_the_global_batch(
    shared_small_dataset: Path, split: str, batch: int, world: int, rows_above: int
):
    m = Manifest.load(shared_small_dataset)
    train = split == "train"
    shards = _placement(m, world, rows_above)
    assert any(s.lo > 0 for s in shards) == (rows_above > 0)
    whole = list(
        ShardStream(shared_small_dataset, m, split, batch, train, seed=5, drop_last=train).batches()
    )
    for rank in range(world):
        mine = [s for s in shards if s.rank == rank]
        stream = ShardStream(
            shared_small_dataset,
            m,
            split,
            batch,
            train,
            seed=5,
            rank=rank,
            world_size=world,
            drop_last=train,
            shards=mine,
        )
        got = list(stream.batches())
        assert len(got) == len(whole)
        for g, b in zip(whole, got):
            n = g.size
            ids = g.sparse.values().view(len(m.sparse_names), n).numpy()
            values, lengths, per_key = _expected(ids, list(m.sparse_names), mine)
            kjt = b.sparse
            assert kjt.keys() == [s.name for s in mine] and kjt.stride() == n
            assert kjt.values().tolist() == values and kjt.lengths().tolist() == lengths
            assert kjt.offsets().tolist() == np.concatenate([[0], np.cumsum(lengths)]).tolist()
            assert kjt.length_per_key() == per_key and kjt.values().dtype == torch.int32
            # the dense part is still this rank's rows only
            lo = sum(rank_sizes(n, world)[:rank])
            assert b.size == rank_sizes(n, world)[rank]
            torch.testing.assert_close(b.dense, g.dense[lo : lo + b.size], rtol=0, atol=0)
            torch.testing.assert_close(b.labels, g.labels[lo : lo + b.size], rtol=0, atol=0)
    assert any(not [s for s in shards if s.rank == r] for r in range(world)) == (
        world > len(m.sparse_names)
    )


def test_batches_move_with_their_layout():
    """Batch.to keeps the host-known metadata of an owned-shards KJT (no read-back needed)."""
    shards = [Shard("A", 0, 10, 10, 0), Shard("B", 5, 9, 9, 0)]
    layout = OwnedShards(["A", "B"], shards)
    ids = np.array([[1, 2, 3], [4, 5, 8]], dtype=np.int64)
    kjt = layout.kjt([ids[:, :1], ids[:, 1:]])  # a global batch in two pieces
    assert kjt.values().tolist() == [1, 2, 3, 0, 3] and kjt.lengths().tolist() == [1, 1, 1, 0, 1, 1]
    assert kjt.offsets().dtype == torch.int64 and kjt.length_per_key() == [3, 2]
    meta = torch.device("meta")
    moved = layout.sparse_to(kjt, meta)
    assert (
        moved.values().device == meta and moved.stride() == 3 and moved.length_per_key() == [3, 2]
    )
    assert moved.offset_per_key() == [0, 3, 5]
    with pytest.raises(ValueError, match="table 'C'"):
        OwnedShards(["A", "B"], [Shard("C", 0, 4, 4, 0)])
