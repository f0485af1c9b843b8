"""Multi-hot features: any number of ids per sample and feature (0 included), pooled by sum or mean.

Every placement sums (fbgemm's SUM kernels) and :meth:`EmbeddingBackend.pool` divides by the bag
sizes for mean; these tests check mean against an independent numpy recomputation, the read-only
tables of predict/export against training's, and the freq_cache (window and overflow paths) and
row-wise sharding against one process's ``host`` tables on jagged batches with Zipf ids.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from launching import launch_ranks
from test_freq_cache import make_counts, make_tables, random_state, zipf_probs
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm_cache.after.trained import FrozenTables
from dlrm_cache.config.choices import Pooling, Precision
from dlrm_cache.embedding.base import SparseOptim, TableSpec
from dlrm_cache.embedding.direct import HostBackend
from dlrm_cache.embedding.freq_cache import FreqCacheBackend, plan_table
from dlrm_cache.embedding.freq_cache.layout import cache_layout
from dlrm_cache.model.dlrm import DLRM
from dlrm_cache.parallel.placement import Shard, plan_placement
from dlrm_cache.parallel.sharded import ShardedEmbeddings

TOL = dict(rtol=1e-5, atol=2e-6)
MAX_LEN = [4, 1, 7, 3]  # per table: bags of 0..MAX_LEN ids (table 1: 0 or 1)


def jagged_batch(rng, tables: list[TableSpec], batch_size: int) -> KeyedJaggedTensor:
    """Every table multi-hot: random bag sizes 0..MAX_LEN[t] (empty bags included), Zipf ids."""
    vals, lens = [], []
    for t, top in zip(tables, MAX_LEN):
        n = rng.integers(0, top + 1, batch_size)
        vals.append(rng.choice(t.num_rows, size=int(n.sum()), p=zipf_probs(t.num_rows)))
        lens.append(n)
    return KeyedJaggedTensor.from_lengths_sync(
        [t.name for t in tables],
        torch.from_numpy(np.concatenate(vals).astype(np.int64)),
        torch.from_numpy(np.concatenate(lens).astype(np.int64)),
    )


def numpy_pool(weights: list[np.ndarray], kjt: KeyedJaggedTensor, mean: bool) -> np.ndarray:
    """The pooled rows, bag by bag in plain numpy (float64): sum, or sum / size (empty: 0)."""
    b, off = kjt.stride(), kjt.offsets().numpy()
    values = kjt.values().numpy()
    out = np.zeros((b, len(weights) * weights[0].shape[1]))
    d = weights[0].shape[1]
    for j, w in enumerate(weights):
        for i in range(b):
            ids = values[off[j * b + i] : off[j * b + i + 1]]
            if len(ids):
                rows = w[ids].astype(np.float64)
                out[i, j * d : (j + 1) * d] = rows.mean(0) if mean else rows.sum(0)
    return out


def test_mean_pooling_is_the_sum_over_the_bag_size_in_training_and_predict():
    """Mean = the bag's sum over its number of ids (0 ids: 0), forward and backward (sgd: each of
    a bag's rows moves by lr * grad / size), and predict's read-only tables pool the same."""
    tables, optim = make_tables(), SparseOptim("sgd", lr=0.5)
    state = random_state(tables, optim)
    rng = np.random.default_rng(3)
    kjt = jagged_batch(rng, tables, 64)
    assert (kjt.lengths() == 0).any() and (kjt.lengths() > 2).any()
    weights = [state[f"{t.name}.weight"].numpy() for t in tables]
    frozen = FrozenTables(tables, state)
    for pooling in Pooling:
        want = numpy_pool(weights, kjt, pooling is Pooling.mean)
        got = frozen.pool(kjt, pooling).values().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    host = HostBackend(tables, optim)
    host.import_tables(state)
    out = host.pool(kjt, Pooling.mean).values()
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-5, atol=1e-6)
    g = torch.from_numpy(rng.standard_normal(out.shape).astype(np.float32))
    (out * g).sum().backward()
    # independently: row r of table j moves by -lr * sum over bags holding it of g / size
    expect = [w.astype(np.float64).copy() for w in weights]
    b, off, values, d = kjt.stride(), kjt.offsets().numpy(), kjt.values().numpy(), tables[0].dim
    for j in range(len(tables)):
        for i in range(b):
            ids = values[off[j * b + i] : off[j * b + i + 1]]
            for r in ids:
                expect[j][r] -= optim.lr * g[i, j * d : (j + 1) * d].numpy() / len(ids)
    after = host.export_tables()
    for j, t in enumerate(tables):
        np.testing.assert_allclose(after[f"{t.name}.weight"].numpy(), expect[j], atol=1e-5)


def train_pair(host, cache, batches, pooling: Pooling, lookahead: int) -> None:
    """The trainer's loop on both backends (prefetch ahead, pooled forward, backward), outputs
    compared at every step."""
    g = torch.Generator().manual_seed(0)
    for b in batches[:lookahead]:
        cache.prefetch(b)
    for i, b in enumerate(batches):
        if i + lookahead < len(batches):
            cache.prefetch(batches[i + lookahead])
        out_h, out_c = host.pool(b, pooling).values(), cache.pool(b, pooling).values()
        torch.testing.assert_close(out_c, out_h, msg=lambda m: f"step {i}: {m}", **TOL)
        w = torch.randn(out_h.shape, generator=g)
        (out_h * w).sum().backward()
        (out_c * w).sum().backward()
        cache.step_done()


@pytest.mark.parametrize("pooling", list(Pooling))
@pytest.mark.parametrize("ratio", [0.05, 0.003], ids=["window", "overflow"])
def test_freq_cache_trains_as_host_on_multi_hot_batches(pooling: Pooling, ratio: float):
    """freq_cache == host, step by step and table by table, on jagged batches; at ratio 0.003
    (tens of slots) every batch's ~400 distinct rows take the overflow path."""
    tables, optim = make_tables(), SparseOptim("rowwise_adagrad", lr=0.1)
    state = random_state(tables, optim)
    host = HostBackend(tables, optim)
    cache = FreqCacheBackend(
        tables, optim, device="cpu", cache_ratio=ratio, lookahead=2, counts=make_counts(tables)
    )
    host.import_tables(state)
    cache.import_tables(state)
    rng = np.random.default_rng(1)
    batches = [jagged_batch(rng, tables, 128) for _ in range(8)]
    train_pair(host, cache, batches, pooling, lookahead=2)
    stats = cache.stats()
    ids = sum(int(b.values().numel()) for b in batches)
    per_table = [sum(int(b.length_per_key()[j]) for b in batches) for j in range(len(tables))]
    assert stats["accesses"] == ids  # every id of every bag counted
    assert [stats[f"accesses/{t.name}"] for t in tables] == per_table
    assert (stats.get("overflow_batches", 0) == len(batches)) == (ratio < 0.01)
    after = cache.export_tables()
    for k, v in host.export_tables().items():
        torch.testing.assert_close(after[k], v, msg=lambda m: f"{k}: {m}", **TOL)


def shard_kjt(kjt: KeyedJaggedTensor, tables: list[TableSpec], mine: list[Shard]):
    """A rank's shards' KJT over the whole batch: a row range keeps each bag's ids inside it,
    relative to its first row (what the sharded loader hands the rank)."""
    b, off, values = kjt.stride(), kjt.offsets().numpy(), kjt.values().numpy()
    index = {t.name: j for j, t in enumerate(tables)}
    vals, lens = [], []
    for s in mine:
        j = index[s.table]
        for i in range(b):
            ids = values[off[j * b + i] : off[j * b + i + 1]]
            ids = ids[(ids >= s.lo) & (ids < s.hi)] - s.lo
            vals.append(ids)
            lens.append(len(ids))
    return KeyedJaggedTensor.from_lengths_sync(
        [s.name for s in mine],
        torch.from_numpy(np.concatenate(vals).astype(np.int64)),
        torch.tensor(lens, dtype=torch.int64),
    )


SHARDS = [  # C1 and C3 split by rows over both ranks, C2 and C4 whole
    Shard("C1", 0, 300, 2000, rank=0),
    Shard("C1", 300, 2000, 2000, rank=1),
    Shard("C2", 0, 5000, 5000, rank=1),
    Shard("C3", 0, 20, 60, rank=1),
    Shard("C3", 20, 60, 60, rank=0),
    Shard("C4", 0, 3000, 3000, rank=0),
]


def _sharded_rank() -> dict:
    """One rank, once per pooling: a freq_cache per rank over its shards, trained on jagged
    global batches; the rank's pooled rows and its shards' tables after training."""
    dist.init_process_group("gloo")
    try:
        return {p.value: _sharded_training(p) for p in Pooling}
    finally:
        dist.destroy_process_group()


def _sharded_training(pooling: Pooling) -> dict:
    rank, tables = dist.get_rank(), make_tables()
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    mine = [s for s in SHARDS if s.rank == rank]
    full = random_state(tables, optim)

    def cache(local: list[TableSpec], shards: list[Shard]) -> FreqCacheBackend:
        return FreqCacheBackend(local, optim, device="cpu", cache_ratio=0.01, policy="lru")

    emb = ShardedEmbeddings(tables, optim, SHARDS, cache, torch.device("cpu"))
    emb.import_tables(
        {
            f"{s.name}.{f}": full[f"{s.table}.{f}"][s.lo : s.hi]
            for s in mine
            for f in ("weight", "momentum1")
        }
    )
    rng, g = np.random.default_rng(5), torch.Generator().manual_seed(0)
    outs = []
    for _ in range(4):
        kjt = jagged_batch(rng, tables, 64)
        w = torch.randn(64, len(tables) * tables[0].dim, generator=g)
        out = emb.pool(shard_kjt(kjt, tables, mine), pooling).values()
        (out * w[rank * 32 : (rank + 1) * 32]).sum().backward()
        emb.step_done()
        outs.append(out.detach())
    return {"outs": outs, "tables": emb.export_tables()}


def test_row_sharded_multi_hot_equals_one_process():
    """2 gloo ranks, tables split by rows: a bag's ids spread over both ranks' shards, and the
    mean is taken of the shards' summed total (the bag sizes ride in the exchange); sum and
    mean each train as one process's host tables."""
    ranks = launch_ranks(2, _sharded_rank)
    for pooling in Pooling:
        got = {r: ranks[r][pooling.value] for r in (0, 1)}
        tables, optim = make_tables(), SparseOptim("rowwise_adagrad", lr=0.1)
        host = HostBackend(tables, optim)
        host.import_tables(random_state(tables, optim))
        rng, g = np.random.default_rng(5), torch.Generator().manual_seed(0)
        for step in range(4):
            kjt = jagged_batch(rng, tables, 64)
            w = torch.randn(64, len(tables) * tables[0].dim, generator=g)
            out = host.pool(kjt, pooling).values()
            (out * w).sum().div(2).backward()  # each rank's gradient is scaled by 1/world
            for rank in (0, 1):
                mine = out[rank * 32 : (rank + 1) * 32].detach()
                torch.testing.assert_close(got[rank]["outs"][step], mine, **TOL)
        want = host.export_tables()
        for s in SHARDS:
            for f in ("weight", "momentum1"):
                torch.testing.assert_close(
                    got[s.rank]["tables"][f"{s.name}.{f}"],
                    want[f"{s.table}.{f}"][s.lo : s.hi],
                    msg=lambda m: f"{pooling.value} {s.name}.{f}: {m}",
                    **TOL,
                )


def test_plan_sizes_the_window_and_predicts_hit_rates_for_every_id_of_a_list():
    """Counts of a multi-hot table add up to ``ids per sample`` times the samples counted: the
    window holds ``lookahead + 1`` batches of that many ids per sample (an independent sample
    of windows stays under the estimate), the backend builds that layout, and ``plan``'s hit
    rate is what the cache measures on such batches."""
    rows, hot, samples, batch, lookahead = [5000, 800], [1, 6], 10**6, 256, 2
    counts = {
        f"C{t + 1}": np.round(zipf_probs(n, 1.05) * samples * h).astype(np.int64)
        for t, (n, h) in enumerate(zip(rows, hot))
    }
    ratio = 0.03
    plan = plan_table(counts, [ratio], 0.5, lookahead, batch, samples)[0]
    rng = np.random.default_rng(0)
    probs = [c / c.sum() for c in counts.values()]
    static = cache_layout(rows, ratio, 0.5, list(counts.values())).static_rows
    seen = []
    for _ in range(50):
        draws = [
            rng.choice(n, (lookahead + 1) * batch * h, p=p) for n, h, p in zip(rows, hot, probs)
        ]
        seen.append(sum(np.unique(d[d >= s]).size for d, s in zip(draws, static)))
    assert max(seen) <= plan["window_needed"]
    assert plan["window_rows"] >= plan["window_needed"]
    # one id per sample (what the counts alone would suggest) undersizes the window
    one_hot = plan_table(counts, [ratio], 0.5, lookahead, batch)[0]
    assert one_hot["window_needed"] < min(seen)

    tables = [TableSpec(name, n, 4) for name, n in zip(counts, rows)]
    cache = FreqCacheBackend(
        tables,
        SparseOptim("sgd"),
        device="cpu",
        cache_ratio=ratio,
        lookahead=lookahead,
        counts=counts,
        batch_size=batch,
        counted_samples=samples,
    )
    assert cache.layout_stats()["cache_rows"] == plan["cache_rows"]
    batches = []
    for _ in range(60):
        ids = [rng.choice(n, batch * h, p=p) for n, h, p in zip(rows, hot, probs)]
        lengths = np.repeat(hot, batch)
        batches.append(
            KeyedJaggedTensor.from_lengths_sync(
                list(counts), torch.from_numpy(np.concatenate(ids)), torch.from_numpy(lengths)
            )
        )
    with torch.no_grad():
        for i, b in enumerate(batches):
            cache.prefetch(b)
            if i >= lookahead:
                cache(batches[i - lookahead])
            if i == 20:
                cache.reset_stats()  # cold start excluded
    stats = cache.stats()
    assert stats["accesses/C2"] == 6 * stats["accesses/C1"]
    assert stats.get("overflow_batches", 0) == stats.get("deferred_batches", 0) == 0
    assert abs(stats["hit_rate"] - plan["hit_rate"]) < 0.01, (stats["hit_rate"], plan)


def test_sharding_planner_weighs_a_multi_hot_table_by_its_ids():
    """A table looked up 10 times per sample is 10 one-hot tables' work: it gets a rank alone."""
    tables = [TableSpec("A", 4000, 4), TableSpec("B", 3000, 4), TableSpec("C", 3500, 4)]
    samples = 10**5
    counts = {
        t.name: np.round(zipf_probs(t.num_rows) * samples * h).astype(np.int64)
        for t, h in zip(tables, [1, 1, 10])
    }
    placement = plan_placement(tables, 2, SparseOptim("sgd"), 1e12, 0.05, counts)
    rank_of = {s.table: s.rank for s in placement.shards}
    assert rank_of["A"] == rank_of["B"] != rank_of["C"], rank_of


@pytest.mark.parametrize("precision", [Precision.fp32, Precision.bf16])
def test_the_model_feeds_its_dense_part_the_mean_in_every_precision(precision: Precision):
    """DLRM(pooling=mean): the interaction gets each bag's mean (fp32, outside autocast)."""
    tables, optim = make_tables(), SparseOptim("sgd", lr=0.1)
    state = random_state(tables, optim)
    host = HostBackend(tables, optim)
    host.import_tables(state)
    model = DLRM(host, 13, tables[0].dim, [16], [16], precision=precision, pooling=Pooling.mean)
    kjt = jagged_batch(np.random.default_rng(4), tables, 64)
    weights = [state[f"{t.name}.weight"].numpy() for t in tables]
    want = torch.from_numpy(numpy_pool(weights, kjt, mean=True)).float()
    pooled = model.pooled(kjt)
    assert pooled.dtype == torch.float32
    torch.testing.assert_close(pooled, want, rtol=1e-5, atol=1e-6)
    dense = torch.randn(64, 13)
    torch.testing.assert_close(model(dense, kjt), model.dense_forward(dense, want), **TOL)
