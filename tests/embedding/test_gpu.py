"""The same equalities on CUDA: freq_cache and uvm_cache against all rows in GPU memory.

Skipped without CUDA (this project's CI has none); run them on the GPU machine with
`python -m pytest -m gpu`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_freq_cache import (
    DIM,
    assert_tables_equal,
    make_batch,
    make_counts,
    make_tables,
    random_state,
)

from dlrm_cache.concurrency.streams import streams_for
from dlrm_cache.embedding.base import SparseOptim
from dlrm_cache.embedding.direct import HbmBackend, UvmCacheBackend
from dlrm_cache.embedding.freq_cache import FreqCacheBackend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
GPU_TOL = dict(rtol=1e-4, atol=1e-5)


def train_steps(backend, batches, lookahead: int, seed: int = 0, flush_at=()) -> list[torch.Tensor]:
    """The trainer's protocol as the Pipeline runs it: each batch copied to the GPU on the input
    stream, prefetched ``lookahead`` steps ahead, forwarded once the compute stream has waited for
    its copy; no synchronization between steps (the outputs are read at the end).  ``flush_at``:
    steps before which the backend is flushed with the window prefetched (a checkpoint)."""
    st = streams_for("cuda")
    copies = []
    for b in batches:
        with st.use(st.input):
            copies.append((b.to("cuda", non_blocking=True), st.record_event(st.input)))
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(b.stride(), len(b.keys()) * DIM, generator=g).cuda() for b in batches]
    outs = []
    for i in range(min(lookahead, len(batches))):
        backend.prefetch(*copies[i])
    for i, (b, ready) in enumerate(copies):
        if lookahead and i + lookahead < len(batches):
            backend.prefetch(*copies[i + lookahead])
        if i in flush_at:
            backend.flush()
        st.wait_event(st.current_stream(), ready)
        out = backend(b).values()
        (out * weights[i]).sum().backward()
        outs.append(out.detach())
        backend.step_done()
    torch.cuda.synchronize()
    return [o.cpu() for o in outs]


@pytest.mark.parametrize(
    "policy, lookahead, batch, ratio, path",
    [
        # the normal path: streams, events, staging copies in and out (checked on CPU:
        # these sizes neither defer nor overflow)
        ("freq", 0, 128, 0.1, "normal"),
        ("freq", 2, 128, 0.1, "normal"),
        ("lru", 2, 128, 0.12, "normal"),
        # a window of 3 that does not always fit: some batches deferred, prepared after a retire
        ("lfu", 3, 128, 0.1, "deferred"),
        # every batch larger than the cache: the overflow path
        ("lru", 2, 256, 0.05, "overflow"),
    ],
)
def test_freq_cache_on_gpu_matches_hbm(policy, lookahead, batch, ratio, path):
    tables = make_tables()
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    state = random_state(tables, optim)
    hbm = HbmBackend(tables, optim, device="cuda")
    cache = FreqCacheBackend(
        tables,
        optim,
        device="cuda",
        cache_ratio=ratio,
        policy=policy,
        lookahead=lookahead,
        counts=make_counts(tables) if policy == "freq" else None,
    )
    assert cache.transfers.cache_w.is_cuda and not cache.store.data.is_cuda
    hbm.import_tables(state)
    cache.import_tables(state)
    rng = np.random.default_rng(1)
    batches = [make_batch(rng, tables, batch) for _ in range(30)]
    for a, b in zip(train_steps(hbm, batches, 0), train_steps(cache, batches, lookahead)):
        torch.testing.assert_close(b, a, **GPU_TOL)
    s = cache.stats()
    assert s["evictions"] > 100 and s["rows_written_back"] > 100, s
    assert (s["overflow_batches"] > 0) == (path == "overflow"), s
    if path != "overflow":
        assert (s["deferred_batches"] > 0) == (path == "deferred"), s
    assert s["transfer_wait_s"] >= 0.0 and cache.transfers._waits == []  # the timed waits were read
    assert_tables_equal(cache.export_tables(), hbm.export_tables(), **GPU_TOL)


@pytest.mark.parametrize("lookahead", [1, 3])
def test_freq_cache_on_gpu_equals_hbm_bit_for_bit_with_adagrad_after_every_step(lookahead):
    """Issue 36: plain Adagrad (exact per row: a row's update is its own gradient's) on the GPU,
    the tables compared bit for bit after every step -- evictions, write-backs and rounds of two
    included.  (rowwise Adagrad differs in the last bit on the CPU already: tested apart.)"""
    tables = make_tables()
    optim = SparseOptim("adagrad", lr=0.1)
    state = random_state(tables, optim)
    hbm = HbmBackend(tables, optim, device="cuda")
    cache = FreqCacheBackend(
        tables,
        optim,
        device="cuda",
        cache_ratio=0.1,
        lookahead=lookahead,
        counts=make_counts(tables),
    )
    hbm.import_tables(state)
    cache.import_tables(state)
    rng = np.random.default_rng(4)
    batches = [make_batch(rng, tables, 128).to("cuda") for _ in range(12)]
    g = torch.Generator().manual_seed(0)
    for b in batches[:lookahead]:
        cache.prefetch(b)
    for i, b in enumerate(batches):
        if i + lookahead < len(batches):
            cache.prefetch(batches[i + lookahead])  # the window stays prefetched
        w = torch.randn(b.stride(), len(tables) * DIM, generator=g).cuda()
        for backend in (hbm, cache):
            (backend(b).values() * w).sum().backward()
            backend.step_done()
        assert_tables_equal(cache.export_tables(), hbm.export_tables(), rtol=0, atol=0)
    assert cache.stats()["evictions"] > 0


def test_uvm_cache_matches_hbm_and_reports_hits():
    tables = make_tables()
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    state = random_state(tables, optim)
    hbm = HbmBackend(tables, optim, device="cuda")
    uvm = UvmCacheBackend(tables, optim, device="cuda", cache_ratio=0.05, algorithm="lru")
    hbm.import_tables(state)
    uvm.import_tables(state)
    rng = np.random.default_rng(2)
    batches = [make_batch(rng, tables, 256) for _ in range(20)]
    for a, b in zip(train_steps(hbm, batches, 0), train_steps(uvm, batches, 0)):
        torch.testing.assert_close(b, a, **GPU_TOL)
    s = uvm.stats()
    assert 0 < s["hit_rate_distinct"] < 1 and s["rows_loaded"] > 0
    uvm.flush()
    assert_tables_equal(uvm.export_tables(), hbm.export_tables(), **GPU_TOL)


def test_freq_cache_device_memory_scales_with_the_cache():
    """10M rows in host memory; the GPU holds what scales with the cache: the slots, their map
    (two int64 per slot) and the plan's buffers; nothing per table row."""
    from dlrm_cache.embedding.base import TableSpec

    tables = [TableSpec("C1", 6_000_000, 16), TableSpec("C2", 4_000_000, 16)]
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    cache = FreqCacheBackend(tables, optim, device="cuda", cache_ratio=0.01, policy="lru")
    torch.cuda.synchronize()
    used = torch.cuda.memory_allocated() - before
    assert not cache.store.data.is_cuda and not cache.store.data.is_pinned()
    table_bytes = 10_000_000 * optim.row_bytes(16)
    cache_bytes = cache.layout_stats()["cache_bytes"]
    assert used < cache_bytes + 2**20, (used, cache_bytes)
    assert used < table_bytes / 20, (used, table_bytes)


def test_freq_cache_flush_with_prefetched_batches_on_gpu():
    """A checkpoint (flush) with the window prepared keeps those batches' slots dirty, and its
    write-backs (a gather and a copy out on the copy stream, landed by the write-back thread)
    reach the host store before the export reads it."""
    tables = make_tables()
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    state = random_state(tables, optim)
    hbm = HbmBackend(tables, optim, device="cuda")
    cache = FreqCacheBackend(
        tables, optim, device="cuda", cache_ratio=0.1, policy="lru", lookahead=2
    )
    hbm.import_tables(state)
    cache.import_tables(state)
    rng = np.random.default_rng(3)
    batches = [make_batch(rng, tables, 128) for _ in range(24)]
    for a, b in zip(train_steps(hbm, batches, 0), train_steps(cache, batches, 2, flush_at=(5, 11))):
        torch.testing.assert_close(b, a, **GPU_TOL)
    assert cache.stats()["evictions"] > 100
    assert_tables_equal(cache.export_tables(), hbm.export_tables(), **GPU_TOL)


@pytest.mark.parametrize("name", ["hbm", "uvm_cache", "freq_cache"])
def test_multi_hot_mean_pooling_on_gpu_matches_host(name):
    """Jagged device batches (bags of 0..7 ids), mean pooling taken on the device from the
    lengths: every CUDA placement trains as the host tables do."""
    from test_multi_hot import jagged_batch

    from dlrm_cache.config.choices import Pooling
    from dlrm_cache.embedding.direct import HostBackend

    tables, optim = make_tables(), SparseOptim("rowwise_adagrad", lr=0.1)
    state = random_state(tables, optim)
    host = HostBackend(tables, optim)
    make = {
        "hbm": lambda: HbmBackend(tables, optim),
        "uvm_cache": lambda: UvmCacheBackend(tables, optim, cache_ratio=0.05),
        "freq_cache": lambda: FreqCacheBackend(
            tables, optim, device="cuda", cache_ratio=0.05, lookahead=0, counts=make_counts(tables)
        ),
    }
    dev = make[name]()
    host.import_tables(state)
    dev.import_tables(state)
    rng, g = np.random.default_rng(2), torch.Generator().manual_seed(0)
    for step in range(4):
        b = jagged_batch(rng, tables, 128)
        w = torch.randn(128, len(tables) * DIM, generator=g)
        out_h = host.pool(b, Pooling.mean).values()
        out_d = dev.pool(b.to("cuda"), Pooling.mean).values()
        torch.testing.assert_close(out_d.cpu(), out_h.detach(), msg=f"step {step}", **GPU_TOL)
        (out_h * w).sum().backward()
        (out_d * w.cuda()).sum().backward()
        dev.step_done()
    assert_tables_equal(dev.export_tables(), host.export_tables(), **GPU_TOL)
