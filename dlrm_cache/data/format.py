"""The on-disk contract between preprocessing, the loader and the embedding cache.

A processed dataset is a directory:

    manifest.json                 Manifest below, written last (its presence marks a complete output)
    stats/counts.parquet          one row per kept id: feature (str), id (int64), count (int64),
                                  sorted by feature, then rank; rank = position within the feature
    stats/summary.json            per-feature cardinality, rare-row count, coverage of the top k% ids
    train/part-00000.parquet ...  shards: label (float32), I1..I13 (float32, log1p-transformed),
    val/part-00000.parquet ...    C1..C26 (int32 or int64 frequency ranks: 0 = hottest row)
    test/...

Every parquet file is written with a CRC32 per page and read back verified (:mod:`.parquet`); the
manifest, like every output, is written under a temporary name and renamed (:mod:`..files.atomic`).

Row r of table C_j is the r-th most frequent (hashed) id of feature j in the training split
(ties broken by the smaller id).  The last row of every table (index ``table_sizes[j] - 1``) is the
shared row for ids below ``min_count`` or never seen in training.  The GPU cache keys on these
ranks: "is this row hot?" is ``row < k``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..files.atomic import atomic_write_text, check_regular, one_line
from ..files.layout import MANIFEST as MANIFEST  # (re-exported: the dataset's marker)

if TYPE_CHECKING:
    import pyarrow.parquet as pq

SCHEMA_VERSION = 1
NUM_DENSE = 13
NUM_SPARSE = 26
DENSE_NAMES = [f"I{i}" for i in range(1, NUM_DENSE + 1)]
SPARSE_NAMES = [f"C{i}" for i in range(1, NUM_SPARSE + 1)]
LABEL = "label"
SPLITS = ("train", "val", "test")
# Empty categorical fields are a value of their own (they are frequent in some features).
MISSING_ID = -1


# Per-feature distinct values of Criteo Kaggle, as used by DLRM (../shared/criteo/README.md).
KAGGLE_CARDINALITIES = [
    1460,
    583,
    10131227,
    2202608,
    305,
    24,
    12517,
    633,
    3,
    93145,
    5683,
    8351593,
    3194,
    27,
    14992,
    5461306,
    10,
    5652,
    2173,
    4,
    7046547,
    18,
    15,
    286181,
    105,
    142572,
]


# Ids per sample of C1..C26 in MLPerf DLRM v2's synthetic multi-hot Criteo 1TB.
MLPERF_MULTI_HOT_SIZES = [
    3,
    2,
    1,
    2,
    6,
    1,
    1,
    1,
    1,
    7,
    3,
    8,
    1,
    6,
    9,
    5,
    1,
    1,
    1,
    12,
    100,
    27,
    10,
    3,
    1,
    1,
]


@dataclass
class SplitInfo:
    rows: int
    shards: list[str]  # paths relative to the dataset directory
    shard_rows: list[int]


# Manifest fields written only when set (see Manifest.save).
OPTIONAL_FIELDS = ("multi_hot", "schema_digest")


@dataclass
class Manifest:
    schema_version: int
    table_sizes: list[int]  # rows per embedding table, rare row included
    splits: dict[str, SplitInfo]
    stats_digest: str  # sha256 of stats/counts.parquet
    min_count: int
    hash_modulus: int  # 0 = none
    sources: list[str]  # raw input files, in read order
    split_spec: dict[str, Any] = field(default_factory=dict)  # how rows were assigned to splits
    bad_lines: dict[str, int] = field(default_factory=dict)  # reason -> count
    dense_names: list[str] = field(default_factory=lambda: list(DENSE_NAMES))
    sparse_names: list[str] = field(default_factory=lambda: list(SPARSE_NAMES))
    # features whose shard column is a list of ids per sample (multi-hot, any length, 0 included);
    # every other feature's column holds exactly one id per sample
    multi_hot: list[str] = field(default_factory=list)
    # sha256 of the schema the raw input was read under (schema.Schema.digest); "" for the default
    # Criteo schema.  Part of the identity: the same counts and splits read under another
    # transform or hash are other training data.
    schema_digest: str = ""

    def save(self, directory: str | os.PathLike) -> None:
        """Written without the optional fields left at their defaults (:data:`OPTIONAL_FIELDS`):
        a one-hot Criteo dataset's manifest is the same bytes it always was."""
        fields = asdict(self)
        for key in OPTIONAL_FIELDS:
            if not fields[key]:
                del fields[key]
        atomic_write_text(Path(directory) / MANIFEST, json.dumps(fields, indent=2))

    @classmethod
    def load(cls, directory: str | os.PathLike, key: str = "data.path") -> Manifest:
        """``key``: the config key that named ``directory`` (the error for a missing manifest says it)."""
        path = Path(directory) / MANIFEST
        check_regular(path)
        if not path.exists():
            raise FileNotFoundError(
                f"{path}: no manifest; run `dlrm-cache preprocess` first (or point {key} at a "
                "processed dataset directory)"
            )
        try:
            raw = json.loads(path.read_text())
            version = raw.get("schema_version")
        except (
            ValueError,
            AttributeError,
        ) as e:  # not JSON (UnicodeDecodeError is a ValueError), or not an object
            raise ValueError(
                f"{path}: not a dataset manifest ({one_line(e)}); preprocess the data again"
            ) from None
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"{path}: schema_version {version} but this dlrm-cache reads "
                f"{SCHEMA_VERSION}; preprocess the data again"
            )
        try:
            raw["splits"] = {k: SplitInfo(**v) for k, v in raw["splits"].items()}
            manifest = cls(**raw)
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(
                f"{path}: not a dataset manifest ({one_line(e)}); preprocess the data again"
            ) from None
        problem = manifest.problem()
        if problem is not None:
            raise ValueError(
                f"{path}: not a dataset manifest ({problem}); preprocess the data again"
            )
        return manifest

    def problem(self) -> str | None:
        """What is wrong with the fields' types and ranges, or None.  Every shard is a relative
        path inside the dataset directory (a manifest names only its own files)."""

        def counts(v: Any, least: int = 0) -> bool:
            return isinstance(v, list) and all(
                isinstance(x, int) and not isinstance(x, bool) and x >= least for x in v
            )

        def names(v: Any) -> bool:
            return isinstance(v, list) and all(isinstance(x, str) and x for x in v)

        if not counts(self.table_sizes, 1) or not self.table_sizes:
            return "table_sizes must be a list of integers >= 1"
        if not names(self.sparse_names) or len(self.sparse_names) != len(self.table_sizes):
            return "sparse_names must be a name per table of table_sizes"
        if not names(self.dense_names):
            return "dense_names must be a list of column names"
        if not names(self.multi_hot) or not set(self.multi_hot) <= set(self.sparse_names):
            return "multi_hot must name features of sparse_names"
        for key in ("min_count", "hash_modulus"):
            if not counts([getattr(self, key)]):
                return f"{key} must be an integer >= 0"
        for key in ("stats_digest", "schema_digest"):
            if not isinstance(getattr(self, key), str):
                return f"{key} must be a string"
        if not isinstance(self.splits, dict) or "train" not in self.splits:
            return "splits must hold a train split"
        for split, info in self.splits.items():
            if not (
                names(info.shards)
                and counts(info.shard_rows)
                and counts([info.rows])
                and len(info.shards) == len(info.shard_rows)
                and sum(info.shard_rows) == info.rows
            ):
                return f"splits.{split}: rows, shards and shard_rows do not agree"
            for rel in info.shards:
                if Path(rel).is_absolute() or ".." in Path(rel).parts:
                    return (
                        f"splits.{split}: shard {rel!r} is not a path inside the dataset directory"
                    )
        # a shard is one split's, once: listed twice it is trained on twice as often, listed in
        # two splits its rows are evaluated on after being trained on
        seen: dict[str, str] = {}
        for split, info in self.splits.items():
            for rel in info.shards:
                key = os.path.normpath(rel)
                if key in seen:
                    where = (
                        f"twice in splits.{split}"
                        if seen[key] == split
                        else f"in splits.{seen[key]} and splits.{split}"
                    )
                    return f"shard {rel!r} is listed {where}"
                seen[key] = split
        return None

    def identity(self) -> dict[str, Any]:
        """What makes two datasets the same training data (where it was built from and where it
        lies do not): a run resumes only on the dataset its checkpoint was trained on."""
        return {
            "table_sizes": self.table_sizes,
            "splits": {
                k: {"rows": v.rows, "shard_rows": v.shard_rows} for k, v in self.splits.items()
            },
            "stats_digest": self.stats_digest,
            "min_count": self.min_count,
            "hash_modulus": self.hash_modulus,
            "dense_names": self.dense_names,
            "sparse_names": self.sparse_names,
            # only where set: a one-hot Criteo dataset's identity is what it always was
            # (checkpoints record it)
            **({"multi_hot": self.multi_hot} if self.multi_hot else {}),
            **({"schema_digest": self.schema_digest} if self.schema_digest else {}),
        }

    def check_shards(self, directory: str | os.PathLike, splits: list[str]) -> str:
        """Fail now, naming the file, if a shard a run will read is missing, cut short or another file.

        Reads each shard's parquet footer only (a few KiB; a truncated file has none): its row
        count and columns must be the manifest's.  Damage inside a shard that keeps its footer is
        found when the shard is read.  Returns a digest of the footers (their sizes, offsets and
        per-column statistics): two copies of a dataset have the same, two datasets of the same
        shape (whose manifests may agree) almost surely not.
        """
        digest = hashlib.sha256()
        for split in (s for s in splits if s in self.splits):
            info = self.splits[split]
            for rel, rows in zip(info.shards, info.shard_rows):
                meta = self.check_shard(directory, rel, rows)
                digest.update(json.dumps([rel, meta.to_dict()], default=str).encode())
        return digest.hexdigest()

    def check_shard(self, directory: str | os.PathLike, rel: str, rows: int) -> pq.FileMetaData:
        """:meth:`check_shards` for the shard ``rel`` the manifest lists with ``rows`` rows: its
        parquet footer."""
        import pyarrow.parquet as pq

        path = Path(directory) / rel
        check_regular(path)
        try:
            meta = pq.read_metadata(path)
        except (OSError, ValueError) as e:  # missing, unreadable, or no parquet footer
            raise ValueError(
                f"{path}: unreadable shard ({one_line(e)}); preprocess the data again"
            ) from None
        # the arrow schema's names: a list column's parquet leaf is named 'element'
        columns = meta.schema.to_arrow_schema().names
        missing = {LABEL, *self.dense_names, *self.sparse_names} - set(columns)
        if meta.num_rows != rows or missing:
            found = f"{meta.num_rows} rows" if not missing else f"no column {sorted(missing)[0]}"
            raise ValueError(
                f"{path}: {found} but {Path(directory) / MANIFEST} says {rows} rows of "
                f"{LABEL}, I1.., C..; the shard and manifest do not match (preprocess again)"
            )
        return meta
