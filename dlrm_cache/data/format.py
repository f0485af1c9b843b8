"""The on-disk contract between preprocessing, the loader and the embedding cache.

A processed dataset is a directory:

    manifest.json                 Manifest below, written last (its presence marks a complete output)
    stats/counts.parquet          one row per kept id: feature (str), id (int64), count (int64),
                                  sorted by feature, then rank; rank = position within the feature
    stats/summary.json            per-feature cardinality, rare-row count, coverage of the top k% ids
    train/part-00000.parquet ...  shards: label (float32), I1..I13 (float32, log1p-transformed),
    val/part-00000.parquet ...    C1..C26 (int32 or int64 frequency ranks: 0 = hottest row)
    test/...

Row r of table C_j is the r-th most frequent (hashed) id of feature j in the training split
(ties broken by the smaller id).  The last row of every table (index ``table_sizes[j] - 1``) is the
shared row for ids below ``min_count`` or never seen in training.  The GPU cache keys on these
ranks: "is this row hot?" is ``row < k``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

SCHEMA_VERSION = 1
NUM_DENSE = 13
NUM_SPARSE = 26
DENSE_NAMES = [f"I{i}" for i in range(1, NUM_DENSE + 1)]
SPARSE_NAMES = [f"C{i}" for i in range(1, NUM_SPARSE + 1)]
LABEL = "label"
MANIFEST = "manifest.json"
SPLITS = ("train", "val", "test")
# Empty categorical fields are a value of their own (they are frequent in some features).
MISSING_ID = -1

# Per-feature distinct values of Criteo Kaggle, as used by DLRM (../shared/criteo/README.md).
KAGGLE_CARDINALITIES = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]


@dataclass
class SplitInfo:
    rows: int
    shards: list[str]  # paths relative to the dataset directory
    shard_rows: list[int]


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

    def save(self, directory: str | os.PathLike) -> None:
        atomic_write_text(Path(directory) / MANIFEST, json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Manifest":
        path = Path(directory) / MANIFEST
        if not path.exists():
            raise FileNotFoundError(
                f"{path}: no manifest; run `dlrm-cache preprocess` first (or point data.path at a "
                "processed dataset directory)"
            )
        raw = json.loads(path.read_text())
        if raw.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(
                f"{path}: schema_version {raw.get('schema_version')} but this dlrm-cache reads "
                f"{SCHEMA_VERSION}; preprocess the data again"
            )
        raw["splits"] = {k: SplitInfo(**v) for k, v in raw["splits"].items()}
        return cls(**raw)


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success it is renamed into place (readers never
    see a half-written file), on failure removed.  Permissions follow the umask like open()'s."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
