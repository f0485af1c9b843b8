"""The shard stream and the background prefetcher."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from dlrm_cache.concurrency.threads import Prefetcher
from dlrm_cache.data.format import Manifest
from dlrm_cache.data.loader import ShardStream


def _rows(batch) -> np.ndarray:
    return torch.cat([batch.labels[:, None], batch.dense], dim=1).numpy()


def test_ranks_split_the_same_global_batches(small_dataset: Path):
    m = Manifest.load(small_dataset)
    one = list(ShardStream(small_dataset, m, "train", 256, shuffle=True, seed=3).batches(epoch=1))
    parts = [
        list(
            ShardStream(
                small_dataset, m, "train", 256, shuffle=True, seed=3, rank=r, world_size=2
            ).batches(epoch=1)
        )
        for r in range(2)
    ]
    assert len(one) == len(parts[0]) == len(parts[1]) == 6000 // 256
    for k, b in enumerate(one):
        np.testing.assert_array_equal(
            _rows(b), np.concatenate([_rows(parts[0][k]), _rows(parts[1][k])])
        )
        torch.testing.assert_close(
            b.sparse.values().view(-1, 256)[:, :128], parts[0][k].sparse.values().view(-1, 128)
        )


def test_start_skips_exactly_and_epochs_reshuffle(small_dataset: Path):
    m = Manifest.load(small_dataset)
    s = ShardStream(small_dataset, m, "train", 100, shuffle=True, seed=0)
    full = [_rows(b) for b in s.batches(epoch=0)]
    resumed = [_rows(b) for b in s.batches(epoch=0, start=17)]
    assert len(resumed) == len(full) - 17
    for a, b in zip(full[17:], resumed):
        np.testing.assert_array_equal(a, b)
    other = _rows(next(iter(s.batches(epoch=1))))
    assert not np.array_equal(full[0], other)


def test_eval_stream_keeps_every_row_even_on_uneven_ranks(small_dataset: Path):
    m = Manifest.load(small_dataset)
    sizes = [
        [
            b.size
            for b in ShardStream(
                small_dataset, m, "val", 1999, rank=r, world_size=2, drop_last=False
            ).batches()
        ]
        for r in range(2)
    ]
    assert sizes == [[999, 0], [1000, 1]]
    with pytest.raises(ValueError, match="data.batch_size=1999: must be a positive multiple"):
        ShardStream(small_dataset, m, "train", 1999, world_size=2)


def test_ids_outside_the_tables_name_the_shard(small_dataset: Path):
    m = Manifest.load(small_dataset)
    shard = small_dataset / m.splits["val"].shards[0]
    t = pq.read_table(shard)
    col = t.column("C2").to_numpy().copy()
    col[5] = m.table_sizes[1]
    pq.write_table(t.set_column(t.schema.get_field_index("C2"), "C2", [col]), shard)
    with pytest.raises(ValueError, match=f"{shard}: column C2 holds ids outside"):
        list(ShardStream(small_dataset, m, "val", 100).batches())


def _slow_square(x):
    time.sleep(0.01 * (x % 3))  # later items can finish first on another worker
    if x == 13:
        raise KeyError("boom at 13")
    return x * x


def test_prefetcher_keeps_order_with_workers_and_raises_in_consumer():
    assert list(Prefetcher(iter(range(12)), depth=2, transform=_slow_square, workers=3)) == [
        i * i for i in range(12)
    ]
    out = []
    with pytest.raises(KeyError, match="boom at 13"):
        for v in Prefetcher(iter(range(20)), depth=2, transform=_slow_square, workers=3):
            out.append(v)
    assert out == [i * i for i in range(13)]


def test_prefetcher_close_does_not_hang():
    p = Prefetcher(iter(range(10_000)), depth=2, transform=_slow_square, workers=2)
    next(p)
    t = time.perf_counter()
    p.close()
    assert time.perf_counter() - t < 5


def _reference_batches(
    root: Path,
    m: Manifest,
    split: str,
    batch: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    rank: int,
    world: int,
    drop_last: bool,
):
    """The stream's definition, written the plain way (the row-major loader before columnar
    decoding): shards in a seeded order, each shard's rows permuted by its own seed, concatenated;
    global batch k = rows [kB, (k+1)B); rank r takes rows [n*r//W, n*(r+1)//W) of it."""
    info = m.splits[split]
    order = (
        np.random.default_rng([seed, epoch, 0xD1]).permutation(len(info.shards))
        if shuffle
        else range(len(info.shards))
    )
    rows = []
    for idx in order:
        t = pq.read_table(root / info.shards[idx])
        r = np.stack(
            [
                t.column(c).to_numpy().astype(np.float64)
                for c in ["label", *m.dense_names, *m.sparse_names]
            ],
            axis=1,
        )
        if shuffle:
            r = r[np.random.default_rng([seed, epoch, int(idx)]).permutation(len(r))]
        rows.append(r)
    stream = np.concatenate(rows)
    ends = (
        range(batch, len(stream) + 1, batch)
        if drop_last
        else range(batch, len(stream) + batch, batch)
    )
    for end in ends:
        g = stream[end - batch : min(end, len(stream))]
        n = len(g)
        yield g[(n * rank) // world : (n * (rank + 1)) // world]


@pytest.mark.parametrize(
    "split,batch,shuffle,world,drop_last",
    [
        ("train", 256, True, 1, True),
        ("train", 333, True, 3, True),
        ("train", 700, False, 2, True),
        ("val", 1999, False, 2, False),
        ("val", 512, True, 3, False),
    ],
)
def test_stream_matches_the_reference_definition_batch_by_batch(
    small_dataset: Path, split, batch, shuffle, world, drop_last
):
    m = Manifest.load(small_dataset)
    for epoch, resume in [(0, False), (1, False), (1, True)]:
        for rank in range(world):
            want = list(
                _reference_batches(
                    small_dataset, m, split, batch, shuffle, 7, epoch, rank, world, drop_last
                )
            )
            start = len(want) // 2 if resume else 0  # mid-epoch, mostly inside a shard
            stream = ShardStream(
                small_dataset,
                m,
                split,
                batch,
                shuffle,
                seed=7,
                rank=rank,
                world_size=world,
                drop_last=drop_last,
            )
            got, want = list(stream.batches(epoch, start)), want[start:]
            assert len(got) == len(want) > 0
            for g, w in zip(got, want):
                assert g.sparse.values().dtype == torch.int32
                assert g.sparse.stride() == len(w)
                assert g.sparse.keys() == m.sparse_names
                np.testing.assert_array_equal(g.labels.numpy(), w[:, 0])
                np.testing.assert_array_equal(g.dense.numpy(), w[:, 1:14])
                # feature-major values: feature f's ids over the batch are one slice
                np.testing.assert_array_equal(
                    g.sparse.values().view(len(m.sparse_names), -1).numpy(), w[:, 14:].T
                )
                np.testing.assert_array_equal(
                    g.sparse.offsets().numpy(), np.arange(w[:, 14:].size + 1)
                )
