"""What every bench kind runs on: synthetic power-law ids in the shards' layout, batches made as
the loader makes them, and the device helpers around the timings."""

from __future__ import annotations

import math

import numpy as np
import torch
from omegaconf import DictConfig

from ..data.format import KAGGLE_CARDINALITIES, SPARSE_NAMES
from ..data.loader import Batch, OneIdPerSample
from ..embedding.base import TableSpec


def zipf_probabilities(rows: int, alpha: float) -> np.ndarray:
    """P(rank r) ~ (r + 1) ** -alpha: rank 0 is the hottest row, as after preprocessing."""
    p = (np.arange(rows, dtype=np.float64) + 1.0) ** -alpha
    return p / p.sum()


def make_batches(
    table_rows: list[int], batch: int, n: int, alpha: float, seed: int
) -> list[np.ndarray]:
    """``n`` batches of ids, each [B, T] int64 (one id per sample and table, as in the shards)."""
    rng = np.random.default_rng(seed)
    cdfs = {rows: np.cumsum(zipf_probabilities(rows, alpha)) for rows in set(table_rows)}
    out = []
    for _ in range(n):
        ids = [np.minimum(np.searchsorted(cdfs[r], rng.random(batch)), r - 1) for r in table_rows]
        out.append(np.stack(ids, axis=1).astype(np.int64))
    return out


def copy_batch(b: Batch) -> Batch:
    """A fresh Batch object per step (the loader attaches each step's analysis to its batch)."""
    return Batch(b.dense, b.sparse, b.labels)


def init_device(device: torch.device) -> None:
    """Initialise CUDA on ``device`` before anything queries it: on a fresh process
    ``torch.cuda.reset_peak_memory_stats`` fails with "Invalid device argument" until the first
    allocation there (seen on the H100, 2026-11-23)."""
    if device.type == "cuda":
        torch.zeros(1, device=device)


def host_batches(
    layout: OneIdPerSample,
    dense: torch.Tensor,
    ids: list[np.ndarray],
    labels: torch.Tensor,
    pin: bool,
) -> list[Batch]:
    """Batches as the loader makes them (feature-major int32 ids, pinned for a GPU) from [B, T]
    ids."""
    if pin:
        dense, labels = dense.pin_memory(), labels.pin_memory()
    out = []
    for a in ids:
        values = torch.empty(a.shape[::-1], dtype=torch.int32, pin_memory=pin)
        values.numpy()[:] = a.T
        out.append(layout.batch(dense, values, labels))
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_tables(cfg: DictConfig) -> list[TableSpec]:
    """kind=embedding: ``num_tables`` x ``rows_per_table``; else Criteo Kaggle's cardinalities
    times ``cardinality_scale``."""
    if cfg.kind == "embedding":
        sizes = [cfg.rows_per_table] * cfg.num_tables
    else:
        sizes = [max(4, math.ceil(c * cfg.cardinality_scale)) for c in KAGGLE_CARDINALITIES]
    return [
        TableSpec(SPARSE_NAMES[i] if i < len(SPARSE_NAMES) else f"T{i}", n, cfg.embedding_dim)
        for i, n in enumerate(sizes)
    ]


def zipf_counts(tables: list[TableSpec], alpha: float) -> dict[str, np.ndarray]:
    """The frequency statistics a preprocessing pass over this data would have produced."""
    return {
        t.name: np.round(zipf_probabilities(t.num_rows, alpha) * 1e9).astype(np.int64)
        for t in tables
    }
