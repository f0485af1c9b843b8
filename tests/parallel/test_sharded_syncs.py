"""ShardedEmbeddings reads nothing back from a device: no host synchronization per step.

Each rank's loader keeps its own shards' ids for the whole global batch, so no ids and no counts are
exchanged, and the pooled exchange's sizes come from the batch size and the rank count.  c40961b's
ShardedEmbeddings, which exchanged the ids, did 26 host reads per step here (2 ranks, 8 shards):
see /work/notes/sharded.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from launching import launch_ranks

from dlrm_cache.bench.syncs import HostSyncCounter
from dlrm_cache.config.choices import Pooling
from dlrm_cache.data.batch import Batch
from dlrm_cache.data.format import Manifest
from dlrm_cache.data.loader import ShardStream
from dlrm_cache.embedding.base import SparseOptim, TableSpec, initial_state
from dlrm_cache.embedding.direct import HostBackend
from dlrm_cache.parallel.placement import Shard, plan_placement
from dlrm_cache.parallel.sharded import ShardedEmbeddings
from dlrm_cache.train.pipeline import Pipeline

REPO = Path(__file__).resolve().parents[2]


def _counted_steps(root: str) -> dict:
    """One rank: evaluation batches (the last one uneven), then training steps, each counted."""
    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        m = Manifest.load(root)
        tables = [TableSpec(n, r, 8) for n, r in zip(m.sparse_names, m.table_sizes)]
        # sgd: fbgemm's CPU rowwise_adagrad reads its host-side iteration counter every forward
        # (iter_cpu.item(): host memory under CUDA too, no device sync), which would count here
        optim = SparseOptim("sgd", 0.1)
        shards = plan_placement(tables, 2, optim, 1e12, shard_rows_above=100).shards  # mixed
        mine = [s for s in shards if s.rank == rank]
        emb = ShardedEmbeddings(
            tables, optim, shards, lambda t, s: HostBackend(t, optim), torch.device("cpu")
        )
        full = initial_state(tables, optim, seed=0)
        emb.import_tables(
            {f"{s.name}.weight": full[f"{s.table}.weight"][s.lo : s.hi] for s in mine}
        )

        def stream(split: str, size: int, owned: list[Shard] | None) -> list[Batch]:
            train = split == "train"
            return list(
                ShardStream(
                    root,
                    m,
                    split,
                    size,
                    train,
                    seed=1,
                    rank=rank,
                    world_size=2,
                    drop_last=train,
                    shards=owned,
                ).batches()
            )

        reads, ops, sizes = [], [], []
        with (
            torch.no_grad()
        ):  # 2000 rows in batches of 1999: the last one is 1 row, rank 0 gets none
            for b, ref in zip(stream("val", 1999, mine), stream("val", 1999, None)):
                with HostSyncCounter() as c:
                    out = emb(b.sparse).values()
                    mean = emb.pool(b.sparse, Pooling.mean).values()  # bag sizes ride along
                reads.append(c.total_syncs)
                ops.append(c.total_ops)
                sizes.append(b.size)
                # pooled rows of this rank's samples, in table order: a lookup in the whole tables
                ids = ref.sparse.values().view(len(tables), -1).long()
                want = torch.cat(
                    [full[f"{t.name}.weight"][ids[j]] for j, t in enumerate(tables)], 1
                )
                assert torch.equal(out, want) and torch.equal(mean, want)  # bags of one id
        for b in stream("train", 128, mine)[:3]:
            with HostSyncCounter() as c:
                emb.prefetch(b.sparse)
                emb(b.sparse).values().square().sum().backward()
                emb.step_done()
            reads.append(c.total_syncs)
            ops.append(c.total_ops)
        with HostSyncCounter() as control:  # the counter sees a read in this process
            torch.ones(1).item()
        return {"reads": reads, "ops": ops, "sizes": sizes, "control": control.total_syncs}
    finally:
        dist.destroy_process_group()


def test_sharded_steps_read_nothing_back(shared_small_dataset: Path):
    out = launch_ranks(2, _counted_steps, str(shared_small_dataset))
    assert out[0]["sizes"] == [999, 0] and out[1]["sizes"] == [1000, 1]
    for rank in (0, 1):
        assert out[rank]["control"] == 1 and min(out[rank]["ops"]) > 0  # it saw the steps' ops
        assert out[rank]["reads"] == [0] * 5, out[rank]


def test_one_rank_equals_its_local_backend_through_the_pipeline(tmp_path: Path):
    """World of 1 over a freq_cache with look-ahead 2: the wrapper hands the loader thread's
    analysis and the prefetches to its local backend (FIFO), and changes no number."""
    from dlrm_cache.embedding.freq_cache import FreqCacheBackend

    sys.path.insert(0, str(REPO / "tests" / "embedding"))
    from test_freq_cache import make_batch, make_tables, random_state

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        tables, optim = make_tables(), SparseOptim("sgd", lr=0.1)
        shards = [Shard(t.name, 0, t.num_rows, t.num_rows, rank=0) for t in tables]

        def cache(local: list[TableSpec], mine: list[Shard] | None = None) -> FreqCacheBackend:
            return FreqCacheBackend(
                local, optim, device="cpu", cache_ratio=0.05, policy="lru", lookahead=2
            )

        sharded = ShardedEmbeddings(tables, optim, shards, cache, torch.device("cpu"))
        plain = cache(tables)
        state = random_state(tables, optim)
        sharded.import_tables(state)
        plain.import_tables(state)
        assert sharded.lookahead == 2
        rng = np.random.default_rng(0)
        kjts = [make_batch(rng, tables, 32) for _ in range(6)]
        outs = []
        for emb in (sharded, plain):
            batches = [Batch(torch.zeros(32, 13), k, torch.zeros(32)) for k in kjts]
            got = []
            with Pipeline(iter(batches), torch.device("cpu"), emb) as pipeline:
                for b in pipeline:
                    out = emb(b.sparse).values()
                    (out * torch.arange(out.shape[1])).sum().backward()
                    got.append(out.detach())
            outs.append(got)
        for a, b in zip(*outs):
            assert torch.equal(a, b)
        for k, v in plain.export_tables().items():
            assert torch.equal(sharded.export_tables()[k], v), k
        assert sharded.stats()["rows_loaded"] == plain.stats()["rows_loaded"] > 0
        with pytest.raises(ValueError, match="owns shards"):  # a loader built without the shards
            sharded(make_batch(rng, tables[:2], 4))
    finally:
        dist.destroy_process_group()
