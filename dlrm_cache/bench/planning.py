"""``bench kind=planning``: the freq_cache's host half per batch (analysis on the loader thread,
placement on the planner thread, the copies it issues) with Criteo-Kaggle-shaped tables: what has
to stay below the step time."""

from __future__ import annotations

import contextlib
import gc
import time
from collections import deque
from typing import Any

import torch
from omegaconf import DictConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..data.format import NUM_DENSE
from ..data.loader import OneIdPerSample
from ..embedding.base import SparseOptim
from .inputs import COUNTED_SAMPLES, host_batches, sync
from .syncs import HostSyncCounter


def planning(cfg: DictConfig, tables, batches, device, counts) -> list[dict[str, Any]]:
    """kind=planning: the freq_cache's own cost per batch, by thread, for each cache ratio and
    each value of ``planner_threads``.

    Per timed batch: ``analyze`` (the loader thread's part on a GPU: global rows, range check,
    static slots, distinct rows; on a CPU device the planner does it inside the placement), then
    ``prefetch`` up to ``settle`` (the planner has placed the batch: lookups, victims, pins, the
    host gather of its missing rows into staging, its copies issued), then a device synchronize
    (the copies themselves).  ``host_ms``: the planner's host work per batch, the placement's wall
    time less the time spent issuing device work (on a CPU device, doing it) and less the
    write-backs' landing where it ran inline; ``land_ms``: the write-backs' landing (waiting for
    the copy, scattering rows into the host store: the applier thread's work on a GPU); ``cpu_ms``:
    the CPU time of the whole process over the placement; ``copy_ms``: the wait for the device
    after it.  With the look-ahead window the placement of batch ``t + lookahead`` runs beside
    step ``t``, so ``host_ms`` must stay below the step time, not add to it.  After the timed
    batches, ``sync_count_batches`` more run with the training thread's calls (prefetch,
    forward) under :class:`HostSyncCounter`: the reads that would make it wait for the device.
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
        for threads in cfg.planner_threads:
            gc.collect()  # the previous cache's host store goes before this one is made
            emb = FreqCacheBackend(
                tables,
                SparseOptim("rowwise_adagrad", cfg.lr),
                device=device,
                cache_ratio=ratio,
                counts=counts,
                lookahead=cfg.lookahead,
                policy=cfg.policy,
                batch_size=cfg.batch_size,
                planner_threads=threads,
                counted_samples=COUNTED_SAMPLES,
            )
            r = _run(cfg, emb, host, device)
            r["variant"] = f"freq_cache {ratio:.1%} {cfg.policy} threads={emb.planner_threads}"
            _print(r)
            results.append(r)
            del emb
    return results


def _run(cfg: DictConfig, emb, host: list, device: torch.device) -> dict[str, Any]:
    timed_end = cfg.warmup + cfg.iters
    total = timed_end + cfg.sync_count_batches
    window: deque[KeyedJaggedTensor] = deque()
    counter, stats = HostSyncCounter(), None
    t_an = t_host = t_cpu = t_copy = t_land = 0.0
    tr, phases = emb.transfers, emb.placer.phase_s
    phase0: dict[str, float] = {}
    land0 = 0.0
    # as in training: batch i is prefetched while batches i-lookahead..i-1 hold their rows
    for i in range(total + cfg.lookahead):
        counted = timed_end <= i < total
        if i == timed_end:
            stats = emb.take_stats()  # the timed batches' counters
        if i == cfg.warmup:  # the timed batches start: their counters and clocks from here
            emb.settle()
            emb.reset_stats()
            phase0 = {**phases, "gather": tr.gather_s, "issue": tr.issue_s}
            land0 = tr.write_backs.land_s
        if i < total:
            kjt = host[i % len(host)].sparse
            sync(device)  # the previous batch's forward is not this placement's time
            t = time.perf_counter()
            a = emb.analyze(kjt)
            issue, land = tr.issue_s, tr.write_backs.land_s
            t1, c1 = time.perf_counter(), time.process_time()
            with counter if counted else contextlib.nullcontext():
                emb.prefetch(kjt, a)
            emb.settle()  # the planner thread placed it (prefetch only posts the batch)
            t2, c2 = time.perf_counter(), time.process_time()
            issue, land = tr.issue_s - issue, tr.write_backs.land_s - land
            inline = land if tr.write_backs.inline else 0.0
            sync(device)
            t3 = time.perf_counter()
            window.append(kjt)
            if cfg.warmup <= i < timed_end:
                t_an, t_cpu, t_copy = t_an + t1 - t, t_cpu + c2 - c1, t_copy + t3 - t2
                t_host += (t2 - t1) - issue - inline
        if len(window) > cfg.lookahead or i >= total:
            with counter if counted else contextlib.nullcontext():
                emb.forward(window.popleft().to(device))
                emb.step_done()
        if i == timed_end - 1:
            emb.settle()
            phase1 = {**phases, "gather": tr.gather_s, "issue": tr.issue_s}
            t_land = tr.write_backs.land_s - land0  # on its own thread (GPU) or inline (CPU)
    stats_all = emb.stats()
    if stats is None:  # nothing ran after the timed batches
        stats, stats_all = stats_all, {k: 0.0 for k in stats_all}
    n, ms = max(1, cfg.sync_count_batches), 1000 / cfg.iters
    return {
        "planner_threads": emb.planner_threads,
        "analyze_ms": t_an * ms,
        "host_ms": t_host * ms,
        "land_ms": t_land * ms,
        # the placement's parts: waits for write-backs, bookkeeping (of which victims), staging
        # fill and gather, issuing device work (on a CPU device: doing it)
        "phase_ms": {k: (phase1[k] - phase0.get(k, 0.0)) * ms for k in phase1},
        "cpu_ms": t_cpu * ms,
        "copy_ms": t_copy * ms,
        "hit_rate": stats["hit_rate"],
        "rows_loaded_per_batch": stats["rows_loaded"] / cfg.iters,
        "rows_written_back_per_batch": stats["rows_written_back"] / cfg.iters,
        "stats": stats,
        "host_syncs_per_batch": counter.total_syncs / n,
        "host_syncs_by_kind": {k: v / n for k, v in sorted(counter.syncs.items())},
        "deferred_batches_all": stats_all["deferred_batches"] + stats["deferred_batches"],
        "overflow_batches_all": stats_all["overflow_batches"] + stats["overflow_batches"],
    }


def _print(r: dict[str, Any]) -> None:
    s = r["stats"]
    print(
        f"  {r['variant']:<36} analysis {r['analyze_ms']:5.2f}  planner host work "
        f"{r['host_ms']:5.2f}  write-backs landing {r['land_ms']:5.2f}  (ms/batch; process CPU "
        f"{r['cpu_ms']:5.2f})  copies after it {r['copy_ms']:5.2f} ms  hit {r['hit_rate']:.4f}  "
        f"rows in/out per batch "
        f"{r['rows_loaded_per_batch']:,.0f}/{r['rows_written_back_per_batch']:,.0f}  "
        f"deferred {s['deferred_batches']:.0f}  overflow {s['overflow_batches']:.0f}",
        flush=True,
    )
    parts = "  ".join(f"{k} {v:.2f}" for k, v in r["phase_ms"].items())
    print(f"  {'':<36} placement's parts (ms/batch): {parts}", flush=True)
    kinds = " ".join(f"{k} {v:g}" for k, v in r["host_syncs_by_kind"].items()) or "none"
    print(
        f"  {'':<36} training thread's host syncs per batch (prefetch+forward): {kinds}; "
        f"window {s['window_rows']:,.0f} rows (needed ~{s['window_needed_rows']:,.0f}), "
        f"static {s['static_rows']:,.0f} rows",
        flush=True,
    )
