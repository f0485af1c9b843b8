"""``bench kind=loader``: the input pipeline alone on a processed dataset (``data_path``): samples/s
of batches ready for the step, through training's own path (shard stream, shuffle, rank share,
KJT, pinned memory and device copy on a GPU), beside the rate of reading the same shards with
parquet alone (the ceiling)."""

from __future__ import annotations

import math
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from omegaconf import DictConfig

from ..data.format import Manifest
from ..data.loader import ShardStream
from ..train.pipeline import Pipeline
from .inputs import sync


def loader(cfg: DictConfig, device: torch.device) -> list[dict[str, Any]]:
    """kind=loader: every epoch, the pipeline as training runs it, then the same shards read by
    parquet."""
    if not cfg.data_path:
        raise ValueError(
            "data_path: kind=loader needs a processed dataset (dlrm-cache preprocess output)"
        )
    manifest = Manifest.load(cfg.data_path, key="data_path")
    stream = ShardStream(
        cfg.data_path,
        manifest,
        "train",
        cfg.batch_size,
        cfg.shuffle,
        cfg.seed,
        pin=device.type == "cuda",
    )
    split = manifest.splits["train"]
    print(
        f"dlrm-cache bench kind=loader device={device} data={cfg.data_path} rows={split.rows:,} "
        f"shards={len(split.shards)} batch={cfg.batch_size} shuffle={cfg.shuffle} "
        f"threads={torch.get_num_threads()}"
    )
    results = []
    for epoch in range(cfg.epochs):
        sync(device)
        t0, cpu0 = time.perf_counter(), _cpu_seconds()
        samples, t_first, first = 0, math.nan, 0
        with Pipeline(stream.batches(epoch), device, depth=cfg.prefetch_batches) as batches:
            for batch in batches:
                if not samples:
                    sync(device)
                    t_first, first = time.perf_counter(), batch.size
                samples += batch.size
        sync(device)  # the last device copy has landed
        t1, cpu1 = time.perf_counter(), _cpu_seconds()
        rows = sum(pq.ParquetFile(Path(cfg.data_path) / s).read().num_rows for s in split.shards)
        t2 = time.perf_counter()
        # An epoch starts by waiting for its first shard (read and shuffled whole): once per epoch,
        # so over a large dataset's epoch the rate after the first batch is what the step sees.
        r = {
            "epoch": epoch,
            "samples_per_s": samples / (t1 - t0),
            "parquet_rows_per_s": rows / (t2 - t1),
            "cpu_ns_per_sample": 1e9 * (cpu1 - cpu0) / samples,
            "samples": samples,
            "seconds": t1 - t0,
            "first_batch_s": t_first - t0,
            "after_first_samples_per_s": (samples - first) / (t1 - t_first)
            if samples > first
            else math.nan,
        }
        print(
            f"  epoch {epoch}: {r['samples_per_s']:>12,.0f} samples/s ready for the step "
            f"({r['cpu_ns_per_sample']:.0f} ns of CPU time per sample, all threads; "
            f"first batch after {1000 * r['first_batch_s']:.0f} ms, "
            f"{r['after_first_samples_per_s']:,.0f} samples/s from there)   "
            f"parquet read only {r['parquet_rows_per_s']:>12,.0f} rows/s",
            flush=True,
        )
        results.append(r)
    warm = results[1:] or results
    total = sum(r["samples"] for r in warm) / sum(r["seconds"] for r in warm)
    steady = float(np.median([r["after_first_samples_per_s"] for r in warm]))
    parquet = float(np.median([r["parquet_rows_per_s"] for r in warm]))
    print(
        f"  epochs {warm[0]['epoch']}-{warm[-1]['epoch']}: {total:,.0f} samples/s; "
        f"from each epoch's first batch on, median {steady:,.0f} samples/s "
        f"(parquet read only: median {parquet:,.0f} rows/s)"
    )
    return results


def _cpu_seconds() -> float:
    """CPU time of this process, all threads (on a shared machine, what the work costs)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
