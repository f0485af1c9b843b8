"""Raw Criteo text -> model inputs, exactly as `dlrm-cache preprocess` maps it.

Lines are parsed by preprocessing's own parser (its malformed-line policy, ``log1p`` dense values,
hex ids), ids are hashed with the dataset's ``hash_modulus`` and mapped to rows through its
frequency statistics by preprocessing's own lookup (ids below ``min_count`` or unseen in training
go to the shared last row), and bad lines go through preprocessing's bad-line log (``skip``:
counted and reported; ``fail``: the first one stops with ``path:line: reason``).  So a line
scores exactly as the same line does after `preprocess`.

A file is either labelled (40 fields, as preprocess reads) or not (39 fields: Kaggle's
``test.txt``), decided by its first non-empty line; then every line must have that width.  A
39-field line is given a placeholder label field in front and parsed as a 40-field one (its
label is then ignored), so both widths go through the same parser; messages name the file's own
field counts.  Only the line length limit counts the 2 added bytes (1 for an empty label, below).

In a labelled file, a line whose label field is empty is scored as unlabelled (inference logs
hold lines whose click is not known yet): it is parsed with a placeholder label and
:attr:`Rows.labelled` says which rows have a label of their own.  Any other label but ``0``/``1``
is a malformed line, as in preprocess.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

# The one place that knows where preprocessing's parsing and id mapping live (re-point it here).
from ..data import criteo, rawtext, tabular
from ..data.format import Manifest
from ..data.lists import Lists
from ..data.preprocess.badlines import BadLineLog
from ..data.preprocess.header import first_fields, header_problem, refuse_parquet
from ..data.preprocess.parse import bad_part, hash_ids
from ..data.schema import Schema, file_columns
from ..data.stats import FeatureStats, load_feature_stats
from ..files.atomic import one_line

LABELLED = criteo.NUM_FIELDS  # label, I1..I13, C1..C26
UNLABELLED = criteo.NUM_FIELDS - 1  # Kaggle's test.txt
_PLACEHOLDER = b"0\t"  # the label field put in front of a 39-field line
_FIELDS_DETAIL = re.compile(rf"^(\d+) fields, expected {criteo.NUM_FIELDS}$")


@dataclass
class Rows:
    """Good lines of one block, ready for the model."""

    lines: np.ndarray  # (n,) int64 1-based line numbers in the file
    labels: np.ndarray | None  # (n,) float32 0/1; None for a 39-field file
    dense: np.ndarray  # (dense features, n) float32, transformed as preprocess does
    # (sparse features, n) rows of the embedding tables (int32, int64 for tables past int32); a
    # multi-hot dataset's: every feature a jagged column of rows (one-hot ones: lists of length 1),
    # as the loader keeps a shard's (data/lists.py)
    ids: np.ndarray | Lists
    # (n,) bool: the rows whose label field was not empty (None: all of them, or no labels)
    labelled: np.ndarray | None = None


def new_bad_line_log(policy: str, max_reports: int) -> BadLineLog:
    """Preprocessing's bad-line log: ``.counts`` per reason, ``.reports`` (``path:line: why``)."""
    return BadLineLog(policy, max_reports)


BadLineError = criteo.BadLineError
InputError = rawtext.InputError


class RankLookup:
    """id -> row for one feature: its rank if kept, else the rare (last) row (the mapping
    preprocess's encoding applies through its id tables, here from the statistics directly)."""

    def __init__(self, fs: FeatureStats, dtype: np.dtype) -> None:
        import pandas as pd

        self.index = pd.Index(fs.ids)  # hash table: O(1) per lookup even for 10M-id tables
        self.rare = fs.table_size - 1
        self.dtype = dtype

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        pos = self.index.get_indexer(ids)  # position in rank order, -1 if not kept
        return np.where(pos >= 0, pos, self.rare).astype(self.dtype)


class IdMapper:
    """Raw ids (features, n) -> table rows through a dataset's statistics (preprocessing's
    lookup), after each feature's modulus (``hashes``; default: the manifest's ``hash_modulus``)."""

    def __init__(self, dataset: Path, manifest: Manifest, hashes: list[int] | None = None) -> None:
        stats = load_feature_stats(dataset, manifest)
        self.dtype = np.dtype(
            np.int32 if max(manifest.table_sizes) <= np.iinfo(np.int32).max else np.int64
        )
        self.lookups = [RankLookup(fs, self.dtype) for fs in stats]
        self.hashes = hashes or [manifest.hash_modulus] * len(self.lookups)

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        rows = np.empty(ids.shape, dtype=self.dtype)
        for j, lookup in enumerate(self.lookups):
            rows[j] = lookup(hash_ids(ids[j], self.hashes[j]))
        return rows

    def lists(self, ids: np.ndarray, lists: dict[int, tuple[np.ndarray, np.ndarray]]) -> Lists:
        """A parsed block's features as jagged columns of rows: feature ``j`` in ``lists``
        (``(values, offsets)``, as the parsers give them) has every element mapped as a one-hot
        id is; any other is ``ids[j]`` as lists of length 1 (the loader's layout of a multi-hot
        dataset, where a one-hot feature's lists have length 1)."""
        n = ids.shape[1]
        one = np.arange(n + 1, dtype=np.int64)
        offsets, values = [], []
        for j, lookup in enumerate(self.lookups):
            raw, o = lists[j] if j in lists else (ids[j], one)
            values.append(lookup(hash_ids(raw, self.hashes[j])))
            offsets.append(np.asarray(o, dtype=np.int64))
        return Lists(offsets, values)


def detect_width(path: Path) -> int:
    """:data:`LABELLED` or :data:`UNLABELLED`, from the file's first non-empty line."""
    reader, raw = rawtext.open_raw(path)
    try:
        with raw, reader:
            for number in range(1, 1001):
                line = reader.readline(rawtext.MAX_LINE_BYTES + 2)
                if not line:
                    break
                if number == 1 and line.startswith(rawtext.BOM):
                    line = line[len(rawtext.BOM) :]
                line = line.rstrip(b"\r\n")
                if not line:
                    continue
                fields = line.count(b"\t") + 1
                if fields not in (LABELLED, UNLABELLED):
                    raise InputError(
                        f"{path}:{number}: {fields} fields; a raw Criteo line has {LABELLED} "
                        f"(label, I1-I13, C1-C26) or {UNLABELLED} (no label, like Kaggle's "
                        "test.txt)"
                    )
                return fields
    except (EOFError, OSError) as e:  # a cut or corrupt gzip file (BadGzipFile is an OSError)
        raise InputError(f"{path}: truncated or corrupt gzip file ({one_line(e)})") from None
    raise InputError(f"{path}: no lines to score")


def read_rows(
    path: Path,
    width: int,
    mapper: IdMapper,
    chunk_bytes: int,
    bad: BadLineLog,
    progress: Callable[[int], None] | None = None,
) -> Iterator[Rows]:
    """The file's good lines block by block (memory ~ ``chunk_bytes``); bad lines go to ``bad``;
    ``progress`` gets the bytes of the file read so far."""
    for block in rawtext.iter_blocks(path, chunk_bytes):
        if width == LABELLED:
            data, unknown = _with_empty_labels_filled(block.data, block.first_line)
        else:
            data, unknown = _with_placeholder_label(block.data, block.first_line), None
        parsed = criteo.parse_block(data, block.first_line, block.num_lines)
        if width == UNLABELLED:
            parsed.bad_details = [_unlabelled_detail(d) for d in parsed.bad_details]
        bad.add(path, bad_part(parsed, bad.max_reports), 0)
        labelled = None
        if unknown is not None and len(unknown):
            labelled = ~np.isin(parsed.lines - block.first_line, unknown)
        yield Rows(
            parsed.lines + 1,
            parsed.label if width == LABELLED else None,
            parsed.dense,
            mapper(parsed.ids),
            labelled,
        )
        if progress is not None:
            progress(block.bytes_read)


def _with_placeholder_label(data: bytes, first_line: int) -> bytes:
    """Every line of the block with ``0<TAB>`` in front (a file's byte order mark dropped first)."""
    if first_line == 0 and data.startswith(rawtext.BOM):
        data = data[len(rawtext.BOM) :]
    out = _PLACEHOLDER + data.replace(b"\n", b"\n" + _PLACEHOLDER)
    return out[: -len(_PLACEHOLDER)] if data.endswith(b"\n") else out


def _with_empty_labels_filled(data: bytes, first_line: int) -> tuple[bytes, np.ndarray]:
    """The block with a placeholder ``0`` in every empty label field (a line starting with a tab),
    and those lines' indices in the block (a file's byte order mark dropped first)."""
    if first_line == 0 and data.startswith(rawtext.BOM):
        data = data[len(rawtext.BOM) :]
    if not data.startswith(b"\t") and b"\n\t" not in data:  # the usual block: a byte scan
        return data, np.empty(0, np.int64)
    raw = np.frombuffer(data, dtype=np.uint8)
    starts = np.concatenate([[0], np.flatnonzero(raw == ord("\n")) + 1])
    starts = starts[starts < len(raw)]
    empty = np.flatnonzero(raw[starts] == ord("\t"))
    if not len(empty):
        return data, empty
    return np.insert(raw, starts[empty], ord(_PLACEHOLDER[:1])).tobytes(), empty


def _unlabelled_detail(detail: str) -> str:
    """A field-count message of a placeholder-labelled line, in the file's own counts."""
    m = _FIELDS_DETAIL.match(detail)
    if not m:
        return detail
    return f"{int(m[1]) - 1} fields, expected {UNLABELLED}"


# ------------------------------------------------------------------------ other schemas' raw input
def input_schema(path: Path, schema: Schema) -> tuple[Schema, bool]:
    """The dataset's schema as this input file lays it out, and whether it has the label column:
    a text file's header (or field count: the schema's columns, or all but the label) decides."""
    s = replace(schema, columns=list(schema.columns))
    if s.format == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return s, s.label in pq.ParquetFile(path).schema_arrow.names
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(
                f"{path}: not a parquet file, the dataset's format ({one_line(e)})"
            ) from None
    first = first_fields(path, s.delimiter)
    if s.header:
        problem = header_problem(first, [n for n in [s.label, *s.dense, *s.sparse]
                                         if n != s.label or n in first])  # fmt: skip
        if problem:
            raise InputError(f"{path}:1: {problem}")
        s.columns = first
        return s, s.label in first
    refuse_parquet(path, s.format)
    columns = file_columns(s)
    if len(first) == len(columns) - 1:
        s.columns = [c for c in columns if c != s.label]
        return s, False
    return s, True


def _named(path: Path, blocks: Iterator[tuple[Any, int]]) -> Iterator[tuple[Any, int]]:
    """``blocks``, with a column-level :class:`InputError` naming ``path`` (as preprocess's)."""
    try:
        yield from blocks
    except InputError as e:
        if str(e).startswith(str(path)):
            raise
        raise InputError(f"{path}: {e}") from None


def read_schema_rows(
    path: Path,
    schema: Schema,
    labelled: bool,
    mapper: IdMapper,
    chunk_bytes: int,
    bad: BadLineLog,
    progress: Callable[[int], None] | None = None,
) -> Iterator[Rows]:
    """As :func:`read_rows`, for an input of the dataset's own schema, or Criteo's layout with
    multi-hot columns (preprocess's own parsers).  A multi-hot dataset's rows hold every feature as
    a jagged column (:meth:`IdMapper.lists`), as the loader reads the processed shards."""
    if schema.format == "parquet":
        batches = tabular.iter_parquet(path, max(1, chunk_bytes // 256), schema, True)
        parsed_blocks = ((tabular.parse_parquet(t, first, schema), 0) for t, first in batches)
    else:
        parsed_blocks = (
            (tabular.parse_text(b.data, b.first_line, b.first_line == 0, schema), b.bytes_read)
            for b in rawtext.iter_blocks(path, chunk_bytes)
        )
    for parsed, read in _named(path, parsed_blocks):
        bad.add(path, bad_part(parsed, bad.max_reports), 0)
        for i, name in enumerate(schema.dense):
            if name in schema.moments:
                parsed.dense[i] = tabular.standardized(parsed.dense[i], schema.moments[name])
        ids = mapper.lists(parsed.ids, parsed.lists) if schema.multi_hot else mapper(parsed.ids)
        yield Rows(parsed.lines + 1, parsed.label if labelled else None, parsed.dense, ids)
        if progress is not None and read:
            progress(read)
