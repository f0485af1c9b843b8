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
from typing import Any

import numpy as np
import pyarrow as pa

from ..files.atomic import check_regular, one_line, sha256_file
from .format import MANIFEST, Manifest
from .parquet import read_parquet, write_parquet

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


def read_checked(
    dataset_dir: str | os.PathLike, manifest: Manifest, columns: list[str]
) -> tuple[dict[str, Any], pa.Table, np.ndarray]:
    """The statistics ``manifest`` was built with, checked as every reader of them needs: the
    manifest records some, ``stats/counts.parquet`` is the file its ``stats_digest`` names (every
    page's CRC verified as ``columns`` are read), ``stats/summary.json`` gives every table the size
    the manifest does, and the counts hold one row per kept id.  Returns the summary's features,
    the columns read and the bounds: table j's kept ids are rows ``bounds[j]:bounds[j+1]``
    (stored in table order, ``table_size - 1`` each: the rare row is not listed)."""
    d = Path(dataset_dir)
    if manifest.stats_digest == "none":
        raise ValueError(
            f"{d / MANIFEST}: records no statistics (stats_digest none); preprocess the data "
            "again to write them"
        )
    check_regular(d / COUNTS)
    if not (d / COUNTS).is_file():
        raise FileNotFoundError(f"{d / COUNTS}: missing; preprocess the data again")
    if sha256_file(d / COUNTS) != manifest.stats_digest:
        raise ValueError(
            f"{d / COUNTS}: not the statistics {d / MANIFEST} was built with (its sha256 is not the "
            "manifest's stats_digest); preprocess the data again"
        )
    check_regular(d / SUMMARY)
    try:
        summary = json.loads((d / SUMMARY).read_text())["features"]
        sizes = [int(summary[name]["table_size"]) for name in manifest.sparse_names]
        for name in manifest.sparse_names:
            for key in ("rare_count", "rare_ids_folded"):
                int(summary[name][key])  # an integer, or the error below
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{d / SUMMARY}: not a statistics summary ({one_line(e)}); preprocess the data again"
        ) from None
    if sizes != list(manifest.table_sizes):
        raise ValueError(
            f"{d / SUMMARY}: table sizes {sizes} are not the table_sizes of {d / MANIFEST} "
            f"{manifest.table_sizes}; preprocess the data again"
        )
    table = read_parquet(d / COUNTS, columns=columns)
    bounds = np.cumsum([0, *(s - 1 for s in sizes)])
    if bounds[-1] != table.num_rows:
        raise ValueError(f"{d / COUNTS}: {table.num_rows} rows but {SUMMARY} says {bounds[-1]}")
    return summary, table, bounds


def counted_samples(manifest: Manifest) -> int:
    """The samples ``stats/counts.parquet`` counted ids in: the training split's rows.  A table's
    counts add up to this times its mean ids per sample (1 for a one-hot feature)."""
    return manifest.splits["train"].rows


def load_counts(dataset_dir: str | os.PathLike) -> dict[str, np.ndarray]:
    """Per table (the manifest's sparse names): training counts in row (rank) order, the rare
    row's count last; ``len(result[f])`` is the table's size (checked by :func:`read_checked`)."""
    manifest = Manifest.load(dataset_dir)
    summary, table, bounds = read_checked(dataset_dir, manifest, ["count"])
    counts = table.column("count").to_numpy()
    return {
        name: np.append(counts[bounds[j] : bounds[j + 1]], summary[name]["rare_count"]).astype(
            np.int64
        )
        for j, name in enumerate(manifest.sparse_names)
    }


def load_feature_stats(dataset_dir: str | os.PathLike, manifest: Manifest) -> list[FeatureStats]:
    """Each table's kept ids in row order with their counts (the manifest's sparse names), checked
    by :func:`read_checked`."""
    summary, table, bounds = read_checked(dataset_dir, manifest, ["id", "count"])
    ids, counts = table.column("id").to_numpy(), table.column("count").to_numpy()
    return [
        FeatureStats(
            ids[bounds[j] : bounds[j + 1]],
            counts[bounds[j] : bounds[j + 1]],
            int(summary[name]["rare_count"]),
            int(summary[name]["rare_ids_folded"]),
        )
        for j, name in enumerate(manifest.sparse_names)
    ]


def check_stats(dataset_dir: str | os.PathLike, manifest: Manifest) -> None:
    """Everything :func:`read_checked` checks, over every column, and more: each row's feature is
    the table its position gives it, and its ids are distinct and ranked by count."""
    d = Path(dataset_dir)
    _, table, bounds = read_checked(d, manifest, ["feature", "id", "count"])
    feature = table.column("feature").to_numpy(zero_copy_only=False)
    ids, counts = table.column("id").to_numpy(), table.column("count").to_numpy()
    for j, name in enumerate(manifest.sparse_names):
        lo, hi = bounds[j], bounds[j + 1]
        if (feature[lo:hi] != name).any():
            raise ValueError(f"{d / COUNTS}: rows {lo}..{hi - 1} are not all of table {name}")
        if len(np.unique(ids[lo:hi])) != hi - lo or (np.diff(counts[lo:hi]) > 0).any():
            raise ValueError(f"{d / COUNTS}: table {name}'s ids are repeated or not in count order")
