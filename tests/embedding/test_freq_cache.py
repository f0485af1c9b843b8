"""FreqCacheBackend against the uncached HostBackend: same numbers, fewer rows on the "device".

Everything runs on the CPU (the cache is an ordinary tensor, the TBE fbgemm's CPU kernel); the cache
logic is the same code as on CUDA.  fbgemm's CPU backward is not bit-identical between a TBE of T
tables and the cache's one pooled table (gradient accumulation order), so comparisons allow a few
float32 ulps.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm_cache.embedding.base import SparseOptim, TableSpec, pop_prefetched
from dlrm_cache.embedding.direct import HostBackend
from dlrm_cache.embedding.freq_cache import FreqCacheBackend, plan_table, predict_hit_rate
from dlrm_cache.embedding.freq_cache.layout import (
    SET_LOAD,
    WINDOW_SIGMAS,
    cache_layout,
    pinned_batches,
)
from dlrm_cache.embedding.freq_cache.sets import PHANTOM, PIN, Geometry
from dlrm_cache.parallel.placement import plan_placement

DIM = 8
SIZES = [2000, 5000, 60, 3000]
MULTI_HOT = {1}  # table index with bags of 0..3 ids
TOL = dict(rtol=1e-5, atol=2e-6)


def make_tables(sizes=SIZES, dim=DIM):
    return [TableSpec(f"C{i + 1}", n, dim) for i, n in enumerate(sizes)]


def zipf_probs(n: int, a: float = 1.1) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1) ** a
    return p / p.sum()


def make_counts(tables, a: float = 1.1, total: float = 1e6) -> dict[str, np.ndarray]:
    return {t.name: np.round(zipf_probs(t.num_rows, a) * total).astype(np.int64) for t in tables}


def make_batch(
    rng, tables, batch_size: int, a: float = 1.1, multi_hot=MULTI_HOT
) -> KeyedJaggedTensor:
    vals, lens = [], []
    for i, t in enumerate(tables):
        n = (
            rng.integers(0, 4, batch_size)
            if i in multi_hot
            else np.ones(batch_size, dtype=np.int64)
        )
        vals.append(rng.choice(t.num_rows, size=int(n.sum()), p=zipf_probs(t.num_rows, a)))
        lens.append(n)
    return KeyedJaggedTensor.from_lengths_sync(
        [t.name for t in tables],
        torch.from_numpy(np.concatenate(vals).astype(np.int64)),
        torch.from_numpy(np.concatenate(lens).astype(np.int64)),
    )


def random_state(tables, optim: SparseOptim, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for t in tables:
        out[f"{t.name}.weight"] = torch.randn(t.num_rows, t.dim, generator=g) * 0.1
        if optim.state_per_row == 1:
            out[f"{t.name}.momentum1"] = torch.rand(t.num_rows, generator=g)
        elif optim.state_per_row == -1:
            out[f"{t.name}.momentum1"] = torch.rand(t.num_rows, t.dim, generator=g)
    return out


def assert_tables_equal(a: dict, b: dict, **tol) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=lambda m: f"{k}: {m}", **(tol or TOL))


def pair(tables, optim, seed=0, **cache_kw):
    host = HostBackend(tables, optim)
    cache = FreqCacheBackend(tables, optim, device="cpu", **cache_kw)
    state = random_state(tables, optim, seed)
    host.import_tables(state)
    cache.import_tables(state)
    return host, cache


def run_training(
    host,
    cache,
    batches,
    lookahead: int,
    seed: int = 0,
    eval_every: int = 0,
    rng=None,
    before_step=None,
):
    """The trainer's loop on both backends: prefetch ``lookahead`` ahead, forward, loss, backward.
    ``before_step(i)`` runs before step ``i``'s forward, with the window prefetched (a checkpoint)."""
    g = torch.Generator().manual_seed(seed)
    T = len(host.tables)
    for i in range(min(lookahead, len(batches))):
        cache.prefetch(batches[i])
    for i, b in enumerate(batches):
        if lookahead and i + lookahead < len(batches):
            cache.prefetch(batches[i + lookahead])
        if before_step is not None:
            before_step(i)
        w = torch.randn(b.stride(), T * DIM, generator=g)
        out_h, out_c = host(b).values(), cache(b).values()
        torch.testing.assert_close(out_c, out_h, msg=lambda m: f"step {i}: {m}", **TOL)
        (out_h * w).sum().backward()
        (out_c * w).sum().backward()
        if eval_every and i % eval_every == eval_every - 1:
            # An evaluation batch between steps (another size, no prefetch, no grad).
            eb = make_batch(rng, host.tables, 96)
            with torch.no_grad():
                torch.testing.assert_close(cache(eb).values(), host(eb).values(), **TOL)


OPTIMS = ["rowwise_adagrad", "adagrad", "sgd"]
POLICIES = ["freq", "lfu", "lru"]


# ------------------------------------------------------------------------------------- 1. equality
@pytest.mark.parametrize("lookahead", [0, 3])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("opt_name", OPTIMS)
def test_training_matches_host(opt_name, policy, lookahead):
    tables = make_tables()
    optim = SparseOptim(opt_name, lr=0.1)
    counts = make_counts(tables) if policy == "freq" else None
    host, cache = pair(
        tables,
        optim,
        cache_ratio=0.05,
        policy=policy,
        lookahead=lookahead,
        counts=counts,
    )
    rng = np.random.default_rng(1)
    batches = [make_batch(rng, tables, 128) for _ in range(32)]
    run_training(host, cache, batches, lookahead, eval_every=10, rng=rng)
    s = cache.stats()
    assert s["evictions"] > 100 and s["rows_written_back"] > 100, s  # the cache really churned
    assert s["overflow_batches"] == 0
    assert 0 < s["hit_rate"] < 1
    assert s["cache_rows"] == sum(max(1, int(np.ceil(0.05 * t.num_rows))) for t in tables)
    assert_tables_equal(cache.export_tables(), host.export_tables())
    assert not cache._window.queue and cache.planner.sets.pinned_ways() == 0  # pins released


def test_cancel_prefetch_releases_the_window():
    tables = make_tables()
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    host, cache = pair(tables, optim, cache_ratio=0.05, policy="lfu", lookahead=2)
    rng = np.random.default_rng(11)
    ahead = [make_batch(rng, tables, 128) for _ in range(3)]
    for b in ahead:
        cache.prefetch(b)
    cache.settle()  # the planner placed what fits; a lone last one waits for its round-mate
    assert cache.planner.sets.pinned_ways() > 0
    cache.cancel_prefetch()
    assert cache.planner.sets.pinned_ways() == 0
    trained = [make_batch(rng, tables, 128) for _ in range(4)]
    run_training(host, cache, trained, lookahead=1)
    cache.step_done()
    cache.settle()
    assert cache.planner.sets.pinned_ways() == 0
    # lookups are counted once forwarded: the cancelled batches' rows were placed, never looked up
    assert cache.stats()["accesses"] == sum(b.values().numel() for b in trained)
    assert_tables_equal(cache.export_tables(), host.export_tables())


def test_refresh_counts_and_learning_rate():
    tables = make_tables()
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    host, cache = pair(
        tables,
        optim,
        cache_ratio=0.05,
        policy="freq",
        refresh_counts=True,
        counts=make_counts(tables),
    )
    rng = np.random.default_rng(2)
    batches = [make_batch(rng, tables, 128) for _ in range(12)]
    for lr, chunk in [(0.02, batches[:6]), (0.2, batches[6:])]:
        host.set_learning_rate(lr)
        cache.set_learning_rate(lr)
        run_training(host, cache, chunk, lookahead=2)
    assert_tables_equal(cache.export_tables(), host.export_tables())


def test_flush_mid_training_then_continue():
    tables = make_tables()
    optim = SparseOptim("adagrad", lr=0.1)
    host, cache = pair(tables, optim, cache_ratio=0.05, policy="lru", lookahead=2)
    rng = np.random.default_rng(3)
    batches = [make_batch(rng, tables, 128) for _ in range(20)]
    run_training(host, cache, batches[:10], lookahead=2)
    assert_tables_equal(cache.export_tables(), host.export_tables())  # flush with rows cached
    run_training(host, cache, batches[10:], lookahead=2, seed=5)
    assert_tables_equal(cache.export_tables(), host.export_tables())


def test_flush_with_prefetched_batches_keeps_their_updates():
    """The trainer checkpoints (flush) with the look-ahead window prepared: those batches' slots
    must stay dirty, or their coming updates are dropped when the slots are evicted."""
    tables = make_tables()
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    host, cache = pair(tables, optim, cache_ratio=0.05, policy="lfu", lookahead=3)
    rng = np.random.default_rng(12)
    batches = [make_batch(rng, tables, 128) for _ in range(24)]
    checkpoints = {5: cache.flush, 6: cache.export_tables, 13: cache.flush}
    run_training(
        host,
        cache,
        batches,
        lookahead=3,
        before_step=lambda i: i in checkpoints and checkpoints[i](),
    )
    assert cache.stats()["evictions"] > 100
    assert_tables_equal(cache.export_tables(), host.export_tables())


def test_forward_takes_prefetched_batches_in_order_and_evaluation_never_takes_a_training_one():
    """FIFO by contract (meta tensors stand in for CUDA: nothing is compared but the shape): a
    training forward takes the oldest batch, an evaluation forward the oldest prefetched under
    no_grad (queued behind the training window), else it is ad hoc."""

    def kjt(stride=3):
        return KeyedJaggedTensor(
            keys=["a", "b"],
            values=torch.empty(2 * stride, dtype=torch.int64, device="meta"),
            lengths=torch.ones(2 * stride, dtype=torch.int64, device="meta"),
            stride=stride,
            length_per_key=[stride, stride],
        )

    from collections import deque

    def pop(queue, batch):
        return pop_prefetched(queue, batch, lambda e: e[0], lambda e: e[1])

    train1, train2, eval1, eval2 = (kjt(), True), (kjt(), True), (kjt(), False), (kjt(), False)
    queue = deque([train1, train2, eval1, eval2])
    with torch.no_grad():
        assert pop(queue, kjt()) is eval1 and pop(queue, kjt()) is eval2  # behind the window
        assert pop(queue, kjt()) is None  # an ad-hoc evaluation batch
    assert list(queue) == [train1, train2]
    assert pop(queue, kjt()) is train1
    with pytest.raises(RuntimeError, match="order they were prefetched"):
        pop(queue, kjt(stride=4))
    queue = deque([eval1])
    assert pop(queue, kjt()) is eval1  # trained on after all: the oldest, whatever its mode


def test_prefetch_host_batch_forward_device_copy_is_matched():
    """The trainer may prefetch a batch and run forward on a copy of it (e.g. moved to the GPU)."""
    tables = make_tables()
    optim = SparseOptim("sgd", lr=0.1)
    host, cache = pair(tables, optim, cache_ratio=0.05, policy="lfu", lookahead=1)
    rng = np.random.default_rng(4)
    b = make_batch(rng, tables, 64)
    copy = KeyedJaggedTensor.from_lengths_sync(b.keys(), b.values().clone(), b.lengths().clone())
    cache.prefetch(b)
    loaded = cache.take_stats()["rows_loaded"]
    torch.testing.assert_close(cache(copy).values(), host(copy).values(), **TOL)
    assert loaded > 0 and cache.stats()["rows_loaded"] == 0  # served from the prefetch
    cache.settle()
    assert not cache._window.queue


# ------------------------------------------------------------------------------------- 2. overflow
@pytest.mark.parametrize("lookahead", [0, 2])
def test_batch_larger_than_cache_is_served_correctly(lookahead):
    tables = make_tables([400, 800, 300])
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    # 2% of 1500 rows = 31 slots, 15 dynamic: a 128-sample batch needs far more distinct rows.
    host, cache = pair(tables, optim, cache_ratio=0.02, policy="lru", lookahead=lookahead)
    rng = np.random.default_rng(5)
    small = [make_batch(rng, tables, 2, multi_hot=set()) for _ in range(4)]
    big = [make_batch(rng, tables, 128, a=0.5) for _ in range(3)]
    batches = small[:2] + big[:2] + small[2:] + big[2:]
    run_training(host, cache, batches, lookahead)
    s = cache.stats()
    assert s["overflow_batches"] == 3, s
    assert_tables_equal(cache.export_tables(), host.export_tables())
    with torch.no_grad():  # an overflowing evaluation batch writes nothing back
        eb = make_batch(rng, tables, 128, a=0.5)
        torch.testing.assert_close(cache(eb).values(), host(eb).values(), **TOL)
    assert_tables_equal(cache.export_tables(), host.export_tables())


def test_window_too_large_is_deferred_not_crashed():
    tables = make_tables([3000, 3000])
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    # 120 slots, 60 dynamic: one batch (~30-40 cold rows) fits, a window of 4 does not.
    host, cache = pair(
        tables,
        optim,
        cache_ratio=0.02,
        policy="freq",
        lookahead=4,
        counts=make_counts(tables),
        static_fraction=0.5,
    )
    rng = np.random.default_rng(6)
    batches = [make_batch(rng, tables, 24, a=0.6, multi_hot=set()) for _ in range(16)]
    run_training(host, cache, batches, lookahead=4)
    s = cache.stats()
    assert s["deferred_batches"] > 0, s
    assert s["overflow_batches"] == 0, s
    assert_tables_equal(cache.export_tables(), host.export_tables())


# ------------------------------------------------------------------------------------- 3. config
@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(cache_ratio=0.0), "embedding.cache_ratio"),
        (dict(cache_ratio=1.5), "embedding.cache_ratio"),
        (dict(cache_ratio=-0.1), "embedding.cache_ratio"),
        (dict(policy="fifo"), "embedding.policy"),
        (dict(policy="freq", counts=None), "embedding.policy"),
        (dict(static_fraction=1.5), "embedding.static_fraction"),
        (dict(lookahead=-1), "embedding.lookahead"),
        (dict(planner_threads=-1), "embedding.planner_threads"),
    ],
)
def test_bad_config_is_a_clear_error(kwargs, key):
    tables = make_tables([100, 200])
    kw = dict(policy="lru") | kwargs
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        FreqCacheBackend(tables, SparseOptim(), device="cpu", **kw)


def test_counts_must_match_tables():
    tables = make_tables([100, 200])
    counts = {"C1": np.ones(100), "C2": np.ones(199)}
    with pytest.raises(ValueError, match="C2.*199.*200"):
        FreqCacheBackend(tables, SparseOptim(), device="cpu", policy="freq", counts=counts)
    with pytest.raises(ValueError, match="C2"):
        FreqCacheBackend(
            tables, SparseOptim(), device="cpu", policy="freq", counts={"C1": np.ones(100)}
        )


@pytest.mark.parametrize("multi_hot", [MULTI_HOT, set()], ids=["multi_hot", "one_id_each"])
def test_out_of_range_id_is_a_clear_error_and_drops_only_its_batch(multi_hot):
    """The range check is part of a round's plan (one division by the table sizes, its minimum
    and maximum read back with the plan); a failing batch is raised by its forward (its placement
    runs on the planner thread), is neither left in the window nor pinning slots, so training
    goes on and still equals host.  Jagged batches and one id per sample and table: both."""
    tables = make_tables()
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    host, cache = pair(tables, optim, cache_ratio=0.05, counts=make_counts(tables), lookahead=2)
    rng = np.random.default_rng(5)
    good = make_batch(rng, tables, 64, multi_hot=multi_hot)
    values = good.values().clone()
    c3 = int(sum(good.length_per_key()[:2]))  # first id of table C3 (60 rows)
    values[c3] = 60
    bad = KeyedJaggedTensor.from_lengths_sync(good.keys(), values, good.lengths())
    cache.prefetch(bad)
    with pytest.raises(IndexError, match=r"id 60 out of range for table C3 \(60 rows\)"):
        cache(bad)
    more = [make_batch(rng, tables, 64, multi_hot=multi_hot) for _ in range(8)]
    run_training(host, cache, more[:4], lookahead=2)
    with pytest.raises(IndexError, match="table C3"), torch.no_grad():
        cache(bad)  # an ad-hoc batch (evaluation)
    run_training(host, cache, more[4:], lookahead=2, seed=1)
    assert cache.stats()["overflow_batches"] == 0
    assert_tables_equal(cache.export_tables(), host.export_tables())
    assert cache.planner.sets.pinned_ways() == 0  # all retired; the failed one pinned nothing


def test_cache_larger_than_free_gpu_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1024, 1 << 30))
    tables = make_tables([100_000, 200_000])
    with pytest.raises(ValueError, match=r"embedding\.cache_ratio.*GPU memory"):
        FreqCacheBackend(tables, SparseOptim(), device="cuda", cache_ratio=0.5, policy="lru")


# ------------------------------------------------------------------------------------- 4. checkpoints
def test_checkpoint_round_trip_with_host_backend():
    tables = make_tables()
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    host, cache = pair(tables, optim, cache_ratio=0.05, counts=make_counts(tables), lookahead=2)
    rng = np.random.default_rng(7)
    run_training(host, cache, [make_batch(rng, tables, 128) for _ in range(8)], lookahead=2)

    # cache -> host: the dirty cached rows are in the checkpoint
    sd = cache.state_dict()
    assert sorted(sd) == sorted(cache.state_keys())
    other = HostBackend(tables, optim)
    other.load_state_dict(sd)
    assert_tables_equal(other.export_tables(), host.export_tables())

    # host -> cache (rows already resident get the checkpoint's values too), then keep training
    sd_host = host.state_dict()
    fresh = FreqCacheBackend(
        tables, optim, device="cpu", cache_ratio=0.05, counts=make_counts(tables)
    )
    fresh.load_state_dict(sd_host)
    assert_tables_equal(fresh.export_tables(), host.export_tables(), rtol=0, atol=0)
    cache.load_state_dict(random_state(tables, optim, seed=9))  # resident rows replaced as well
    cache.load_state_dict(sd_host)
    batches = [make_batch(rng, tables, 128) for _ in range(6)]
    host2 = HostBackend(tables, optim)
    host2.load_state_dict(sd_host)
    run_training(host2, cache, batches, lookahead=0, seed=1)
    assert_tables_equal(cache.export_tables(), host2.export_tables())


# ------------------------------------------------------------------------------------- 5. dirty bits
def test_eval_only_forwards_write_nothing_back():
    tables = make_tables()
    optim = SparseOptim("adagrad", lr=0.1)
    host, cache = pair(tables, optim, cache_ratio=0.05, policy="lru", lookahead=2)
    before = host.export_tables()
    rng = np.random.default_rng(8)
    batches = [make_batch(rng, tables, 128) for _ in range(15)]
    with torch.no_grad():
        for i in range(2):
            cache.prefetch(batches[i])
        for i, b in enumerate(batches):
            if i + 2 < len(batches):
                cache.prefetch(batches[i + 2])
            torch.testing.assert_close(cache(b).values(), host(b).values(), **TOL)
    cache.flush()
    s = cache.stats()
    assert s["evictions"] > 100, s
    assert s["rows_written_back"] == 0 and s["bytes_written_back"] == 0, s
    assert_tables_equal(cache.export_tables(), before, rtol=0, atol=0)


# ------------------------------------------------------------------------------------- 6. hit rates
def measured_hit_rate(policy, ratio, tables, batches, static_fraction=0.5, warmup=20):
    counts = make_counts(tables) if policy == "freq" else None
    cache = FreqCacheBackend(
        tables,
        SparseOptim("sgd"),
        device="cpu",
        cache_ratio=ratio,
        policy=policy,
        counts=counts,
        static_fraction=static_fraction,
        lookahead=1,
    )
    with torch.no_grad():
        for i, b in enumerate(batches):
            cache.prefetch(b)
            cache(b)
            if i + 1 == warmup:
                cache.reset_stats()  # cold start excluded
    return cache.stats()


def test_freq_hit_rate_beats_lru_and_matches_plan():
    tables = make_tables([20000, 10000, 500], dim=4)
    rng = np.random.default_rng(9)
    batches = [make_batch(rng, tables, 256, multi_hot=set()) for _ in range(80)]
    freq = measured_hit_rate("freq", 0.05, tables, batches)
    lru = measured_hit_rate("lru", 0.05, tables, batches, static_fraction=0.0)
    small = measured_hit_rate("freq", 0.01, tables, batches)
    assert freq["hit_rate"] > lru["hit_rate"] + 0.03, (freq["hit_rate"], lru["hit_rate"])
    assert freq["hit_rate"] > small["hit_rate"] + 0.1, (freq["hit_rate"], small["hit_rate"])
    assert freq["hit_rate_distinct"] < freq["hit_rate"]  # cold ids are rarer, and miss more
    # 1% (305 slots) is too small for one batch's rows: served by the overflow path, which still
    # admits the hottest misses, so the cache keeps a useful hit rate.
    assert small["overflow_batches"] > 0 and small["hit_rate"] > 0.5, small

    counts = make_counts(tables)
    measured = [freq, measured_hit_rate("freq", 0.1, tables, batches)]
    for p, m in zip(plan_table(counts, [0.05, 0.1]), measured):
        assert p["cache_rows"] == m["cache_rows"]
        # a static top-k cache is the ceiling; the dynamic part loses a little to the window's cold rows
        assert p["hit_rate"] - 0.02 < m["hit_rate"] < p["hit_rate"] + 0.01, (p, m["hit_rate"])
        # pooling the slots over tables is never worse than fixed per-table caches
        assert p["hit_rate"] >= p["hit_rate_per_table_caches"] - 1e-12


def test_overflow_still_admits_rows():
    tables = make_tables([20000], dim=4)
    rng = np.random.default_rng(10)
    batches = [make_batch(rng, tables, 512, multi_hot=set()) for _ in range(30)]
    s = measured_hit_rate("lru", 0.005, tables, batches, static_fraction=0.0, warmup=10)
    assert s["overflow_batches"] == 20 and s["hit_rate"] > 0.3, s


def test_predict_hit_rate():
    c = np.array([1, 5, 0, 3, 1])
    assert predict_hit_rate(c, 1) == pytest.approx(0.5)
    assert predict_hit_rate(c, 2) == pytest.approx(0.8)
    assert predict_hit_rate(c, 5) == pytest.approx(1.0)
    assert predict_hit_rate(c, 50) == pytest.approx(1.0)
    assert predict_hit_rate(np.zeros(3), 2) == 0.0
    assert predict_hit_rate(torch.tensor([4.0, 1.0]), 1) == pytest.approx(0.8)
    plan = plan_table({"a": [6, 2, 1, 1], "b": [10]}, [0.25, 1.0])
    assert [p["cache_rows"] for p in plan] == [2, 5]
    assert plan[0]["hit_rate"] == pytest.approx(16 / 20)
    assert plan[0]["per_table"] == {"a": pytest.approx(0.6), "b": pytest.approx(1.0)}
    assert plan[1]["hit_rate"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        plan_table({"a": [1]}, [0.0])


def test_deferred_batch_is_not_loaded_while_a_backward_is_pending():
    """The cache holds two of these batches but not three (disjoint rows, no static region; 250
    ways in 4 sets of 64: 50 rows of each batch per set).  Rounds hold two batches: the second
    round does not fit beside the first, whose pins stay until both of its batches retired, nor
    does its first batch alone, so it is deferred; at the window's tail no prefetch comes
    between one batch's backward and the next forward, so it must wait: loading it at the end of
    a forward would overwrite slots (and optimizer state) while that forward's backward is still
    pending."""
    tables = [TableSpec("C1", 1000, DIM)]
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    host, cache = pair(
        tables, optim, cache_ratio=0.25, policy="lru", lookahead=2, static_fraction=0.0
    )

    def batch(lo):
        return KeyedJaggedTensor.from_lengths_sync(
            ["C1"], torch.arange(lo, lo + 100), torch.ones(100, dtype=torch.int64)
        )

    batches = [batch(0), batch(100), batch(200), batch(300)]
    run_training(host, cache, batches, lookahead=2)
    assert cache.stats()["deferred_batches"] > 0
    assert_tables_equal(cache.export_tables(), host.export_tables())


# ------------------------------------------------------------------------------------- 7. layout
@pytest.mark.parametrize("ratio", [0.07, 0.015, 0.5])
def test_backend_plan_and_sharding_planner_agree_on_slots(ratio):
    # 0.07 * 100 is 7.000000000000001 in floating point: a plain ceil gave the sharding planner 8 slots
    sizes = [100, 300, 7, 1000]
    tables = make_tables(sizes)
    counts = make_counts(tables)
    optim = SparseOptim("rowwise_adagrad")
    cache = FreqCacheBackend(tables, optim, device="cpu", cache_ratio=ratio, counts=counts)
    from_backend = cache.stats()["cache_rows"]
    from_plan = plan_table(counts, [ratio], lookahead=0, batch_size=0)[0]["cache_rows"]
    placement = plan_placement(tables, 1, optim, float("inf"), ratio, counts)
    from_sharding = sum(placement.cache_rows.values())
    expected = sum(
        min(n, max(1, math.ceil(Fraction(str(ratio)) * n))) for n in sizes
    )  # exact arithmetic
    assert from_backend == from_plan == from_sharding == expected


def test_window_region_holds_the_lookahead_window(caplog):
    """120 slots at 2% of 6000 rows, 60 of them dynamic: a window of 5 batches of 24 samples does
    not fit (test_window_too_large_is_deferred_not_crashed defers there).  Told the batch size, the
    cache sizes its window region itself: nothing deferred, nothing overflows, same numbers."""
    tables = make_tables([3000, 3000])
    counts = make_counts(tables)
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    with caplog.at_level(logging.INFO, logger="dlrm_cache"):
        host, cache = pair(
            tables,
            optim,
            cache_ratio=0.02,
            policy="freq",
            lookahead=4,
            counts=counts,
            static_fraction=0.5,
            batch_size=24,
        )
    grown = [r for r in caplog.records if "window region sized to" in r.getMessage()]
    assert len(grown) == 1, caplog.records
    layout = cache_layout(
        [3000, 3000], 0.02, 0.5, list(counts.values()), lookahead=4, batch_size=24
    )
    assert layout.window_rows > 60 and layout.added_rows == layout.window_rows - 60
    rng = np.random.default_rng(6)
    batches = [make_batch(rng, tables, 24, a=1.1, multi_hot=set()) for _ in range(16)]
    run_training(host, cache, batches, lookahead=4)
    s = cache.stats()
    assert (s["deferred_batches"], s["overflow_batches"]) == (0, 0), s
    assert s["cache_rows"] == layout.num_slots and s["static_rows"] == layout.num_static == 60
    assert (
        s["window_rows"] == layout.window_rows and s["window_needed_rows"] == layout.window_needed
    )
    slot_bytes = optim.row_bytes(tables[0].dim)
    # the window's device bytes: its ways with their padding (phantom, sentinel and disabled ways,
    # the dummy set), its map (two int64 per slot id) and the freq policy's segments
    geometry = Geometry.for_rows(layout.window_rows)
    window_bytes = geometry.dynamic_slots * (slot_bytes + 16) + cache.planner.scores.segment_bytes()
    assert s["static_bytes"] == 60 * slot_bytes and s["window_bytes"] == window_bytes
    assert geometry.dynamic_slots < 1.2 * layout.window_rows + 2 * geometry.cols
    assert s["cache_bytes"] == s["static_bytes"] + s["window_bytes"]
    assert_tables_equal(cache.export_tables(), host.export_tables())


def test_window_estimate_bounds_the_sampled_distinct_rows():
    """The estimate against an independent count: distinct non-static rows of sampled windows."""
    rows, draws = [5000, 800], pinned_batches(2) * 512
    counts = [np.round(zipf_probs(n, 1.05) * 1e7) for n in rows]
    layout = cache_layout(rows, 0.01, 0.5, counts, lookahead=2, batch_size=512)
    rng = np.random.default_rng(0)
    seen = []
    for _ in range(200):
        n = 0
        for t, c in enumerate(counts):
            ids = rng.choice(rows[t], size=draws, p=c / c.sum())
            n += np.unique(ids[ids >= layout.static_rows[t]]).size
        seen.append(n)
    seen = np.array(seen)
    assert seen.max() <= layout.window_needed
    # the margin is WINDOW_SIGMAS standard deviations over the mean, no more
    margin = layout.window_needed - seen.mean()
    assert WINDOW_SIGMAS * seen.std() * 0.7 < margin < WINDOW_SIGMAS * seen.std() * 1.3 + 1, (
        margin,
        seen.std(),
    )


def test_no_counts_bound_and_no_sizing():
    # without counts the window bound is min(non-static rows, draws) per table
    layout = cache_layout(
        [1000, 10], 0.1, 0.5, None, global_static=False, lookahead=1, batch_size=100
    )
    assert layout.static_rows.tolist() == [50, 0] and layout.window_needed == 200 + 10
    assert layout.num_slots == 50 + round(210 / SET_LOAD)  # room for the sets' imbalance
    # batch_size 0: the window is what the ratio leaves
    layout = cache_layout([1000, 10], 0.1, 0.5, None, global_static=False)
    assert (layout.window_needed, layout.added_rows, layout.num_slots) == (0, 0, 101)


# ------------------------------------------------------------------------------------- 8. host syncs
def test_the_training_thread_reads_nothing_and_the_planner_reads_its_own_results():
    """The trainer's loop (look-ahead 2: rounds of two batches) with a planner thread.  The
    training thread's prefetch and forward make no read that would synchronize with a CUDA device
    (the same as the uncached backend's); the planner reads back exactly one ``unique`` per round
    (the number of distinct keys) besides numpy views of host memory (the readback and staging
    buffers, filled or read only after their copies' events: the stream harness, tests/streams,
    tells host from device memory and checks which stream each read waits for).  Counted on the
    CPU as the aten ops and tensor reads that would synchronize (HostSyncCounter) on each
    thread."""
    from dlrm_cache.bench.syncs import HostSyncCounter
    from dlrm_cache.concurrency.streams import InlineStreams, streams_override

    planner_c = HostSyncCounter()

    class CountingStreams(InlineStreams):
        asynchronous = True  # a device with streams: what is counted is what would synchronize one

        def thread_setup(self):  # the planner thread counts its own ops (modes are per thread)
            return planner_c

    tables = make_tables([20000, 5000, 300, 8000])
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    with streams_override(CountingStreams):
        host, cache = pair(
            tables,
            optim,
            cache_ratio=0.03,
            policy="freq",
            lookahead=2,
            counts=make_counts(tables),
            batch_size=256,
        )
    rng = np.random.default_rng(11)
    batches = [make_batch(rng, tables, 256, multi_hot=set()) for _ in range(12)]
    g = torch.Generator().manual_seed(0)
    cache_c, host_c = HostSyncCounter(), HostSyncCounter()
    for b in batches[:2]:
        cache.prefetch(b)
    cache.settle()
    before = Counter(planner_c.syncs)
    for i, b in enumerate(batches):
        with cache_c:
            if i + 2 < len(batches):
                cache.prefetch(batches[i + 2])
            out_c = cache(b).values()
        with host_c:
            out_h = host(b).values()
        torch.testing.assert_close(out_c, out_h, **TOL)
        w = torch.randn(b.stride(), len(tables) * DIM, generator=g)
        (out_c * w).sum().backward()
        (out_h * w).sum().backward()
    cache.settle()
    s = cache.stats()
    assert s["rows_loaded"] > 0 and (s["deferred_batches"], s["overflow_batches"]) == (0, 0)
    assert cache_c.syncs - host_c.syncs == Counter()  # the training thread: as uncached
    planner = planner_c.syncs - before
    assert set(planner) <= {"unique", "numpy"}, planner
    assert planner["unique"] == (len(batches) - 2) // 2  # one per round of two batches
    assert_tables_equal(cache.export_tables(), host.export_tables())


def _model_round(keys, evict, geometry, rows, seq_score):
    """An independent model of one round's placement over numpy copies of a set map: each
    distinct row resident in its set is a hit (and gets a pin); the misses of a set, by row,
    take its unpinned ways by eviction key (ties: by column); a miss beyond them fails.
    Returns (hits, {row: slot of a miss}, failed)."""
    g = geometry
    distinct = sorted(set(rows))
    hit = {}
    for r in distinct:
        s = r % g.sets
        cols = np.flatnonzero(keys[s] == r)
        if len(cols):
            hit[r] = s * g.cols + int(cols[0])
            evict[s, cols[0]] += PIN
    chosen, failed = {}, False
    for s in sorted({r % g.sets for r in distinct if r not in hit}):
        misses = [r for r in distinct if r % g.sets == s and r not in hit]
        order = sorted(range(g.cols), key=lambda c: (evict[s, c], c))
        for rank, r in enumerate(misses):
            c = order[min(rank, g.cols - 1)]
            if rank >= g.cols or evict[s, c] >= PIN:
                failed = True
            chosen[r] = s * g.cols + c
    return hit, chosen, failed


@pytest.mark.parametrize("policy", POLICIES)
def test_round_plans_equal_an_independent_model_of_the_set_map(policy):
    """The plan's torch ops (plan.py) against a plain-Python model of the same decisions, round by
    round over random batches of one table with zipf ids: hits, the victim of every miss, the
    keys held afterwards, every id's slot, and refusals when a set runs out of unpinned ways
    (a small region and no releases between some rounds force those)."""
    from dlrm_cache.concurrency.streams import InlineStreams
    from dlrm_cache.embedding.freq_cache.plan import RoundPlanner, TableParams
    from dlrm_cache.embedding.freq_cache.scores import EvictionScores
    from dlrm_cache.embedding.freq_cache.sets import SetMap

    rows, static = 600, 40
    counts = np.round(zipf_probs(rows, 1.2) * 1e5)
    geometry = Geometry.for_rows(90, ways=8)
    sets = SetMap(geometry, rows, torch.device("cpu"))
    scores = EvictionScores(policy, False, counts if policy == "freq" else None, sets.keys.device)
    params = TableParams(
        ["C1"],
        np.array([0, rows]),
        np.array([static]),
        np.array([geometry.dynamic_slots]),
        sets.keys.device,
    )
    planner = RoundPlanner(sets, scores, params, InlineStreams(torch.device("cpu")))
    rng = np.random.default_rng(3)
    live, refused = [], 0
    for seq in range(1, 40):
        ids = rng.choice(rows, size=int(rng.integers(5, 60)), p=zipf_probs(rows, 0.9))
        kjt = KeyedJaggedTensor.from_lengths_sync(
            ["C1"], torch.from_numpy(ids), torch.ones(len(ids), dtype=torch.int64)
        )
        keys = sets.keys2d.numpy().copy()
        evict = sets.evict2d.numpy().copy()
        dyn = [int(r) for r in ids if r >= static]
        hit, chosen, failed = _model_round(keys, evict, geometry, dyn, seq)
        p = planner.propose([kjt], seq)
        assert p.fits == (not failed), seq
        assert p.misses == len(chosen) and sorted(p.rows.tolist()) == sorted(chosen)
        if not p.fits:
            planner.refuse(p)
            refused += 1
        else:
            evicted = dict(zip(p.rows.tolist(), p.evicted.tolist()))
            for r, slot in chosen.items():
                assert evicted[r] == keys.reshape(-1)[slot]  # the row that way held
            lookup_t, hits = planner.commit(p, seq)
            lookup = lookup_t.reshape(-1).numpy()
            served = sum(1 for r in ids.tolist() if r < static or r in hit)  # before the round
            assert hits.tolist() == [[served]]
            want = [
                geometry.dynamic_slots + r if r < static else hit.get(r, chosen.get(r))
                for r in ids.tolist()
            ]
            assert lookup.tolist() == want, seq
            assert (sets.keys.numpy()[lookup[ids >= static]] == ids[ids >= static]).all()
            live.append(p.slot)
        if len(live) > 2 or (seq % 7 == 0 and live):  # releases, but not always in time
            planner.release(live.pop(0))
    assert refused > 0 and sets.pinned_ways() > 0
    for slots in live:
        planner.release(slots)
    assert sets.pinned_ways() == 0


@pytest.mark.parametrize("multi_hot", [MULTI_HOT, set()], ids=["multi_hot", "one_id_each"])
def test_hit_counts_equal_an_independent_count_of_what_was_resident(multi_hot):
    """``stats()``'s accesses, distinct rows and hits (of accesses, of distinct rows, per table)
    equal a numpy count of each round's ids against the rows resident just before the round was
    placed (static rows and the device map's keys, read back; look-ahead 2: rounds of two,
    inline planner), every batch forwarded.  Distinct rows are a round's rows outside the static
    region."""
    from dlrm_cache.embedding.freq_cache.window import Window

    tables = make_tables()
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    host, cache = pair(
        tables,
        optim,
        cache_ratio=0.1,  # room for the window: no round is deferred
        lookahead=2,
        counts=make_counts(tables),
        batch_size=128,
    )
    offsets = np.concatenate([[0], np.cumsum([t.num_rows for t in tables])])
    static = cache.layout.static_rows
    n = len(tables)
    want = dict(accesses=0, hits=0, distinct=0, distinct_hits=0)
    table_ids, table_hits = np.zeros(n), np.zeros(n)
    place = Window._place

    def counted_place(self, group):
        resident = set(cache.planner.sets.resident()[1].tolist())
        rows, stat = [], []
        for b in group:
            table = np.repeat(np.arange(n), b.kjt.length_per_key())
            ranks = b.kjt.values().numpy()
            rows.append(ranks + offsets[table])
            stat.append(ranks < static[table])
            hit = stat[-1] | np.isin(rows[-1], list(resident))
            want["accesses"] += ranks.size
            want["hits"] += int(hit.sum())
            table_ids[:] += np.bincount(table, minlength=n)
            table_hits[:] += np.bincount(table, weights=hit, minlength=n)
        dynamic = np.unique(np.concatenate(rows)[~np.concatenate(stat)])
        want["distinct"] += dynamic.size
        want["distinct_hits"] += int(np.isin(dynamic, list(resident)).sum())
        return place(self, group)

    rng = np.random.default_rng(21)
    batches = [make_batch(rng, tables, 128, multi_hot=multi_hot) for _ in range(16)]
    Window._place = counted_place  # type: ignore[method-assign]
    try:
        run_training(host, cache, batches, lookahead=2)
    finally:
        Window._place = place  # type: ignore[method-assign]
    cache.step_done()  # the last round retires: every batch was forwarded, all are counted
    s = cache.stats()
    assert s["deferred_batches"] == 0 and 0 < want["hits"] < want["accesses"], (s, want)
    assert (s["accesses"], s["distinct_ids"]) == (want["accesses"], want["distinct"])
    assert s["hit_rate"] == pytest.approx(want["hits"] / want["accesses"], abs=1e-12)
    assert s["hit_rate_distinct"] == pytest.approx(
        want["distinct_hits"] / want["distinct"], abs=1e-12
    )
    for t, ids, hits in zip(tables, table_ids, table_hits):
        assert s[f"hit_rate/{t.name}"] == pytest.approx(hits / ids, abs=1e-12), t.name


def test_cpu_cache_plans_inline():
    """A CPU cache (no streams) places rounds on the calling thread, with no planner thread."""
    import threading

    tables = make_tables([20000, 5000, 300, 8000])
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    host, cache = pair(tables, optim, cache_ratio=0.03, lookahead=2, counts=make_counts(tables))
    assert cache._planner._thread is None
    threads_before = threading.active_count()
    rng = np.random.default_rng(12)
    batches = [make_batch(rng, tables, 256, multi_hot=set()) for _ in range(8)]
    run_training(host, cache, batches, lookahead=2)
    assert threading.active_count() == threads_before
    assert cache.stats()["rows_loaded"] > 0
    assert_tables_equal(cache.export_tables(), host.export_tables())


@pytest.mark.parametrize("multi_hot", [MULTI_HOT, set()], ids=["multi_hot", "one_id_each"])
def test_cache_ops_per_batch_do_not_grow_with_the_batch(multi_hot):
    """The cache's aten ops per batch of the trainer's loop (prefetch + forward + backward beyond
    the uncached backend's: its rounds' plan, commit and copies, the lookup) are the same for
    batches of 64 and of 1024 samples: the device works per round in a fixed number of ops (the
    stream harness bounds them per stream over the real loop).  CPU cache, look-ahead 2."""
    from dlrm_cache.bench.syncs import HostSyncCounter

    tables = make_tables([20000, 5000, 300, 8000])
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    extra = {}
    for size in (64, 1024):
        host, cache = pair(
            tables, optim, cache_ratio=0.2, lookahead=2, counts=make_counts(tables), batch_size=size
        )
        rng = np.random.default_rng(12)
        batches = [make_batch(rng, tables, size, multi_hot=multi_hot) for _ in range(12)]
        cache_c, host_c = HostSyncCounter(), HostSyncCounter()
        for b in batches[:2]:
            cache.prefetch(b)
        for i, b in enumerate(batches):
            on = i >= 4
            with cache_c if on else contextlib.nullcontext():
                if i + 2 < len(batches):
                    cache.prefetch(batches[i + 2])
                cache(b).values().sum().backward()
            with host_c if on else contextlib.nullcontext():
                host(b).values().sum().backward()
        s = cache.stats()
        assert s["rows_loaded"] > 0 and s["deferred_batches"] == s["overflow_batches"] == 0, s
        extra[size] = (cache_c.total_ops - host_c.total_ops) / (len(batches) - 4)
    assert extra[64] == extra[1024], extra


def test_planner_failure_surfaces_at_the_next_call_inline_and_threaded():
    """A posted task's failure is raised by the next post or call on the posting thread, whether
    the planner runs tasks inline (no streams) or on its thread (streams)."""
    import threading

    from dlrm_cache.concurrency.streams import InlineStreams
    from dlrm_cache.embedding.freq_cache.planner import Planner

    class WithStreams(InlineStreams):
        asynchronous = True

    for streams, threaded in ((InlineStreams, False), (WithStreams, True)):
        planner = Planner(streams(torch.device("cpu")), torch.device("cpu"))
        assert planner.threaded == threaded
        ran_on: list = []
        planner.post(lambda: ran_on.append(threading.current_thread()))
        assert planner.call(lambda: torch.is_grad_enabled()) is False  # tasks run under no_grad
        assert (ran_on[0] is threading.current_thread()) == (not threaded)

        def fail():
            raise RuntimeError("planner task failed")

        planner.post(fail)
        with pytest.raises(RuntimeError, match="planner task failed"):
            planner.call(lambda: None)
        assert planner.call(lambda: 7) == 7  # raised once
        planner.close()


def test_a_planner_thread_that_fails_to_start_raises_instead_of_hanging():
    """A planner whose thread cannot set itself up (a CUDA device it cannot select, say) fails
    every task, and a wait for a batch it should have placed raises: the training thread never
    waits forever on a dead thread."""
    import threading

    from dlrm_cache.concurrency.streams import InlineStreams
    from dlrm_cache.embedding.freq_cache.planner import Planner

    class BrokenThread(InlineStreams):
        asynchronous = True

        def thread_setup(self):
            raise RuntimeError("no device for this thread")

    planner = Planner(BrokenThread(torch.device("cpu")), torch.device("cpu"))
    placed = threading.Event()
    planner.post(placed.set)
    with pytest.raises(RuntimeError, match="failed to start") as e:
        planner.wait(placed)
    assert "no device for this thread" in str(e.value.__cause__)
    with pytest.raises(RuntimeError, match="failed to start"):
        planner.call(lambda: 1)
    planner.close()


def _within(seconds: float, fn):
    """``fn()``'s result or exception, or a failure if it neither returns nor raises in time."""
    import threading

    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"no return and no error within {seconds} s: a hang"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def test_a_placement_failing_part_way_stops_the_cache_instead_of_training_on():
    """A placement that fails after its commit changed the device map (a CUDA out-of-memory while
    its copies are issued, say) leaves the map out of step with the slots' contents: that round's
    forward raises the error, and every later batch, flush and import raises instead of training
    on rows the cache no longer tracks."""
    from dlrm_cache.embedding.freq_cache import transfer

    tables = make_tables([3000, 4000])
    optim = SparseOptim("sgd", lr=0.1)
    host, cache = pair(tables, optim, cache_ratio=0.1, policy="lru", lookahead=1, batch_size=32)
    rng = np.random.default_rng(0)
    batches = [make_batch(rng, tables, 32, multi_hot=set()) for _ in range(6)]
    place, calls = transfer.Transfers.copy_round, [0]

    def flaky(self, *args):
        calls[0] += 1
        if calls[0] == 4:
            raise RuntimeError("out of memory (planted)")
        return place(self, *args)

    transfer.Transfers.copy_round = flaky  # type: ignore[method-assign]
    try:
        cache.prefetch(batches[0])
        raised = []
        for i, b in enumerate(batches):
            if i + 1 < len(batches):
                cache.prefetch(batches[i + 1])
            try:
                _within(20, lambda: cache(b).values().sum().backward())
            except RuntimeError as e:
                raised.append(str(e))
        # the failed batch raises its error, a batch already placed behind it and every later one
        # the cache's: no step after the failure trains
        assert raised.count("out of memory (planted)") == 1 and len(raised) >= 3, raised
        assert all(r == "out of memory (planted)" or "failed part-way" in r for r in raised)
        with pytest.raises(RuntimeError, match="failed part-way"):
            _within(20, cache.flush)
        assert cache.stats()["overflow_batches"] == 0  # the normal path failed
    finally:
        transfer.Transfers.copy_round = place  # type: ignore[method-assign]


@pytest.mark.parametrize("threaded", [False, True], ids=["inline", "threaded"])
def test_a_write_back_that_does_not_land_is_raised_never_waited_for(threaded):
    """A write-back whose scatter into the host store fails (or whose copy's event reports a
    device error) is raised by a later call of the training thread, not waited for forever;
    the rows it held are lost, so every later flush raises too."""
    from dlrm_cache.concurrency.streams import InlineStreams, streams_override

    class WithStreams(InlineStreams):
        asynchronous = True

    tables = make_tables()
    optim = SparseOptim("sgd", lr=0.1)
    with streams_override(WithStreams) if threaded else contextlib.nullcontext():
        host, cache = pair(tables, optim, cache_ratio=0.05, policy="lru", lookahead=1)

    def boom(rows, records):
        raise RuntimeError("scatter failed (planted)")

    cache.store.scatter = boom  # type: ignore[method-assign]
    rng = np.random.default_rng(0)

    def train():
        for _ in range(12):
            cache(make_batch(rng, tables, 128)).values().sum().backward()
        cache.flush()

    with pytest.raises(RuntimeError, match="did not reach the host store"):
        _within(30, train)
    with pytest.raises(RuntimeError, match="did not reach the host store"):
        _within(30, cache.flush)


def test_stall_counts_the_placement_of_batches_not_prefetched():
    """``stall_s``: the training thread's time on batches that were not placed ahead, which on a
    CPU (inline planner) is the placement itself; prefetched batches add (next to) none."""
    tables = make_tables([20000, 5000, 300, 8000])
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    rng = np.random.default_rng(13)
    batches = [make_batch(rng, tables, 256, multi_hot=set()) for _ in range(6)]
    stalls = {}
    for lookahead in (0, 2):
        host, cache = pair(
            tables,
            optim,
            cache_ratio=0.03,
            lookahead=lookahead,
            counts=make_counts(tables),
            batch_size=256,  # a window region that holds the rounds: nothing is deferred
        )
        run_training(host, cache, batches, lookahead=lookahead)
        stalls[lookahead] = cache.stats()["stall_s"]
        assert cache.stats()["deferred_batches"] == 0
    assert stalls[0] > 0
    assert stalls[2] < stalls[0] / 5, stalls


@pytest.mark.parametrize("policy", POLICIES)
def test_the_cache_keeps_nothing_per_table_row_but_the_store(policy):
    """After construction the host holds one record per table row (and one scratch row) and
    nothing else per row; the device holds what scales with the cache: the slots, their map, and
    (freq) a handful of count segments per table -- not per row.  ``host_bytes_per_row`` declares
    what construction holds per row on top while it builds the segments: the counts flattened
    and bucketed (freq), nothing otherwise."""
    import gc

    tables = make_tables([20000, 5000, 300, 8000])
    counts = make_counts(tables) if policy == "freq" else None
    cache = FreqCacheBackend(
        tables,
        SparseOptim("rowwise_adagrad"),
        device="cpu",
        cache_ratio=0.03,
        counts=counts,
        policy=policy,
    )
    rows = sum(t.num_rows for t in tables)
    # every array reachable from the cache (through its own objects, containers and modules)
    seen, todo, arrays = set(), [cache], []
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, (np.ndarray, torch.Tensor)):
            arrays.append(o)
        elif isinstance(o, (dict, list, tuple, set, torch.nn.Module)) or type(
            o
        ).__module__.startswith(("dlrm_cache", "fbgemm_gpu")):
            todo.extend(gc.get_referents(o))
    assert any(a is cache.store.data for a in arrays)
    store = cache.store.data.data_ptr()

    def address(a):
        return a.data_ptr() if isinstance(a, torch.Tensor) else a.__array_interface__["data"][0]

    per_row = [
        tuple(a.shape) for a in arrays if a.ndim and a.shape[0] >= rows and address(a) != store
    ]
    assert per_row == []
    assert tuple(cache.store.data.shape) == (rows + 1, cache.store.record_cols)
    segments = cache.planner.scores.segment_bytes()
    assert (segments > 0) == (policy == "freq") and segments < 16 * 300 * len(tables)
    declared = FreqCacheBackend.host_bytes_per_row(torch.device("cpu"), {"policy": policy})
    assert declared == (16 if policy == "freq" else 0)


def test_host_memory_check_counts_the_cache_bookkeeping():
    """A budget that holds two copies of the tables but not the cache's counts and row map: the
    freq_cache is refused before allocating, the host placement is not."""
    from omegaconf import OmegaConf

    from dlrm_cache.train.embeddings import check_host_memory

    tables = make_tables([20000, 5000, 300, 8000])
    optim = SparseOptim("rowwise_adagrad")
    rows = sum(t.num_rows for t in tables)
    budget = (2 * rows * optim.row_bytes(DIM) + rows * 8) / 2**30  # half the cache's 16 B a row

    def cfg(target, **emb):
        return OmegaConf.create(
            {"host_memory_gb": budget, "embedding": {"_target_": target, **emb}}
        )

    check_host_memory(
        cfg("dlrm_cache.embedding.direct.HostBackend"), tables, optim, torch.device("cpu")
    )
    fc = cfg("dlrm_cache.embedding.freq_cache.FreqCacheBackend", policy="freq")
    with pytest.raises(ValueError, match=r"host_memory_gb: .* and the placement's bookkeeping"):
        check_host_memory(fc, tables, optim, torch.device("cpu"))


def test_batches_without_ids_pass_through_and_are_counted():
    """A multi-hot batch whose bags are all empty has no id to place: its round plans nothing,
    its forward pools zeros, training around it still equals host, and its (no) accesses count."""
    tables = make_tables([100, 200])
    optim = SparseOptim("sgd", lr=0.1)
    host, cache = pair(tables, optim, cache_ratio=0.2, policy="lru", lookahead=2)
    empty = KeyedJaggedTensor.from_lengths_sync(
        ["C1", "C2"], torch.zeros(0, dtype=torch.int64), torch.zeros(8, dtype=torch.int64)
    )
    rng = np.random.default_rng(0)
    batches = [make_batch(rng, tables, 4, multi_hot={0, 1}) for _ in range(3)]
    batches += [empty, empty] + [make_batch(rng, tables, 4, multi_hot={0, 1}) for _ in range(3)]
    run_training(host, cache, batches, lookahead=2)
    cache.step_done()
    assert cache.stats()["accesses"] == sum(b.values().numel() for b in batches) > 0
    assert_tables_equal(cache.export_tables(), host.export_tables())


@pytest.mark.parametrize("policy", ["lru", "lfu", "freq"])
def test_misses_and_refused_plans_leave_the_phantom_ways_as_they_were(policy):
    """Every miss looks its row up in its set's phantom way (column 0): its eviction key must stay
    PHANTOM, which keeps it from ever being chosen, however many misses, deferrals and refused
    plans there are (a phantom chosen as a victim writes row -1 back).  A cache too small for its
    window defers and overflows every batch: many refusals."""
    tables = make_tables()
    counts = make_counts(tables) if policy == "freq" else None
    host, cache = pair(
        tables,
        SparseOptim("sgd", lr=0.1),
        cache_ratio=0.05,
        policy=policy,
        lookahead=2,
        batch_size=0,
        counts=counts,
    )
    rng = np.random.default_rng(1)
    run_training(host, cache, [make_batch(rng, tables, 512) for _ in range(12)], 2)
    s = cache.stats()
    assert s["deferred_batches"] > 0 and s["overflow_batches"] > 0  # refusals happened
    cache.settle()
    phantoms = cache.planner.sets.evict2d[:-1, 0]
    assert bool((phantoms == PHANTOM).all()), sorted(set(((phantoms - PHANTOM) // PIN).tolist()))
