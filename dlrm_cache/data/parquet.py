"""Parquet as dlrm-cache writes and reads it: a CRC32 per page, written and verified.

Every parquet file dlrm-cache writes carries page checksums (:data:`PARQUET_WRITE`, by
:func:`write_parquet`) and is read back verified (:func:`read_parquet`, :func:`open_parquet`): a
flipped bit is an error naming the file (:class:`DataError`), not other values to train on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..files.atomic import check_regular, one_line

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq


# What every parquet file dlrm-cache writes carries: a CRC32 per page, verified on every read.
PARQUET_WRITE: dict[str, Any] = {"write_page_checksum": True}


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
