"""A small processed multi-hot dataset written straight in the on-disk format (no preprocessing):
list columns, frequency-ranked ids, statistics that count every list element, and a planted
signal (the mean of a list's per-id effects) so a trained model must beat chance.

A plain module (not conftest.py) so tests import it; the session fixture is in conftest.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
from shards import write_split

from dlrm_cache.data.format import DENSE_NAMES, LABEL, SCHEMA_VERSION, Manifest, SplitInfo
from dlrm_cache.data.parquet import write_shard
from dlrm_cache.data.stats import COUNTS, SUMMARY, rank_feature, summarize, write_counts
from dlrm_cache.files.atomic import sha256_file

# C1..C5; C2 and C4 multi-hot with up to this many ids (0 included)
MULTI_HOT_MAX = {"C2": 4, "C4": 7}
SIZES = [40, 150, 300, 30, 400]


def _draw(rng, n: int, size: int, max_len: int | None):
    """(lengths, raw ids): power-law ids in [0, size), one per sample or ``0..max_len`` each."""
    lengths = np.ones(n, np.int64) if max_len is None else rng.integers(0, max_len + 1, n)
    ids = np.minimum(rng.pareto(1.2, int(lengths.sum())).astype(np.int64), size - 1)
    return lengths, ids


def _mean_effect(effect: np.ndarray, lengths: np.ndarray, ids: np.ndarray) -> np.ndarray:
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    sums = np.add.reduceat(np.append(effect[ids], 0.0), offsets[:-1]) * (lengths > 0)
    return sums / np.maximum(lengths, 1)


def write_multi_hot(
    root: Path,
    rows: dict[str, int],
    sizes: list[int] = SIZES,
    multi_hot: dict[str, int] = MULTI_HOT_MAX,
    shard_rows: int = 700,
    seed: int = 0,
) -> Manifest:
    """Write the dataset into ``root``; returns its manifest."""
    rng = np.random.default_rng(seed)
    names = [f"C{j + 1}" for j in range(len(sizes))]
    effects = [rng.normal(0, 1.0, n) for n in sizes]
    w = rng.normal(0, 0.5, len(DENSE_NAMES))
    raw: dict[str, list] = {}
    for split, n in rows.items():
        dense = rng.exponential(1.0, (n, len(DENSE_NAMES))).astype(np.float32)
        cols = [_draw(rng, n, t, multi_hot.get(f)) for f, t in zip(names, sizes)]
        z = (dense - 1) @ w + 0.8 * sum(_mean_effect(e, *c) for e, c in zip(effects, cols)) - 0.5
        labels = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(np.float32)
        raw[split] = [dense, labels, cols]
    stats = {}
    for j, f in enumerate(names):  # every element of the training lists counts
        ids, counts = np.unique(raw["train"][2][j][1], return_counts=True)
        stats[f] = rank_feature(ids, counts.astype(np.int64), 1)
    (root / "stats").mkdir(parents=True, exist_ok=True)
    write_counts(root / COUNTS, stats)
    (root / SUMMARY).write_text(json.dumps(summarize(stats), indent=2))
    splits = {
        split: _write_split(root, split, raw[split], names, stats, multi_hot, shard_rows)
        for split in rows
    }
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        table_sizes=[stats[f].table_size for f in names],
        splits=splits,
        stats_digest=sha256_file(root / COUNTS),
        min_count=1,
        hash_modulus=0,
        sources=[],
        sparse_names=names,
        multi_hot=[f for f in names if f in multi_hot],
    )
    manifest.save(root)
    return manifest


def _write_split(root, split, data, names, stats, multi_hot, shard_rows) -> SplitInfo:
    dense, labels, cols = data
    ranked = []
    for f, (lengths, ids) in zip(names, cols):  # raw id -> rank; unseen in training: rare row
        st = stats[f]
        rank = np.full(int(max(ids.max(initial=0), st.ids.max(initial=0))) + 1, len(st.ids))
        rank[st.ids] = np.arange(len(st.ids))
        ranked.append((np.concatenate([[0], np.cumsum(lengths)]), rank[ids].astype(np.int32)))

    def shard_tables():
        n = len(labels)
        for lo in range(0, n, shard_rows):
            hi = min(n, lo + shard_rows)
            table = {
                LABEL: labels[lo:hi],
                **{d: dense[lo:hi, i] for i, d in enumerate(DENSE_NAMES)},
            }
            for f, (offsets, ids) in zip(names, ranked):
                part = ids[offsets[lo] : offsets[hi]]
                if f in multi_hot:
                    o = (offsets[lo : hi + 1] - offsets[lo]).astype(np.int32)
                    table[f] = pa.ListArray.from_arrays(pa.array(o), pa.array(part))
                else:
                    table[f] = part
            yield table

    return write_split(root, split, shard_tables(), write_shard)
