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
from ..stats import FeatureStats, IdCounter, sum_by_id, rank_feature
from . import idtable
from .parse import load_column
from .splits import SplitPlan


@dataclass(frozen=True)
class PartSpan:
    """A parsed part and where its lines sit: its file and its first line in file and in all files."""

    prefix: str
    file: int
    file_line: int  # file-local index of the part's first line
    global_line: int  # index of the file's first line among all files


def split_rows(plan: SplitPlan, span: PartSpan) -> list[int]:
    """Rows of each split in the part, in SPLITS order (they are consecutive, train first)."""
    lines = np.asarray(load_column(span.prefix, "lines")) + span.file_line
    codes = plan.codes(span.file, span.global_line, lines)
    if len(codes) > 1 and (np.diff(codes) < 0).any():
        raise RuntimeError(f"internal: splits not consecutive in {span.prefix}")
    return [int(n) for n in np.bincount(codes, minlength=len(SPLITS))]


def count_group(plan: SplitPlan, spans: list[PartSpan], out: str) -> tuple[list[list[int]], float]:
    """Count the training ids of a group of parts; write ``out.f{j}.{ids,counts}.npy`` per feature.
    Returns each part's rows per split and the seconds spent."""
    t0 = time.process_time()
    counters = [IdCounter() for _ in range(NUM_SPARSE)]
    rows = []
    for span in spans:
        per_split = split_rows(plan, span)
        rows.append(per_split)
        n_train = per_split[0]
        if n_train:
            ids = load_column(span.prefix, "ids")[:, :n_train]
            for j, c in enumerate(counters):
                c.add(np.asarray(ids[j]))
    for j, c in enumerate(counters):
        ids, counts = c.result()
        np.save(f"{out}.f{j:02d}.ids.npy", ids)
        np.save(f"{out}.f{j:02d}.counts.npy", counts)
    return rows, time.process_time() - t0


@dataclass
class Ranked:
    """A feature's merge result (its arrays are on disk under ``prefix``)."""

    kept: int
    rare_count: int
    rare_ids: int
    seconds: float


def merge_feature(j: int, groups: list[str], min_count: int, hash_modulus: int, prefix: str) -> Ranked:
    """Sum feature j's partial counts, rank them, write its stats and id -> row table."""
    t0 = time.process_time()
    ids = np.concatenate([np.load(f"{g}.f{j:02d}.ids.npy") for g in groups])
    counts = np.concatenate([np.load(f"{g}.f{j:02d}.counts.npy") for g in groups])
    fs = rank_feature(*sum_by_id(ids, counts), min_count)
    np.save(f"{prefix}.ids.npy", fs.ids)
    np.save(f"{prefix}.counts.npy", fs.counts)
    rows = np.arange(len(fs.ids), dtype=np.int64)
    idtable.build(f"{prefix}.table", fs.ids, rows, fs.table_size - 1, hash_modulus)
    return Ranked(len(fs.ids), fs.rare_count, fs.rare_ids, time.process_time() - t0)


def load_stats(prefix: str, r: Ranked) -> FeatureStats:
    return FeatureStats(np.load(f"{prefix}.ids.npy"), np.load(f"{prefix}.counts.npy"), r.rare_count, r.rare_ids)


def feature_prefix(work: Path, j: int) -> str:
    return str(work / f"feature-{j:02d}")
