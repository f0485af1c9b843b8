"""Pass 1b: per-feature id counts over the training rows, merged and ranked per feature.

Counting reads the parsed parts (never the text): a worker counts a contiguous group of parts with
one :class:`..stats.IdCounter` per feature and writes its partial (ids, counts) per feature.  The
merge of feature f sums every group's partial (so the counts, and with them the ranks, are the
same however the parts were grouped), ranks the ids (count descending, id ascending) and writes
the feature's ranked ids and its id -> row table (:mod:`.idtable`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..format import NUM_SPARSE, SPLITS
from ..stats import FeatureStats, IdCounter, rank_feature, sum_by_id
from . import idtable, moments
from .parse import load_column
from .splits import SplitPlan


@dataclass(frozen=True)
class PartSpan:
    """A parsed part and where its lines sit: its file, its first line in the file, and the
    file's first line among all files."""

    prefix: str
    file: int
    file_line: int  # file-local index of the part's first line
    global_line: int  # index of the file's first data line among all files' data lines


def split_rows(plan: SplitPlan, span: PartSpan) -> list[int]:
    """Rows of each split in the part, in SPLITS order (they are consecutive, train first)."""
    lines = np.asarray(load_column(span.prefix, "lines")).astype(np.int64) + span.file_line
    codes = plan.codes(span.file, span.global_line, lines)
    if len(codes) > 1 and (np.diff(codes) < 0).any():
        raise RuntimeError(f"internal: splits not consecutive in {span.prefix}")
    return [int(n) for n in np.bincount(codes, minlength=len(SPLITS))]


def count_group(
    plan: SplitPlan,
    spans: list[PartSpan],
    out: str,
    multi: tuple[bool, ...] = (False,) * NUM_SPARSE,
    standardize: tuple[int, ...] = (),
) -> tuple[list[list[int]], float, list[moments.Sums]]:
    """Count the training ids of a group of parts (``multi[j]``: feature j is multi-hot, every
    list element counts); write ``out.f{j}.{ids,counts}.npy`` per feature.  Returns each part's
    rows per split, the seconds spent and the exact sums of the ``standardize`` dense columns
    (indices) over the training rows."""
    t0 = time.process_time()
    counters = [IdCounter() for _ in multi]
    sums = [moments.exact_sums(np.empty(0, np.float32)) for _ in standardize]
    rows = []
    for span in spans:
        per_split = split_rows(plan, span)
        rows.append(per_split)
        n_train = per_split[0]
        if n_train:
            dense = load_column(span.prefix, "dense")
            for k, i in enumerate(standardize):
                sums[k] = moments.add(sums[k], moments.exact_sums(dense[i, :n_train]))
            ids = load_column(span.prefix, "ids")[:, :n_train]
            for j, c in enumerate(counters):
                c.add(list_values(span.prefix, j, 0, n_train) if multi[j] else np.asarray(ids[j]))
    for j, c in enumerate(counters):
        ids, counts = c.result()
        np.save(f"{out}.f{j:02d}.ids.npy", ids)
        np.save(f"{out}.f{j:02d}.counts.npy", counts)
    return rows, time.process_time() - t0, sums


def list_values(prefix: str, j: int, start: int, stop: int) -> np.ndarray:
    """Multi-hot feature j's values of a part's rows [start, stop)."""
    offsets = load_column(prefix, f"mh{j:02d}.offsets")
    return np.asarray(load_column(prefix, f"mh{j:02d}.values")[offsets[start] : offsets[stop]])


# Partial counts are cut into buckets by id value, so merging one bucket holds ~1/buckets of every
# group's partial: a merge job's memory stays ~ distinct ids x 16 B whatever the number of groups.
_ID_LOW = -1  # MISSING_ID; the high end is the schema's id_high (Criteo: 8 hex digits)


def bucket_bounds(buckets: int, id_high: int = 1 << 32) -> np.ndarray:
    """Id values where buckets start (evenly spaced: ids are hashes)."""
    return np.linspace(_ID_LOW, id_high, buckets + 1)[1:-1].astype(np.int64)


def merge_bucket(
    j: int, b: int, buckets: int, groups: list[str], out: str, id_high: int = 1 << 32
) -> float:
    """Sum every group's counts of feature j's ids in bucket b; writes ``out`` (sorted ids)."""
    t0 = time.process_time()
    inner = bucket_bounds(buckets, id_high)
    ids_parts, count_parts = [], []
    for g in groups:
        ids = np.load(f"{g}.f{j:02d}.ids.npy", mmap_mode="r")
        lo = int(np.searchsorted(ids, inner[b - 1])) if b > 0 else 0
        hi = int(np.searchsorted(ids, inner[b])) if b < buckets - 1 else len(ids)
        ids_parts.append(np.asarray(ids[lo:hi]))
        count_parts.append(np.asarray(np.load(f"{g}.f{j:02d}.counts.npy", mmap_mode="r")[lo:hi]))
    ids, counts = sum_by_id(np.concatenate(ids_parts), np.concatenate(count_parts))
    np.save(f"{out}.ids.npy", ids)
    np.save(f"{out}.counts.npy", counts)
    return time.process_time() - t0


@dataclass
class Ranked:
    """A feature's ranking (its arrays are on disk under its prefix)."""

    kept: int
    rare_count: int
    rare_ids: int
    seconds: float


def rank(j: int, merged: list[str], min_count: int, hash_modulus: int, prefix: str) -> Ranked:
    """Rank feature j's merged buckets; write its stats and its id -> row table."""
    t0 = time.process_time()
    ids = np.concatenate([np.load(f"{m}.ids.npy") for m in merged])  # buckets: ascending, disjoint
    counts = np.concatenate([np.load(f"{m}.counts.npy") for m in merged])
    fs = rank_feature(ids, counts, min_count)
    np.save(f"{prefix}.ids.npy", fs.ids)
    np.save(f"{prefix}.counts.npy", fs.counts)
    rows = np.arange(len(fs.ids), dtype=np.int64)
    idtable.build(f"{prefix}.table", fs.ids, rows, fs.table_size - 1, hash_modulus)
    return Ranked(len(fs.ids), fs.rare_count, fs.rare_ids, time.process_time() - t0)


def load_stats(prefix: str, r: Ranked) -> FeatureStats:
    return FeatureStats(
        np.load(f"{prefix}.ids.npy"), np.load(f"{prefix}.counts.npy"), r.rare_count, r.rare_ids
    )


def feature_prefix(work: Path, j: int) -> str:
    return str(work / f"feature-{j:02d}")
