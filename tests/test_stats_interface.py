"""EmbeddingBackend.stats() reads the counters; reset_stats() starts them afresh; take_stats() is
one interval's counters (both)."""

from __future__ import annotations

import pytest
import torch

from dlrm_cache.embedding.base import SparseOptim, TableSpec
from dlrm_cache.embedding.direct import HbmBackend, HostBackend, UvmCacheBackend


def test_host_memory_capability_is_declared_on_the_backend_class() -> None:
    """build.check_host_memory counts a second copy of the rows for placements that keep them on
    the host; it reads that from the class, not its name."""
    assert HostBackend.keeps_rows_in_host_memory and UvmCacheBackend.keeps_rows_in_host_memory
    assert not HbmBackend.keeps_rows_in_host_memory


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="uvm_cache needs CUDA")
def test_uvm_cache_stats_are_read_without_resetting() -> None:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    tables = [TableSpec("a", 1000, 8), TableSpec("b", 500, 8)]
    emb = UvmCacheBackend(
        tables, SparseOptim("rowwise_adagrad", 0.01), device="cuda", cache_ratio=0.1
    )
    ids = torch.arange(64, dtype=torch.int64)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["a", "b"], torch.cat([ids, ids]).cuda(), torch.ones(128, dtype=torch.int32).cuda()
    )
    emb(kjt).values().sum().backward()
    first = emb.stats()
    assert first["distinct_ids"] > 0 and first == emb.stats()  # a read changes nothing
    assert emb.take_stats() == first and emb.stats()["distinct_ids"] == 0  # take: read, then reset
