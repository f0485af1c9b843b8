"""``bench kind=planning``: the freq_cache's own work per batch (loader thread / training thread up
to a device synchronize) with Criteo-Kaggle-shaped tables: what has to stay below the step time."""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import Any

import torch
from omegaconf import DictConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..data.format import NUM_DENSE
from ..data.loader import OneIdPerSample
from ..embedding.base import SparseOptim
from .inputs import host_batches, sync
from .syncs import HostSyncCounter


def planning(cfg: DictConfig, tables, batches, device, counts) -> list[dict[str, Any]]:
    """kind=planning: the freq_cache's own cost per batch, split by thread.

    ``prefetch`` hands the batch to the cache's planner (its thread on a GPU; inline on a CPU);
    the time measured here is until the planner has placed it (``settle``) and the device has
    finished (what one batch's planning and copies cost, off the step's critical path in training
    on a GPU).

    ``analyze`` (dedup, global rows, the out-of-range flag) runs in the loader thread only for a
    CPU cache with ``row_map=sorted``; otherwise the planner does it inside ``prefetch`` (on a GPU
    on the device; on a CPU with the dense map per id through the map, freq_cache/by_id.py,
    where its ``nonzero`` is no synchronization, though the counter below lists it).  ``prefetch`` (lookups, eviction,
    row copies) is timed in the training thread up to a device synchronize, so on a GPU it is the
    plan + copy latency of one batch; with the look-ahead window it overlaps the steps of earlier
    batches, so it must stay below the step time, not add to it.  After the timed batches,
    ``sync_count_batches`` more run under :class:`HostSyncCounter`: the cache's calls per batch
    (analyze, prefetch, forward) that make the host wait for the device, and all the aten ops they
    issue.
    """
    from ..embedding.freq_cache import FreqCacheBackend

    keys = [t.name for t in tables]
    b = cfg.batch_size
    dense, labels = torch.zeros(b, NUM_DENSE), torch.zeros(b)
    host = host_batches(
        OneIdPerSample(keys), dense, batches, labels, pin=device.type == "cuda"
    )  # pinned as the loader makes them
    results = []
    for ratio in cfg.cache_ratios:
        emb = FreqCacheBackend(
            tables,
            SparseOptim("rowwise_adagrad", cfg.lr),
            device=device,
            cache_ratio=ratio,
            counts=counts,
            lookahead=cfg.lookahead,
            policy=cfg.policy,
            batch_size=cfg.batch_size,
        )
        t_an = t_pre = 0.0
        timed_end = cfg.warmup + cfg.iters
        total, window = timed_end + cfg.sync_count_batches, deque[KeyedJaggedTensor]()
        counter, stats = HostSyncCounter(), None
        # as in training: batch i is prefetched while batches i-lookahead..i-1 hold their rows
        for i in range(total + cfg.lookahead):
            counted = timed_end <= i < total
            if i == timed_end:
                stats = emb.take_stats()  # the timed batches' counters
            with counter if counted else contextlib.nullcontext():
                if i < total:
                    kjt = host[i % len(host)].sparse
                    sync(device)  # the previous batch's forward is not this prefetch's time
                    t = time.perf_counter()
                    a = emb.analyze(kjt)
                    t1 = time.perf_counter()
                    emb.prefetch(kjt, a)
                    emb.settle()  # the planner thread placed it (prefetch only posts the batch)
                    sync(device)
                    t2 = time.perf_counter()
                    window.append(kjt)
                    if i == cfg.warmup:
                        emb.reset_stats()
                    if cfg.warmup <= i < timed_end:
                        t_an, t_pre = t_an + t1 - t, t_pre + t2 - t1
                if len(window) > cfg.lookahead or i >= total:
                    emb.forward(window.popleft().to(device))
                    emb.step_done()
        stats_all = emb.stats()
        if stats is None:  # nothing ran after the timed batches
            stats, stats_all = stats_all, {k: 0.0 for k in stats_all}
        n = max(1, cfg.sync_count_batches)
        r = {
            "variant": f"freq_cache {ratio:.1%} {cfg.policy} planning",
            "analyze_ms": 1000 * t_an / cfg.iters,
            "prefetch_ms": 1000 * t_pre / cfg.iters,
            "hit_rate": stats["hit_rate"],
            "rows_loaded_per_batch": stats["rows_loaded"] / cfg.iters,
            "stats": stats,
            "host_syncs_per_batch": counter.total_syncs / n,
            "aten_ops_per_batch": counter.total_ops / n,
            "sorts_per_batch": (counter.ops["sort"] + counter.ops["topk"]) / n,
            "host_syncs_by_kind": {k: v / n for k, v in sorted(counter.syncs.items())},
            "deferred_batches_all": stats_all["deferred_batches"] + stats["deferred_batches"],
            "overflow_batches_all": stats_all["overflow_batches"] + stats["overflow_batches"],
        }
        print(
            f"  {r['variant']:<28} analyze (loader thread) {r['analyze_ms']:7.2f} ms/batch  "
            f"prefetch (training thread, to a device sync) {r['prefetch_ms']:7.2f} ms/batch  "
            f"hit {r['hit_rate']:.4f}  "
            f"rows loaded/batch {r['rows_loaded_per_batch']:,.0f}  "
            f"deferred {stats['deferred_batches']:.0f}"
            f"  overflow {stats['overflow_batches']:.0f}",
            flush=True,
        )
        kinds = " ".join(f"{k} {v:g}" for k, v in r["host_syncs_by_kind"].items())
        print(
            f"  {'':<28} per batch (analyze+prefetch+forward, {cfg.sync_count_batches} batches): "
            f"host syncs "
            f"{r['host_syncs_per_batch']:g} ({kinds})  aten ops {r['aten_ops_per_batch']:g}  "
            f"sort/topk {r['sorts_per_batch']:g}  window {stats['window_rows']:,.0f} rows "
            f"(needed ~{stats['window_needed_rows']:,.0f}), "
            f"static {stats['static_rows']:,.0f} rows",
            flush=True,
        )
        results.append(r)
        del emb
    return results
