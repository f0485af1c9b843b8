"""What every bench kind runs on: synthetic power-law ids in the shards' layout, batches made as
the loader makes them, and the device helpers around the timings."""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch
from omegaconf import DictConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..config.choices import Hotness
from ..data.batch import Batch, OneIdPerSample
from ..data.format import KAGGLE_CARDINALITIES, MLPERF_MULTI_HOT_SIZES, SPARSE_NAMES
from ..embedding.base import TableSpec

# the samples :func:`zipf_counts` says it counted (each table's counts add up to this times its
# ids per sample)
COUNTED_SAMPLES = 10**9


@dataclass
class JaggedIds:
    """One batch's ids with several per sample: table-major ``values``, ``lengths`` [T*B]."""

    values: np.ndarray
    lengths: np.ndarray
    batch: int


def ids_per_sample(hotness: Hotness, tables: int) -> list[int]:
    """Ids per sample of each of ``tables`` tables: 1, or MLPerf's sizes (cycled)."""
    if hotness is Hotness.one:
        return [1] * tables
    return [MLPERF_MULTI_HOT_SIZES[i % len(MLPERF_MULTI_HOT_SIZES)] for i in range(tables)]


def zipf_probabilities(rows: int, alpha: float) -> np.ndarray:
    """P(rank r) ~ (r + 1) ** -alpha: rank 0 is the hottest row, as after preprocessing."""
    p = (np.arange(rows, dtype=np.float64) + 1.0) ** -alpha
    return p / p.sum()


def make_batches(
    table_rows: list[int], batch: int, n: int, alpha: float, seed: int, hot: list[int] | None = None
) -> list[np.ndarray] | list[JaggedIds]:
    """``n`` batches of ids: each [B, T] int64 (one id per sample and table, as in the shards),
    or with ``hot`` (ids per sample of each table, MLPerf's fixed list sizes) a JaggedIds."""
    rng = np.random.default_rng(seed)
    cdfs = {rows: np.cumsum(zipf_probabilities(rows, alpha)) for rows in set(table_rows)}
    hot = hot or [1] * len(table_rows)

    def draw(rows: int, k: int) -> np.ndarray:
        return np.minimum(np.searchsorted(cdfs[rows], rng.random(k)), rows - 1)

    if set(hot) == {1}:
        return [
            np.stack([draw(r, batch) for r in table_rows], axis=1).astype(np.int64)
            for _ in range(n)
        ]
    lengths = np.repeat(np.asarray(hot, dtype=np.int32), batch)
    return [
        JaggedIds(
            np.concatenate([draw(r, batch * h) for r, h in zip(table_rows, hot)]), lengths, batch
        )
        for _ in range(n)
    ]


def copy_batch(b: Batch) -> Batch:
    """A fresh Batch object per step (as the loader hands over)."""
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
    ids: list[np.ndarray] | list[JaggedIds],
    labels: torch.Tensor,
    pin: bool,
) -> list[Batch]:
    """Batches as the loader makes them (feature-major int32 ids, pinned for a GPU) from [B, T]
    ids, or jagged KJTs (int32 values, lengths and offsets; host-known per-key lengths) from
    JaggedIds."""
    if pin:
        dense, labels = dense.pin_memory(), labels.pin_memory()
    out = []
    for a in ids:
        if isinstance(a, JaggedIds):
            out.append(Batch(dense, jagged_kjt(layout.keys, a, pin), labels))
            continue
        values = torch.empty(a.shape[::-1], dtype=torch.int32, pin_memory=pin)
        values.numpy()[:] = a.T
        out.append(layout.batch(dense, values, labels))
    return out


def jagged_kjt(keys: list[str], ids: JaggedIds, pin: bool) -> KeyedJaggedTensor:
    """A KJT of ``ids`` (int32 values, lengths and offsets, pinned when ``pin``)."""

    def host(a: np.ndarray) -> torch.Tensor:
        t = torch.empty(a.shape, dtype=torch.int32, pin_memory=pin)
        t.numpy()[:] = a
        return t

    per_key = ids.lengths.reshape(len(keys), ids.batch).sum(axis=1).tolist()
    return KeyedJaggedTensor(
        keys=keys,
        values=host(ids.values),
        lengths=host(ids.lengths),
        offsets=host(np.concatenate([[0], np.cumsum(ids.lengths)])),
        stride=ids.batch,
        length_per_key=per_key,
        offset_per_key=list(accumulate(per_key, initial=0)),
    )


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


def zipf_counts(
    tables: list[TableSpec], alpha: float, hot: list[int] | None = None
) -> dict[str, np.ndarray]:
    """The frequency statistics a preprocessing pass over ``COUNTED_SAMPLES`` samples of this
    data would have produced (``hot``: each table's ids per sample, 1 by default)."""
    hot = hot or [1] * len(tables)
    return {
        t.name: np.round(zipf_probabilities(t.num_rows, alpha) * COUNTED_SAMPLES * h).astype(
            np.int64
        )
        for t, h in zip(tables, hot)
    }
