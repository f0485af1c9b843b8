"""Per-feature id frequency statistics: counting (pass 1 of preprocessing) and reading them back.

``stats/counts.parquet`` holds one row per kept id (feature, id, count) in rank order;
``stats/summary.json`` holds, per feature, the table size and the count of the shared rare row
(training accesses of ids folded into it), which the parquet file does not list.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from .format import (
    MANIFEST,
    SPARSE_NAMES,
    Manifest,
    one_line,
    read_parquet,
    sha256_file,
    write_parquet,
)

COUNTS = "stats/counts.parquet"
SUMMARY = "stats/summary.json"
COVERAGE_PCTS = (0.1, 1.0, 1.5, 5.0, 10.0)  # "top k% of rows" reported in the summary


def sum_by_id(ids: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge (id, count) pairs with repeated ids: sorted unique ids and their summed counts."""
    if len(ids) == 0:
        return ids, counts
    order = np.argsort(ids, kind="stable")  # timsort: fast on concatenated sorted runs
    ids, counts = ids[order], counts[order]
    starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    return ids[starts], np.add.reduceat(counts, starts)


class IdCounter:
    """Streaming id -> count for one feature in memory ~ distinct ids.

    Each batch is reduced with ``np.unique``; the partial results are merged into the running
    totals once they hold more entries than the totals (amortized, no Python loop per id).
    """

    def __init__(self) -> None:
        self.ids = np.empty(0, np.int64)
        self.counts = np.empty(0, np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_len = 0

    def add(self, values: np.ndarray) -> None:
        ids, counts = np.unique(values, return_counts=True)
        self._pending.append((ids, counts.astype(np.int64)))
        self._pending_len += len(ids)
        if self._pending_len > max(len(self.ids), 1 << 20):
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        ids = np.concatenate([self.ids, *(p[0] for p in self._pending)])
        counts = np.concatenate([self.counts, *(p[1] for p in self._pending)])
        self.ids, self.counts = sum_by_id(ids, counts)
        self._pending, self._pending_len = [], 0

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids sorted ascending, counts)."""
        self._merge()
        return self.ids, self.counts


@dataclass
class FeatureStats:
    """One feature's table: kept ids in rank order, plus the rare row."""

    ids: np.ndarray  # kept ids, rank order (count descending, then id ascending)
    counts: np.ndarray  # their training counts
    rare_count: int  # training accesses of ids below min_count (the rare row's count)
    rare_ids: int  # distinct training ids folded into the rare row

    @property
    def table_size(self) -> int:
        return len(self.ids) + 1  # the rare row always exists

    def row_counts(self) -> np.ndarray:
        """Counts in row order, rare row last."""
        return np.append(self.counts, self.rare_count)


def rank_feature(ids: np.ndarray, counts: np.ndarray, min_count: int) -> FeatureStats:
    """Order ids by (-count, id) and split off the ones below ``min_count``."""
    order = np.lexsort((ids, -counts))
    ids, counts = ids[order], counts[order]
    keep = counts >= min_count
    return FeatureStats(ids[keep], counts[keep], int(counts[~keep].sum()), int((~keep).sum()))


def coverage(row_counts: np.ndarray, pct: float) -> tuple[int, int]:
    """(accesses covered by the first ceil(pct% of rows) rows, total accesses)."""
    top = math.ceil(len(row_counts) * pct / 100)
    return int(row_counts[:top].sum()), int(row_counts.sum())


def summarize(features: dict[str, FeatureStats]) -> dict:
    """Per-feature and overall table sizes and hot-row coverage (fraction of training accesses)."""
    out: dict = {"features": {}, "coverage_pcts": list(COVERAGE_PCTS)}
    covered_all = {p: 0 for p in COVERAGE_PCTS}
    total_all = 0
    for name, fs in features.items():
        rc = fs.row_counts()
        cov = {}
        for p in COVERAGE_PCTS:
            c, total = coverage(rc, p)
            cov[f"{p:g}%"] = c / total if total else 0.0
            covered_all[p] += c
        total_all += int(rc.sum())
        out["features"][name] = {
            "table_size": fs.table_size,
            "distinct_train_ids": len(fs.ids) + fs.rare_ids,
            "rare_ids_folded": fs.rare_ids,
            "rare_count": fs.rare_count,
            "accesses": int(rc.sum()),
            "coverage": cov,
        }
    out["total"] = {
        "table_size": sum(f.table_size for f in features.values()),
        "accesses": total_all,
        "coverage": {
            f"{p:g}%": covered_all[p] / total_all if total_all else 0.0 for p in COVERAGE_PCTS
        },
    }
    return out


def format_summary(summary: dict) -> str:
    """A small fixed-width table of the summary."""
    pcts = [f"{p:g}%" for p in summary["coverage_pcts"]]
    head = f"{'feature':>7} {'rows':>10} {'rare ids':>9} " + " ".join(
        f"{'top ' + p:>9}" for p in pcts
    )
    lines = [head]
    rows = list(summary["features"].items()) + [("all", summary["total"])]
    for name, f in rows:
        cov = " ".join(f"{f['coverage'][p]:>9.3f}" for p in pcts)
        rare = f.get(
            "rare_ids_folded", sum(x["rare_ids_folded"] for x in summary["features"].values())
        )
        lines.append(f"{name:>7} {f['table_size']:>10} {rare:>9} {cov}")
    return "\n".join(lines)


def write_counts(path: Path, features: dict[str, FeatureStats]) -> None:
    """stats/counts.parquet: feature, id, count; features in C1..C26 order, rows in rank order."""
    names = np.concatenate(
        [np.full(len(fs.ids), i, np.int32) for i, fs in enumerate(features.values())]
    )
    table = pa.table(
        {
            "feature": pa.DictionaryArray.from_arrays(
                pa.array(names), pa.array(list(features))
            ).cast(pa.string()),
            "id": pa.array(np.concatenate([fs.ids for fs in features.values()]), pa.int64()),
            "count": pa.array(np.concatenate([fs.counts for fs in features.values()]), pa.int64()),
        }
    )
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write_parquet(table, tmp)
    os.replace(tmp, path)


def load_counts(dataset_dir: str | os.PathLike) -> dict[str, np.ndarray]:
    """Per feature (C1..C26): training counts in row (rank) order, the rare row's count last.

    ``len(result[f])`` equals the feature's table size in the manifest, and the file read is the
    one the manifest was built with (its ``stats_digest``).
    """
    d = Path(dataset_dir)
    manifest = Manifest.load(d)
    if sha256_file(d / COUNTS) != manifest.stats_digest:
        raise ValueError(
            f"{d / COUNTS}: not the statistics {d / MANIFEST} was built with (its sha256 is not the "
            "manifest's stats_digest); preprocess the data again"
        )
    try:
        summary = json.loads((d / SUMMARY).read_text())["features"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{d / SUMMARY}: not a statistics summary ({one_line(e)}); preprocess the data again"
        ) from None
    counts = read_parquet(d / COUNTS, columns=["count"]).column("count").to_numpy()
    # Features are stored in C1..C26 order with table_size - 1 kept ids each: slice, don't search.
    sizes = [summary[name]["table_size"] - 1 for name in SPARSE_NAMES]
    if sum(sizes) != len(counts):
        raise ValueError(f"{d / COUNTS}: {len(counts)} rows but {SUMMARY} says {sum(sizes)}")
    bounds = np.cumsum([0, *sizes])
    return {
        name: np.append(counts[bounds[j] : bounds[j + 1]], summary[name]["rare_count"]).astype(
            np.int64
        )
        for j, name in enumerate(SPARSE_NAMES)
    }
