"""Pass 2: parsed parts -> frequency-ranked parquet shards, one shard per job.

Each split is one stream of rows: its rows of every part, in read order.  Shard k of a split holds
stream rows [k * rows_per_shard, (k + 1) * rows_per_shard), so a shard's contents depend on the
data and ``rows_per_shard`` only, never on how the work was divided; a job gathers its rows from
the parts they lie in (memory-mapped), maps ids to rows through the features' tables and writes
the shard through :func:`..format.write_shard`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..format import LABEL, SPLITS
from ..schema import Schema
from ..tabular import standardized
from .count import list_values
from .errors import PreprocessError
from .idtable import IdTable
from .parse import load_column


@dataclass(frozen=True)
class Piece:
    prefix: str  # the part's column files
    start: int  # rows [start, stop) of the part
    stop: int


@dataclass(frozen=True)
class ShardJob:
    rel: str  # e.g. "train/part-00000.parquet"
    pieces: tuple[Piece, ...]

    @property
    def rows(self) -> int:
        return sum(p.stop - p.start for p in self.pieces)


def plan_shards(
    parts: list[str], split_rows: list[list[int]], rows_per_shard: int
) -> dict[str, list[ShardJob]]:
    """Per split, its shards and where their rows lie (``split_rows[p]``: part p's rows per
    split)."""
    out: dict[str, list[ShardJob]] = {}
    for s, split in enumerate(SPLITS):
        jobs: list[ShardJob] = []
        pieces: list[Piece] = []
        room = rows_per_shard
        for prefix, per_split in zip(parts, split_rows):
            start = sum(per_split[:s])
            stop = start + per_split[s]
            while start < stop:
                take = min(room, stop - start)
                pieces.append(Piece(prefix, start, start + take))
                start += take
                room -= take
                if room == 0:
                    jobs.append(ShardJob(f"{split}/part-{len(jobs):05d}.parquet", tuple(pieces)))
                    pieces, room = [], rows_per_shard
        if pieces:
            jobs.append(ShardJob(f"{split}/part-{len(jobs):05d}.parquet", tuple(pieces)))
        out[split] = jobs
    return out


class Encoder:
    """The features' id -> row tables of one dataset (memory-mapped once per worker), and the
    schema's column names, multi-hot features and standardize moments."""

    def __init__(self, tables: list[str], table_sizes: list[int], schema: Schema) -> None:
        self.tables = [IdTable(t, n - 1) for t, n in zip(tables, table_sizes)]
        self.dtype = np.dtype(np.int64 if max(table_sizes) > np.iinfo(np.int32).max else np.int32)
        self.schema = schema
        self.multi = schema.multi_hot_mask()

    def shard(
        self, job: ShardJob, root: Path, write: Callable[[pa.Table, Path], None]
    ) -> dict[str, float]:
        """Build and write one shard; returns seconds spent reading parts, encoding and writing."""
        t0 = time.process_time()
        cols = {}
        for name in ("label", "dense", "ids"):
            arrs = [load_column(p.prefix, name)[..., p.start : p.stop] for p in job.pieces]
            cols[name] = np.concatenate(arrs, axis=-1) if len(arrs) > 1 else np.array(arrs[0])
        t1 = time.process_time()
        s = self.schema
        table_cols = {LABEL: pa.array(cols["label"])}
        for i, name in enumerate(s.dense):
            table_cols[name] = pa.array(self._dense(name, cols["dense"][i]))
        for j, (name, table) in enumerate(zip(s.sparse, self.tables)):
            table_cols[name] = self._list(job, j, table) if self.multi[j] else self._one(cols, j)
        t2 = time.process_time()
        write(pa.table(table_cols), root / job.rel)
        return {"read": t1 - t0, "encode": t2 - t1, "write": time.process_time() - t2}

    def _one(self, cols: dict, j: int) -> pa.Array:
        rows = np.empty(cols["ids"].shape[1], dtype=self.dtype)
        self.tables[j].lookup(cols["ids"][j], rows)
        return pa.array(rows)

    def _list(self, job: ShardJob, j: int, table: IdTable) -> pa.Array:
        """Feature j's lists of the job's rows: list<int32> (int64 like scalar columns)."""
        values = [list_values(p.prefix, j, p.start, p.stop) for p in job.pieces]
        lengths = [
            np.diff(load_column(p.prefix, f"mh{j:02d}.offsets")[p.start : p.stop + 1])
            for p in job.pieces
        ]
        ids = np.concatenate(values) if values else np.empty(0, np.int64)
        if len(ids) > np.iinfo(np.int32).max:  # a parquet list's offsets are int32
            raise PreprocessError(
                f"{job.rel}: {len(ids):,} ids of {self.schema.sparse[j]} in one shard; "
                "lower rows_per_shard"
            )
        rows = np.empty(len(ids), dtype=self.dtype)
        table.lookup(ids, rows)
        offsets = np.concatenate(([0], np.cumsum(np.concatenate(lengths)))).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(rows))

    def _dense(self, name: str, x: np.ndarray) -> np.ndarray:
        """A ``standardize`` column's (x - mean) / std (float64, then float32); others as parsed."""
        if name not in self.schema.moments:
            return x
        return standardized(x, self.schema.moments[name])
