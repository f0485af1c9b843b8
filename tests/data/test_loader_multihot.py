"""Jagged batches of a multi-hot dataset, checked against the parquet files read independently."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from dlrm_cache.data.format import DENSE_NAMES, LABEL, Manifest
from dlrm_cache.data.loader import ShardStream
from dlrm_cache.embedding.base import SparseOptim, TableSpec
from dlrm_cache.parallel.placement import plan_placement


def _rows(root: Path, m: Manifest, split: str) -> tuple[dict[bytes, int], list[list[list[int]]]]:
    """Every row of ``split`` (plain pyarrow -> Python lists): its key (label and dense values as
    bytes) -> its index, and per feature each row's list of ids (a one-hot id as a list of one)."""
    keys: dict[bytes, int] = {}
    lists: list[list[list[int]]] = [[] for _ in m.sparse_names]
    for rel in m.splits[split].shards:
        t = pq.read_table(root / rel)
        block = np.stack([t.column(c).to_numpy() for c in (LABEL, *DENSE_NAMES)], axis=1)
        for row in block:
            keys[row.astype(np.float32).tobytes()] = len(keys)
        for f, name in enumerate(m.sparse_names):
            col = t.column(name).to_pylist()
            lists[f] += col if name in m.multi_hot else [[x] for x in col]
    assert len(keys) == m.splits[split].rows  # the dense values identify a row
    return keys, lists


def _expected(batch, keys, lists, features: list[int]) -> tuple[list[int], list[int]]:
    """The batch's (values, lengths), feature-major, from the rows its dense values name."""
    block = torch.cat([batch.labels[:, None], batch.dense], dim=1).numpy()
    rows = [keys[r.tobytes()] for r in block]
    values, lengths = [], []
    for f in features:
        for r in rows:
            values += lists[f][r]
            lengths.append(len(lists[f][r]))
    return values, lengths


def _check(batch, keys, lists, m: Manifest) -> None:
    kjt = batch.sparse
    values, lengths = _expected(batch, keys, lists, list(range(len(m.sparse_names))))
    b = batch.size
    assert kjt.keys() == m.sparse_names and kjt.stride() == b
    assert kjt.values().tolist() == values and kjt.lengths().tolist() == lengths
    assert kjt.lengths().dtype == torch.int32 and kjt.offsets().dtype == kjt.values().dtype
    assert kjt.offsets().tolist() == np.concatenate([[0], np.cumsum(lengths)]).tolist()
    per_key = [sum(lengths[f * b : (f + 1) * b]) for f in range(len(m.sparse_names))]
    assert kjt.length_per_key() == per_key
    assert kjt.offset_per_key() == np.concatenate([[0], np.cumsum(per_key)]).tolist()


@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_hold_the_lists_of_their_rows(multi_hot_dataset: Path, shuffle: bool):
    m = Manifest.load(multi_hot_dataset)
    keys, lists = _rows(multi_hot_dataset, m, "train")
    stream = ShardStream(multi_hot_dataset, m, "train", 256, shuffle=shuffle, seed=4)
    batches = list(stream.batches(epoch=1))
    assert len(batches) == 3000 // 256
    for batch in batches:
        _check(batch, keys, lists, m)
    assert any(0 in batch.sparse.lengths().tolist() for batch in batches)  # empty lists too
    # resuming at step s yields the same batches s, s+1, ...
    resumed = list(stream.batches(epoch=1, start=5))
    assert len(resumed) == len(batches) - 5
    for a, b in zip(batches[5:], resumed):
        assert torch.equal(a.sparse.values(), b.sparse.values())
        assert torch.equal(a.sparse.lengths(), b.sparse.lengths())
        assert torch.equal(a.dense, b.dense)


def test_ranks_take_their_rows_of_the_global_batch(multi_hot_dataset: Path):
    m = Manifest.load(multi_hot_dataset)
    keys, lists = _rows(multi_hot_dataset, m, "val")
    args = dict(shuffle=False, drop_last=False)
    whole = list(ShardStream(multi_hot_dataset, m, "val", 300, **args).batches())
    parts = [
        list(ShardStream(multi_hot_dataset, m, "val", 300, rank=r, world_size=2, **args).batches())
        for r in range(2)
    ]
    assert [len(p) for p in parts] == [len(whole)] * 2 == [4, 4]
    for k, g in enumerate(whole):
        mine = [p[k] for p in parts]
        assert [b.size for b in mine] == [g.size // 2, g.size - g.size // 2]
        for b in mine:
            _check(b, keys, lists, m)
        for name in m.sparse_names:
            glob = g.sparse[name]
            ranks = [b.sparse[name] for b in mine]
            assert torch.equal(glob.values(), torch.cat([j.values() for j in ranks]))
            assert torch.equal(glob.lengths(), torch.cat([j.lengths() for j in ranks]))


def test_owned_shards_hold_their_ids_of_every_list(multi_hot_dataset: Path):
    """Sharded embeddings: a row-range shard holds the ids inside its range, relative to its
    first row, a sample's length is how many fell inside; a whole table holds the lists."""
    m = Manifest.load(multi_hot_dataset)
    keys, lists = _rows(multi_hot_dataset, m, "train")
    tables = [TableSpec(n, r, 8) for n, r in zip(m.sparse_names, m.table_sizes)]
    shards = plan_placement(tables, 2, SparseOptim("sgd"), 1e12, shard_rows_above=50).shards
    assert any(s.lo > 0 for s in shards) and any(s.rows_in_table == s.hi - s.lo for s in shards)
    whole = list(ShardStream(multi_hot_dataset, m, "train", 512, True, seed=2).batches())
    for rank in range(2):
        mine = [s for s in shards if s.rank == rank]
        stream = ShardStream(
            multi_hot_dataset, m, "train", 512, True, seed=2, rank=rank, world_size=2, shards=mine
        )
        for g, b in zip(whole, stream.batches()):
            block = torch.cat([g.labels[:, None], g.dense], dim=1).numpy()
            rows = [keys[r.tobytes()] for r in block]
            values, lengths = [], []
            for s in mine:
                for r in rows:
                    inside = [i - s.lo for i in lists[m.sparse_names.index(s.table)][r]]
                    inside = [i for i in inside if 0 <= i < s.hi - s.lo]
                    values += inside
                    lengths.append(len(inside))
            kjt = b.sparse
            assert kjt.keys() == [s.name for s in mine] and kjt.stride() == 512
            assert kjt.values().tolist() == values and kjt.lengths().tolist() == lengths
            assert kjt.offsets().tolist() == np.concatenate([[0], np.cumsum(lengths)]).tolist()
            assert sum(kjt.length_per_key()) == len(values)
            moved = b.to(torch.device("cpu"), copy=True).sparse  # host-known metadata kept
            assert moved.length_per_key() == kjt.length_per_key()
            assert moved.values().data_ptr() != kjt.values().data_ptr()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("sharded", [False, True])
def test_pinned_jagged_batches_move_to_the_gpu(multi_hot_dataset: Path, sharded: bool):
    """Built in pinned memory, copied asynchronously, the per-key lengths still on the host."""
    m = Manifest.load(multi_hot_dataset)
    tables = [TableSpec(n, r, 8) for n, r in zip(m.sparse_names, m.table_sizes)]
    shards = plan_placement(tables, 2, SparseOptim("sgd"), 1e12, shard_rows_above=50).shards
    mine = [s for s in shards if s.rank == 0] if sharded else None  # row ranges among them
    stream = ShardStream(
        multi_hot_dataset, m, "train", 256, True, world_size=2, pin=True, shards=mine
    )
    batch = next(iter(stream.batches()))
    kjt = batch.sparse
    assert all(t.is_pinned() for t in (kjt.values(), kjt.lengths(), kjt.offsets(), batch.dense))
    moved = batch.to(torch.device("cuda")).sparse
    assert moved.length_per_key() == kjt.length_per_key() and moved.stride() == kjt.stride()
    torch.cuda.synchronize()
    for a, b in [(moved.values(), kjt.values()), (moved.lengths(), kjt.lengths())]:
        assert a.is_cuda and torch.equal(a.cpu(), b)
    assert moved.offsets().is_cuda and torch.equal(moved.offsets().cpu(), kjt.offsets())
