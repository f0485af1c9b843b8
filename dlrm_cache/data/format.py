"""The on-disk contract between preprocessing, the loader and the embedding cache.

A processed dataset is a directory:

    manifest.json                 Manifest below, written last (its presence marks a complete output)
    stats/counts.parquet          one row per kept id: feature (str), id (int64), count (int64),
                                  sorted by feature, then rank; rank = position within the feature
    stats/summary.json            per-feature cardinality, rare-row count, coverage of the top k% ids
    train/part-00000.parquet ...  shards: label (float32), I1..I13 (float32, log1p-transformed),
    val/part-00000.parquet ...    C1..C26 (int32 or int64 frequency ranks: 0 = hottest row)
    test/...

Every parquet file is written with a CRC32 per page (:data:`PARQUET_WRITE`, by :func:`write_parquet`)
and read back verified (:func:`read_parquet`, :func:`open_parquet`): a flipped bit is an error
naming the file, not other values to train on.

Row r of table C_j is the r-th most frequent (hashed) id of feature j in the training split
(ties broken by the smaller id).  The last row of every table (index ``table_sizes[j] - 1``) is the
shared row for ids below ``min_count`` or never seen in training.  The GPU cache keys on these
ranks: "is this row hot?" is ``row < k``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..layout import MANIFEST as MANIFEST  # (re-exported: the dataset's marker)

if TYPE_CHECKING:
    import pyarrow as pa
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

# What every parquet file dlrm-cache writes carries: a CRC32 per page, verified on every read.
PARQUET_WRITE: dict[str, Any] = {"write_page_checksum": True}

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
        for key in ("min_count", "hash_modulus"):
            if not counts([getattr(self, key)]):
                return f"{key} must be an integer >= 0"
        if not isinstance(self.stats_digest, str):
            return "stats_digest must be a string"
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
        missing = {LABEL, *self.dense_names, *self.sparse_names} - set(meta.schema.names)
        if meta.num_rows != rows or missing:
            found = f"{meta.num_rows} rows" if not missing else f"no column {sorted(missing)[0]}"
            raise ValueError(
                f"{path}: {found} but {Path(directory) / MANIFEST} says {rows} rows of "
                f"{LABEL}, I1.., C..; the shard and manifest do not match (preprocess again)"
            )
        return meta


def write_parquet(table: pa.Table, path: str | os.PathLike, **options: Any) -> None:
    """``pq.write_table`` with :data:`PARQUET_WRITE` (page checksums); ``options``: compression,
    row groups, ... (the caller writes to a temporary name and renames it)."""
    import pyarrow.parquet as pq

    pq.write_table(table, path, **PARQUET_WRITE, **options)


class DataError(ValueError):
    """A dataset file that is damaged or not what the manifest says: the message names it."""


def open_parquet(path: str | os.PathLike) -> pq.ParquetFile:
    """A parquet file whose pages are checked against their CRC32 as they are read.  Errors, here
    and in the reads of the returned file, are turned into :class:`DataError` by :func:`read_errors`."""
    import pyarrow.parquet as pq

    check_regular(path)
    with read_errors(path):
        return pq.ParquetFile(path, page_checksum_verification=True)


def read_parquet(path: str | os.PathLike, columns: list[str] | None = None) -> pa.Table:
    """The whole file (or ``columns``), every page verified; damage is a :class:`DataError`."""
    with read_errors(path):
        return open_parquet(path).read(columns=columns)


@contextmanager
def read_errors(path: str | os.PathLike) -> Iterator[None]:
    """A failed read, checksum or decode of the parquet file ``path`` as one line naming it.

    A missing or unreadable file stays the OSError it is (its message names the file); anything
    pyarrow reports about the content (a CRC mismatch is an OSError there, a bad footer an
    ArrowInvalid, a decompressor failure either) becomes a :class:`DataError`.
    """
    import pyarrow as pa

    try:
        yield
    except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError) as e:
        raise type(e)(e.errno, f"{path}: {e.strerror}") from None
    except DataError:
        raise
    except (OSError, ValueError, pa.ArrowException) as e:  # ArrowInvalid is a ValueError
        raise DataError(
            f"{path}: damaged or not a parquet file ({one_line(e)[:200]}); "
            "preprocess the data again (`dlrm-cache verify` checks a whole dataset)"
        ) from None


def write_shard(table: Any, path: str | os.PathLike) -> None:
    """Write one shard (a pyarrow Table with the columns above) under a temporary name, then
    rename it into place.  Every shard of a dataset is written by this function."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    # lz4 without dictionary pages: ~3x faster to write than the defaults, ~30% larger.
    write_parquet(
        table, tmp, row_group_size=table.num_rows, compression="lz4", use_dictionary=False
    )
    os.replace(tmp, path)


class WriteError(OSError):
    """An output that could not be written (disk full, quota, file size limit): the message names
    it and says what was kept."""


def one_line(e: BaseException) -> str:
    """An exception's message on one line (for errors that name a file)."""
    return " ".join(str(e).split()) or type(e).__name__


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


def to_json(
    obj: Any, indent: int | None = None, default: Callable[[Any], Any] | None = None
) -> str:
    """JSON any parser reads (Python's ``json`` writes a bare ``NaN`` otherwise): a non-finite
    float (the AUC of no samples, a rate over no time, a diverged loss) is written as ``null``."""

    def plain(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x

    fallback = None if default is None else (lambda x: plain(default(x)))
    return json.dumps(plain(obj), indent=indent, default=fallback, allow_nan=False)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def replace_dir(new: str | os.PathLike, final: str | os.PathLike) -> None:
    """Move the complete directory ``new`` to ``final``, replacing what was there.

    A kill at any point leaves a complete directory at ``final``, or (between the two renames) the
    old one at :func:`aside_path` that :func:`recover_dir` puts back: the old directory is moved
    aside, the new one renamed in, and only then the old one deleted.
    """
    new, final = Path(new), Path(final)
    fsync_path(new)  # its entries are on the disk before it is renamed in
    recover_dir(final)
    aside = aside_path(final)
    if final.exists():
        final.rename(aside)
    new.rename(final)
    fsync_path(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def aside_path(final: str | os.PathLike) -> Path:
    """Where :func:`replace_dir` keeps the old directory while the new one is renamed in."""
    final = Path(final)
    return final.parent / f".{final.name}.old"


def recover_dir(final: str | os.PathLike) -> None:
    """Finish what a killed :func:`replace_dir` left: the old directory back if the new one never
    arrived, else the rest of the old one removed."""
    final, aside = Path(final), aside_path(final)
    if not aside.exists():
        return
    if final.exists():
        shutil.rmtree(aside)
    else:
        aside.rename(final)


def resolve_path(path: str | os.PathLike, key: str) -> Path:
    """``path`` made absolute with every link followed; a link loop (Python 3.11 raises
    RuntimeError for one) is a ValueError naming the config ``key``."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as e:
        raise ValueError(f"{key}={path}: cannot be resolved ({one_line(e)})") from None


def check_regular(path: str | os.PathLike) -> None:
    """Raise ValueError naming ``path`` when it is a FIFO, a device or a socket (through links):
    reading one may wait forever for a writer or never end (``/dev/zero``), where a stop signal
    that only sets a flag cannot end it.  A missing file or a directory is left to the read that
    follows (its error names the file)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise ValueError(f"{path}: {kind}, not a regular file; point it at the file itself")


def sha256_file(path: str | os.PathLike) -> str:
    check_regular(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
    return h.hexdigest()


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a written file, or a directory's entries, to the disk (a rename must not be able to
    outlive what it renames)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
