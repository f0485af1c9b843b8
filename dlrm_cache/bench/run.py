"""`dlrm-cache bench`: the benchmarks the README and the issue notes quote.

* ``kind=embedding``: the embedding layer alone (forward + backward + fused rowwise-Adagrad update),
  ``num_tables`` x ``rows_per_table`` x ``embedding_dim``, power-law ids, fresh batches every step.
* ``kind=train``: a whole DLRM training step (MLPs, interaction, loss, dense optimizer) with
  Criteo-Kaggle-shaped tables, once per backend and (``precisions`` x ``compile``) setting; after
  the timed steps, ``warmup`` + ``iters`` more steps split into phases (bench/breakdown.py) give
  the step's breakdown.
* ``kind=planning``: the freq_cache's own work per batch (loader thread / training thread up to a
  device synchronize) with Criteo-Kaggle-shaped tables: what has to stay below the step time.
* ``kind=loader``: the input pipeline alone on a processed dataset (``data_path``): samples/s of
  batches ready for the step, through training's own path (shard stream, shuffle, rank share, KJT,
  pinned memory and device copy on a GPU), beside the rate of reading the same shards with parquet
  alone (the ceiling).

Every backend runs in the same process on the same batches; results are reported as ms/iter and as
a ratio against the first baseline present (``hbm``, else ``host``), so figures compare within one
run.  Timings are wall-clock around a device synchronize, after ``warmup`` untimed iterations.

A placement that cannot run on this machine (:class:`DeviceUnavailable`, e.g. hbm without a GPU) is
skipped with its reason; any other error in a row is printed with its traceback and makes the bench
fail (:class:`BenchFailed`, exit status 1) after the other rows ran, as does a run where no row ran.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import resource
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from hydra.utils import get_class
from omegaconf import DictConfig

from ..config import Precision
from ..data.format import KAGGLE_CARDINALITIES, SPARSE_NAMES, Manifest, atomic_write_text
from ..data.loader import Batch, OneIdPerSample, ShardStream
from ..embedding.base import DeviceUnavailable, EmbeddingBackend, SparseOptim, TableSpec
from ..model.dlrm import DLRM
from ..parallel.dist import resolve_device
from ..train.pipeline import Pipeline
from ..train.step import dense_optimizer, set_matmul_precision
from .breakdown import PhaseClock, format_breakdown, split_step
from .syncs import HostSyncCounter

TARGETS = {
    "host": "dlrm_cache.embedding.direct.HostBackend",
    "hbm": "dlrm_cache.embedding.direct.HbmBackend",
    "uvm_cache": "dlrm_cache.embedding.direct.UvmCacheBackend",
    "freq_cache": "dlrm_cache.embedding.freq_cache.FreqCacheBackend",
}


class BenchFailed(RuntimeError):
    """Rows of the benchmark crashed, or none could run: the message says which and why."""


@dataclass
class Variant:
    label: str
    backend: str
    kwargs: dict[str, Any]
    precision: Precision = Precision.fp32  # train kind: the dense part's arithmetic
    compile: bool = False  # train kind: torch.compile of the dense path


def variants(cfg: DictConfig) -> list[Variant]:
    out = []
    for name in cfg.backends:
        if name == "uvm_cache":
            for algo in cfg.uvm_algorithms:
                for r in cfg.cache_ratios:
                    out.append(Variant(f"uvm_cache {algo} {r:.1%}", name, {"cache_ratio": r, "algorithm": algo}))
        elif name == "freq_cache":
            for r in cfg.cache_ratios:
                out.append(Variant(f"freq_cache {r:.1%}", name,
                                   {"cache_ratio": r, "lookahead": cfg.lookahead, "policy": cfg.policy,
                                    "batch_size": cfg.batch_size}))
        else:
            out.append(Variant(name, name, {}))
    if cfg.kind != "train":
        return out
    # every backend in every setting; labels keep the plain backend name for fp32 eager
    return [Variant(v.label + setting_label(p, c), v.backend, v.kwargs, p, c)
            for p in cfg.precisions for c in cfg.compile for v in out]


def setting_label(precision: Precision, compile: bool) -> str:
    return "" if (precision, compile) == (Precision.fp32, False) else f" {precision.value}{' compiled' * compile}"


def zipf_probabilities(rows: int, alpha: float) -> np.ndarray:
    """P(rank r) ~ (r + 1) ** -alpha: rank 0 is the hottest row, as after preprocessing."""
    p = (np.arange(rows, dtype=np.float64) + 1.0) ** -alpha
    return p / p.sum()


def make_batches(table_rows: list[int], batch: int, n: int, alpha: float, seed: int) -> list[np.ndarray]:
    """``n`` batches of ids, each [B, T] int64 (one id per sample and table, as in the shards)."""
    rng = np.random.default_rng(seed)
    cdfs = {rows: np.cumsum(zipf_probabilities(rows, alpha)) for rows in set(table_rows)}
    out = []
    for _ in range(n):
        ids = [np.minimum(np.searchsorted(cdfs[r], rng.random(batch)), r - 1) for r in table_rows]
        out.append(np.stack(ids, axis=1).astype(np.int64))
    return out


def _copy(b: Batch) -> Batch:
    """A fresh Batch object per step (the loader attaches each step's analysis to its batch)."""
    return Batch(b.dense, b.sparse, b.labels, layout=b.layout)


def init_device(device: torch.device) -> None:
    """Initialise CUDA on ``device`` before anything queries it: on a fresh process
    ``torch.cuda.reset_peak_memory_stats`` fails with "Invalid device argument" until the first
    allocation there (seen on the H100, 2026-11-23)."""
    if device.type == "cuda":
        torch.zeros(1, device=device)


def host_batches(layout: OneIdPerSample, dense: torch.Tensor, ids: list[np.ndarray], labels: torch.Tensor,
                 pin: bool) -> list[Batch]:
    """Batches as the loader makes them (feature-major int32 ids, pinned for a GPU) from [B, T] ids."""
    if pin:
        dense, labels = dense.pin_memory(), labels.pin_memory()
    out = []
    for a in ids:
        values = torch.empty(a.shape[::-1], dtype=torch.int32, pin_memory=pin)
        values.numpy()[:] = a.T
        out.append(layout.batch(dense, values, labels))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _build(v: Variant, tables: list[TableSpec], optim: SparseOptim, device, counts) -> EmbeddingBackend:
    cls = get_class(TARGETS[v.backend])
    kwargs = dict(v.kwargs)
    if v.backend == "freq_cache":
        kwargs["counts"] = counts
    # Row values do not change the timings; skipping initial_state() saves building every table
    # twice in host memory (26 x 2M x 128 floats is 27 GB).
    return cls(tables=tables, optim=optim, device=device, **kwargs)


def run_one(cfg: DictConfig, v: Variant, tables, batches, device, counts) -> dict[str, Any]:
    optim = SparseOptim("rowwise_adagrad", cfg.lr)
    # a compiled model refers to itself (model -> compiled method -> model): only the cycle
    # collector frees the previous variant's tables, and it does not count device memory
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        init_device(device)  # the allocator must exist before its stats are reset
        torch.cuda.reset_peak_memory_stats(device)
    emb = _build(v, tables, optim, device, counts)
    keys = [t.name for t in tables]
    b = cfg.batch_size
    gen = torch.Generator().manual_seed(cfg.seed)
    dense = torch.rand(b, 13, generator=gen)
    labels = (torch.rand(b, generator=gen) < 0.25).float()
    clock = PhaseClock(device)
    if cfg.kind == "train":
        model = DLRM(emb, 13, cfg.embedding_dim, list(cfg.bottom_mlp), list(cfg.top_mlp), device=device,
                     precision=v.precision, compile=v.compile)
        set_matmul_precision(v.precision, device)
        opt = dense_optimizer("adagrad", model.dense_parameters(), device, cfg.lr)

        def split(batch: Batch) -> None:
            split_step(model, opt, batch, clock)

        def step(batch: Batch) -> None:
            loss = F.binary_cross_entropy_with_logits(model(batch.dense, batch.sparse), batch.labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    else:
        grad = torch.randn(b, len(tables) * cfg.embedding_dim, generator=gen).to(device)

        def step(batch: Batch) -> None:
            emb(batch.sparse).values().backward(grad)

        split = step  # never called: the embedding kind has no breakdown

    layout = OneIdPerSample(keys)
    hosts = host_batches(layout, dense, batches, labels, pin=device.type == "cuda")
    # train kind: after the timed steps, warmup + iters steps split into phases (the breakdown)
    split_iters = cfg.warmup + cfg.iters if cfg.kind == "train" else 0
    timed_end = cfg.warmup + cfg.iters
    total = timed_end + split_iters
    # As in training (the same Pipeline): a loader thread runs the cache's analysis, the device copy
    # and the look-ahead prefetch happen in this thread.  The stream runs ``lookahead`` batches past
    # the last step, so that every step also pays for one prefetch (their rows are loaded, never
    # trained on).
    stream = (_copy(hosts[i % len(hosts)]) for i in range(total + emb.lookahead))
    t0, elapsed, stats = 0.0, 0.0, {}
    with Pipeline(stream, layout, device, emb) as pipeline:
        for i, batch in enumerate(pipeline):
            if i == cfg.warmup:
                _sync(device)
                emb.stats()  # reset the counters: report the timed iterations only
                t0 = time.perf_counter()
            if i == timed_end:  # the split steps that follow are the breakdown, not the timing
                _sync(device)
                elapsed, stats = time.perf_counter() - t0, emb.stats()
            if i == timed_end + cfg.warmup:
                clock.reset()
            (step if i < timed_end else split)(batch)
            if i == total - 1:
                break
        _sync(device)
        if not split_iters:
            elapsed, stats = time.perf_counter() - t0, emb.stats()
    result = {
        "variant": v.label,
        "iters": cfg.iters,
        "ms_per_iter": 1000 * elapsed / cfg.iters,
        "samples_per_s": cfg.iters * b / elapsed,
        "hit_rate": stats.get("hit_rate", math.nan),  # accesses served by the cache (freq_cache)
        "hit_rate_distinct": stats.get("hit_rate_distinct", math.nan),  # distinct ids (uvm_cache counts these)
        "peak_gpu_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else math.nan,
        "stats": stats,
    }
    if split_iters:
        result.update(precision=v.precision.value, compile=v.compile, breakdown_ms=clock.result())
    del emb
    return result


def planning(cfg: DictConfig, tables, batches, device, counts) -> list[dict[str, Any]]:
    """kind=planning: the freq_cache's own cost per batch, split by thread.

    ``analyze`` (dedup, global rows, the out-of-range flag) runs in the loader thread for a CPU
    cache; a GPU cache does it inside ``prefetch`` on the device.  ``prefetch`` (lookups, eviction,
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
    dense, labels = torch.zeros(b, 13), torch.zeros(b)
    host = host_batches(OneIdPerSample(keys), dense, batches, labels, pin=device.type == "cuda")  # pinned as the loader makes them
    results = []
    for ratio in cfg.cache_ratios:
        emb = FreqCacheBackend(tables, SparseOptim("rowwise_adagrad", cfg.lr), device=device,
                               cache_ratio=ratio, counts=counts, lookahead=cfg.lookahead, policy=cfg.policy,
                               batch_size=cfg.batch_size)
        t_an = t_pre = 0.0
        timed_end = cfg.warmup + cfg.iters
        total, window = timed_end + cfg.sync_count_batches, deque()
        counter, stats = HostSyncCounter(), None
        # as in training: batch i is prefetched while batches i-lookahead..i-1 hold their rows
        for i in range(total + cfg.lookahead):
            counted = timed_end <= i < total
            if i == timed_end:
                stats = emb.stats()  # the timed batches' counters
            with counter if counted else contextlib.nullcontext():
                if i < total:
                    kjt = host[i % len(host)].sparse
                    _sync(device)  # the previous batch's forward is not this prefetch's time
                    t = time.perf_counter()
                    a = emb.analyze(kjt)
                    t1 = time.perf_counter()
                    emb.prefetch(kjt, a)
                    _sync(device)
                    t2 = time.perf_counter()
                    window.append(kjt)
                    if i == cfg.warmup:
                        emb.stats()
                    if cfg.warmup <= i < timed_end:
                        t_an, t_pre = t_an + t1 - t, t_pre + t2 - t1
                if len(window) > cfg.lookahead or i >= total:
                    emb.forward(window.popleft().to(device))
                    emb.step_done()
        stats_all = emb.stats()
        if stats is None:  # nothing ran after the timed batches
            stats, stats_all = stats_all, {k: 0.0 for k in stats_all}
        n = max(1, cfg.sync_count_batches)
        r = {"variant": f"freq_cache {ratio:.1%} {cfg.policy} planning", "analyze_ms": 1000 * t_an / cfg.iters,
             "prefetch_ms": 1000 * t_pre / cfg.iters, "hit_rate": stats["hit_rate"],
             "rows_loaded_per_batch": stats["rows_loaded"] / cfg.iters, "stats": stats,
             "host_syncs_per_batch": counter.total_syncs / n, "aten_ops_per_batch": counter.total_ops / n,
             "sorts_per_batch": (counter.ops["sort"] + counter.ops["topk"]) / n,
             "host_syncs_by_kind": {k: v / n for k, v in sorted(counter.syncs.items())},
             "deferred_batches_all": stats_all["deferred_batches"] + stats["deferred_batches"],
             "overflow_batches_all": stats_all["overflow_batches"] + stats["overflow_batches"]}
        print(f"  {r['variant']:<28} analyze (loader thread) {r['analyze_ms']:7.2f} ms/batch  "
              f"prefetch (training thread, to a device sync) {r['prefetch_ms']:7.2f} ms/batch  hit {r['hit_rate']:.4f}  "
              f"rows loaded/batch {r['rows_loaded_per_batch']:,.0f}  deferred {stats['deferred_batches']:.0f}"
              f"  overflow {stats['overflow_batches']:.0f}", flush=True)
        kinds = " ".join(f"{k} {v:g}" for k, v in r["host_syncs_by_kind"].items())
        print(f"  {'':<28} per batch (analyze+prefetch+forward, {cfg.sync_count_batches} batches): host syncs "
              f"{r['host_syncs_per_batch']:g} ({kinds})  aten ops {r['aten_ops_per_batch']:g}  "
              f"sort/topk {r['sorts_per_batch']:g}  window {stats['window_rows']:,.0f} rows "
              f"(needed ~{stats['window_needed_rows']:,.0f}), static {stats['static_rows']:,.0f} rows", flush=True)
        results.append(r)
        del emb
    return results


def loader(cfg: DictConfig, device: torch.device) -> list[dict[str, Any]]:
    """kind=loader: every epoch, the pipeline as training runs it, then the same shards read by parquet."""
    if not cfg.data_path:
        raise ValueError("data_path: kind=loader needs a processed dataset (dlrm-cache preprocess output)")
    manifest = Manifest.load(cfg.data_path, key="data_path")
    stream = ShardStream(cfg.data_path, manifest, "train", cfg.batch_size, cfg.shuffle, cfg.seed,
                         pin=device.type == "cuda")
    split = manifest.splits["train"]
    print(f"dlrm-cache bench kind=loader device={device} data={cfg.data_path} rows={split.rows:,} "
          f"shards={len(split.shards)} batch={cfg.batch_size} shuffle={cfg.shuffle} threads={torch.get_num_threads()}")
    results = []
    for epoch in range(cfg.epochs):
        _sync(device)
        t0, cpu0 = time.perf_counter(), _cpu_seconds()
        samples, t_first, first = 0, math.nan, 0
        with Pipeline(stream.batches(epoch), stream.layout, device, depth=cfg.prefetch_batches) as batches:
            for batch in batches:
                if not samples:
                    _sync(device)
                    t_first, first = time.perf_counter(), batch.size
                samples += batch.size
        _sync(device)  # the last device copy has landed
        t1, cpu1 = time.perf_counter(), _cpu_seconds()
        rows = sum(pq.ParquetFile(Path(cfg.data_path) / s).read().num_rows for s in split.shards)
        t2 = time.perf_counter()
        # An epoch starts by waiting for its first shard (read and shuffled whole): once per epoch,
        # so over a large dataset's epoch the rate after the first batch is what the step sees.
        r = {"epoch": epoch, "samples_per_s": samples / (t1 - t0), "parquet_rows_per_s": rows / (t2 - t1),
             "cpu_ns_per_sample": 1e9 * (cpu1 - cpu0) / samples, "samples": samples, "seconds": t1 - t0,
             "first_batch_s": t_first - t0,
             "after_first_samples_per_s": (samples - first) / (t1 - t_first) if samples > first else math.nan}
        print(f"  epoch {epoch}: {r['samples_per_s']:>12,.0f} samples/s ready for the step "
              f"({r['cpu_ns_per_sample']:.0f} ns of CPU time per sample, all threads; first batch after "
              f"{1000 * r['first_batch_s']:.0f} ms, {r['after_first_samples_per_s']:,.0f} samples/s from there)   "
              f"parquet read only {r['parquet_rows_per_s']:>12,.0f} rows/s", flush=True)
        results.append(r)
    warm = results[1:] or results
    total = sum(r["samples"] for r in warm) / sum(r["seconds"] for r in warm)
    steady = float(np.median([r["after_first_samples_per_s"] for r in warm]))
    print(f"  epochs {warm[0]['epoch']}-{warm[-1]['epoch']}: {total:,.0f} samples/s; from each epoch's first batch "
          f"on, median {steady:,.0f} samples/s "
          f"(parquet read only: median {float(np.median([r['parquet_rows_per_s'] for r in warm])):,.0f} rows/s)")
    return results


def _cpu_seconds() -> float:
    """CPU time of this process, all threads (on a shared machine, what the work costs)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bench(cfg: DictConfig) -> list[dict[str, Any]]:
    device = resolve_device(cfg.device)
    init_device(device)
    if cfg.kind == "loader":  # no figure: one rate per epoch, printed
        results = loader(cfg, device)
        if cfg.output:
            atomic_write_text(cfg.output, json.dumps(results, indent=1, default=float))
        return results
    if cfg.kind == "embedding":
        sizes = [cfg.rows_per_table] * cfg.num_tables
    else:
        sizes = [max(4, math.ceil(c * cfg.cardinality_scale)) for c in KAGGLE_CARDINALITIES]
    tables = [TableSpec(SPARSE_NAMES[i] if i < len(SPARSE_NAMES) else f"T{i}", n, cfg.embedding_dim)
              for i, n in enumerate(sizes)]
    batches = make_batches(sizes, cfg.batch_size, cfg.distinct_batches, cfg.zipf_alpha, cfg.seed)
    # The frequency statistics a preprocessing pass over this data would have produced.
    counts = {t.name: np.round(zipf_probabilities(t.num_rows, cfg.zipf_alpha) * 1e9).astype(np.int64)
              for t in tables}
    print(f"dlrm-cache bench kind={cfg.kind} device={device} tables={len(tables)} rows={sum(sizes):,} "
          f"dim={cfg.embedding_dim} batch={cfg.batch_size} zipf_alpha={cfg.zipf_alpha} iters={cfg.iters}")
    title = (f"dlrm-cache bench kind={cfg.kind} on {device}: {len(tables)} tables, {sum(sizes):,} rows, "
             f"dim {cfg.embedding_dim}, batch {cfg.batch_size:,}")
    if cfg.kind == "planning":
        results = planning(cfg, tables, batches, device, counts)
        _write(cfg, results, title)
        return results
    results = []
    for v in variants(cfg):
        try:
            r = run_one(cfg, v, tables, batches, device, counts)
        except DeviceUnavailable as e:  # e.g. a CUDA-only backend on a CPU machine
            r = {"variant": v.label, "error": str(e).splitlines()[0]}
        except Exception as e:  # noqa: BLE001 -- reported below and fails the run, after the other rows
            traceback.print_exc(file=sys.stderr)
            r = {"variant": v.label, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                 "crashed": True}
        results.append(r)
        print(_row(r), flush=True)
    base = next((r for name in ("hbm", "host") for r in results if r["variant"] == name and "error" not in r), None)
    if base:
        for r in results:
            if "error" not in r:
                r["speed_vs_" + base["variant"]] = base["ms_per_iter"] / r["ms_per_iter"]
        print(f"\nspeed relative to {base['variant']} (same run):")
        for r in results:
            if "error" not in r:
                print(f"  {r['variant']:<24} {r['ms_per_iter']:9.3f} ms  {r['speed_vs_' + base['variant']]:6.3f}x"
                      f"{_vs_same_setting(r, results, base['variant'])}")
    _write(cfg, results, title)
    check_rows(results)
    return results


def bench_series(results: list[dict[str, Any]]) -> dict[str, Any]:
    """What the bench figure draws: per variant that ran, ms/iter and speed against the baseline
    (kind=planning: analyze and prefetch ms per batch); the skipped ones with their reason."""
    ran = [r for r in results if "error" not in r]
    out: dict[str, Any] = {"variant": [r["variant"] for r in ran],
                           "skipped": [(r["variant"], r["error"]) for r in results if "error" in r]}
    if ran and "analyze_ms" in ran[0]:
        out.update(metric="planning", analyze_ms=[r["analyze_ms"] for r in ran],
                   prefetch_ms=[r["prefetch_ms"] for r in ran])
        return out
    speed_key = next((k for k in (ran[0] if ran else {}) if k.startswith("speed_vs_")), None)
    out.update(metric="ms_per_iter", ms_per_iter=[r["ms_per_iter"] for r in ran],
               samples_per_s=[r["samples_per_s"] for r in ran],
               baseline=speed_key[len("speed_vs_"):] if speed_key else None,
               relative=[r[speed_key] if speed_key else None for r in ran])
    return out


def _write(cfg: DictConfig, results: list[dict[str, Any]], title: str) -> None:
    if cfg.output:
        atomic_write_text(cfg.output, json.dumps(results, indent=1, default=float))
    if cfg.figure and any("error" not in r for r in results):
        from ..figures import draw_bench

        print(f"dlrm-cache bench: figure {draw_bench(bench_series(results), title, Path(cfg.figure))}")


def _vs_same_setting(r: dict[str, Any], results: list[dict[str, Any]], base: str) -> str:
    """A cache's speed against the baseline backend run in the same precision/compile setting."""
    if "precision" not in r or r["variant"].split(" ")[0] == base:
        return ""
    same = next((o for o in results if "error" not in o and o["variant"].split(" ")[0] == base
                 and (o["precision"], o["compile"]) == (r["precision"], r["compile"])), None)
    if same is None or same["variant"] == base:  # fp32 eager: the speed column above says it
        return ""
    return f"  ({same['ms_per_iter'] / r['ms_per_iter']:.3f}x {same['variant']})"


def check_rows(results: list[dict[str, Any]]) -> None:
    """Raise :class:`BenchFailed` when a row crashed or when no row ran at all."""
    crashed = [r for r in results if r.get("crashed")]
    if crashed or all("error" in r for r in results):
        bad = crashed or results
        raise BenchFailed("; ".join(f"{r['variant']}: {r['error']}" for r in bad)
                          + ("" if crashed else " (no placement could run on this machine)"))


def _row(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"  {r['variant']:<24} {'FAILED' if r.get('crashed') else 'skipped'}: {r['error']}"
    st = r.get("stats", {})
    waits = ""
    if "stall_s" in st:  # freq_cache: where its time went (per timed iteration)
        n = r["iters"]
        waits = (f"  stall {1000 * st['stall_s'] / n:.3f} ms/iter"
                 f"  GPU wait for rows {1000 * st.get('transfer_wait_s', 0.0) / n:.3f} ms/iter")
    line = (f"  {r['variant']:<24} {r['ms_per_iter']:9.3f} ms/iter  {r['samples_per_s']:>12,.0f} samples/s"
            f"  hit {r['hit_rate']:.4f} (distinct ids {r['hit_rate_distinct']:.4f})"
            f"  peak GPU {r['peak_gpu_mib']:.0f} MiB{waits}")
    if "breakdown_ms" in r:
        line += "\n" + format_breakdown(r["breakdown_ms"])
    return line
