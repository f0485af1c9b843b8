"""Reading raw data of any schema (:mod:`.schema`) but the default Criteo one: TSV/CSV text blocks
and parquet batches -> :class:`.criteo.Parsed` (feature order of the schema).

Policy, per line (text) or row (parquet); acceptance is a property of the line alone, and the
first failing check names its reason:

* ``"line too long"`` (text): more than :data:`.rawtext.MAX_LINE_BYTES` bytes;
* ``"wrong field count"`` (text): not the file's number of fields (an empty line, a cut line), or
  an unbalanced ``"`` (CSV; a quoted field never spans lines);
* ``"label not 0/1"``: the label is empty/null or anything but 0 or 1;
* ``"non-number in a dense field"``: a dense value that is not a finite decimal number
  (``[+-]digits[.digits][e[+-]digits]``; empty/null is 0), or whose float32 value after the
  column's transform is not finite (``1e39`` under ``none``: the shards hold float32);
* ``"empty id in a list"``: a multi-hot field with an empty element (``a||b``) or a null element;
* ``format: criteo`` with multi-hot columns reads through here too: its ids must be 1-8 hex
  digits (``"categorical not 1-8 hex digits"``), its dense values are numbers as above.

Dense values: empty -> 0, then the column's transform (``log1p``: ``log(1 + max(x, 0))``; ``none``;
``standardize``: kept raw here, standardized by the encoder with the training split's moments).
With ``header: true`` the first line of each file is the header: neither a row nor a bad line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..embedding.jagged import starts, take_lists
from . import criteo, rawtext
from .format import MISSING_ID
from .schema import LIST_SEPARATOR, Schema, file_columns, fnv1a, int_ids

BAD_NUMBER = "non-number in a dense field"
BAD_LIST = "empty id in a list"
REASONS = (criteo.BAD_LONG, criteo.BAD_FIELDS, criteo.BAD_LABEL, BAD_NUMBER, criteo.BAD_HEX,
           BAD_LIST)  # fmt: skip
_NUMBER = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"


class _Rows:
    """Per-row reasons (first failing check wins) and details while a block is checked."""

    def __init__(self, n: int) -> None:
        self.reason = np.full(n, -1, dtype=np.int8)  # REASONS index, -1: good so far
        self.detail: dict[int, str] = {}

    def fail(self, mask: np.ndarray, reason: str, detail: Any = None) -> None:
        new = np.flatnonzero(mask & (self.reason < 0))
        self.reason[new] = REASONS.index(reason)
        for r in new:
            self.detail[int(r)] = detail(int(r)) if callable(detail) else str(detail or "")


def parse_text(data: bytes, first_line: int, at_file_start: bool, s: Schema) -> criteo.Parsed:
    """Parse one block of whole text lines under schema ``s``."""
    if data.startswith(rawtext.BOM):
        data = data[len(rawtext.BOM) :] if at_file_start else b"\0" + data[1:]
    data = rawtext.normalize_line_ends(data)
    if not data.endswith(b"\n"):
        data += b"\n"
    columns = file_columns(s)
    data, rows, skip = _blank_shapes(data, len(columns), s, at_file_start)
    table = _read_text(data, columns, s.format == "csv")
    if table.num_rows != len(rows.reason):
        raise RuntimeError(f"internal: {table.num_rows} rows from {len(rows.reason)} lines")
    shaped = rows.reason >= 0
    if s.label in columns:
        label = _text_label(table.column(s.label).combine_chunks(), s.label, rows, shaped | skip)
    else:  # unlabelled input (predict): every label 0
        label = np.zeros(table.num_rows, dtype=np.float32)
    return _finish(table, label, rows, skip, first_line, s, _text_dense, _text_sparse)


def _read_text(data: bytes, columns: list[str], quoted: bool) -> pa.Table:
    return pacsv.read_csv(
        pa.BufferReader(data),
        read_options=pacsv.ReadOptions(column_names=columns, block_size=4 << 20),
        parse_options=pacsv.ParseOptions(
            delimiter="," if quoted else "\t",
            quote_char='"' if quoted else False,
            ignore_empty_lines=False,
        ),  # fmt: skip
        convert_options=pacsv.ConvertOptions(
            column_types={n: pa.binary() for n in columns},
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        ),
    )


def _blank_shapes(
    data: bytes, n_fields: int, s: Schema, at_file_start: bool
) -> tuple[bytes, _Rows, np.ndarray]:
    """Empty every line that cannot be a row (too long, wrong field count, unbalanced quotes,
    the header): the block then parses one row per line.  Returns the block, the rows' reasons so
    far, and the mask of header rows (skipped silently)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(arr == 10)
    starts = np.concatenate(([0], ends[:-1] + 1))
    delim = np.flatnonzero(arr == ord(s.delimiter))
    if s.format == "csv":
        quotes = np.concatenate(([0], np.cumsum(arr == ord('"'))))
        delim = delim[(quotes[delim] - quotes[starts[np.searchsorted(ends, delim)]]) % 2 == 0]
        odd = (quotes[ends] - quotes[starts]) % 2 == 1
    else:
        odd = np.zeros(len(ends), dtype=bool)
    fields = np.searchsorted(delim, ends) - np.searchsorted(delim, starts) + 1
    length = ends - starts
    rows = _Rows(len(ends))
    skip = np.zeros(len(ends), dtype=bool)
    skip[:1] = s.header and at_file_start
    rows.fail(~skip & (length > rawtext.MAX_LINE_BYTES), criteo.BAD_LONG,
              f"more than {rawtext.MAX_LINE_BYTES} bytes")  # fmt: skip
    bad = ~skip & ((fields != n_fields) | odd)
    rows.fail(bad, criteo.BAD_FIELDS, lambda r: "empty line" if length[r] == 0 else
              "unbalanced quote" if odd[r] else f"{fields[r]} fields, expected {n_fields}")  # fmt: skip
    blank = skip | (rows.reason >= 0)
    if not blank.any():
        return data, rows, skip
    delta = np.zeros(len(arr) + 1, dtype=np.int64)
    delta[starts[blank]] += 1
    delta[ends[blank]] -= 1
    return arr[np.cumsum(delta[:-1]) == 0].tobytes(), rows, skip


def _text_label(col: pa.Array, name: str, rows: _Rows, ignore: np.ndarray) -> np.ndarray:
    one = pc.fill_null(pc.equal(col, pa.scalar(b"1", pa.binary())), False).to_numpy(
        zero_copy_only=False
    )
    zero = pc.fill_null(pc.equal(col, pa.scalar(b"0", pa.binary())), False).to_numpy(
        zero_copy_only=False
    )
    rows.fail(~(one | zero) & ~ignore, criteo.BAD_LABEL, lambda r: f"{name}={_text(col, r)}")
    return one.astype(np.float32)


def _text(col: pa.Array, r: int) -> str:
    v = col[r].as_py()
    return repr(v.decode("utf-8", "replace") if isinstance(v, bytes) else "")


def _text_dense(col: pa.Array, name: str, rows: _Rows) -> np.ndarray:
    """float64 values (empty -> 0); bad numbers fail their row."""
    ok = pc.fill_null(pc.match_substring_regex(col, _NUMBER), True).to_numpy(zero_copy_only=False)
    rows.fail(~ok, BAD_NUMBER, lambda r: f"{name}={_text(col, r)}")
    col = pc.if_else(pa.array(ok), col, pa.scalar(None, pa.binary()))
    try:
        x = pc.cast(pc.cast(col, pa.string()), pa.float64())
    except pa.ArrowInvalid:  # a form pyarrow refuses: Python's float takes every matched value
        x = pa.array([None if v is None else float(v) for v in col.to_pylist()], pa.float64())
    values = pc.fill_null(x, 0.0).to_numpy(zero_copy_only=False)
    rows.fail(~np.isfinite(values), BAD_NUMBER, lambda r: f"{name}={_text(col, r)}")
    return values


def _text_sparse(col: pa.Array, name: str, multi: bool, s: Schema, rows: _Rows):
    """One-hot: (n,) int64 ids; multi-hot: (values, offsets)."""
    if not multi:
        return _text_ids(col, name, s, rows, None, col)
    field = col
    col = pc.fill_null(col, b"")
    lists = pc.split_pattern(col, LIST_SEPARATOR)
    empty = pc.equal(pc.binary_length(col), 0).to_numpy(zero_copy_only=False)
    lengths = np.where(empty, 0, pc.list_value_length(lists).to_numpy(zero_copy_only=False))
    flat = pc.list_flatten(lists)
    keep = np.repeat(~empty, pc.list_value_length(lists).to_numpy(zero_copy_only=False))
    flat = flat.filter(pa.array(keep))
    owner = np.repeat(np.arange(len(col)), lengths)
    values = _text_ids(flat, name, s, rows, owner, field)
    return values, np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)


def _text_ids(
    col: pa.Array, name: str, s: Schema, rows: _Rows, owner: np.ndarray | None, field: pa.Array
) -> np.ndarray:
    """Ids of a binary column's values (``owner``: list elements' rows; an empty one fails it;
    ``field``: the rows' fields, for messages)."""
    n_rows = len(rows.reason)
    if s.format == "criteo":
        ids, bad = criteo.parse_hex(col)
        if owner is not None:
            bad |= pc.fill_null(pc.equal(pc.binary_length(col), 0), True).to_numpy(
                zero_copy_only=False
            )
        reason = criteo.BAD_HEX
    else:
        offsets, data, lens = criteo.binary_buffers(col)
        ids = np.where(lens > 0, fnv1a(offsets - offsets[0], data[offsets[0] :]), MISSING_ID)
        bad = (lens == 0) if owner is not None else np.zeros(len(col), dtype=bool)
        reason = BAD_LIST
    row_bad = np.zeros(n_rows, dtype=bool)
    row_bad[bad.nonzero()[0] if owner is None else owner[bad]] = True
    rows.fail(row_bad, reason, lambda r: f"{name}={_text(field, r)}")
    return ids


def _finish(table, label, rows, skip, first_line, s, dense_of, sparse_of) -> criteo.Parsed:
    """Dense, sparse and lists of every row, then the good rows only (shared by both readers)."""
    n = len(label)
    dense = np.zeros((len(s.dense), n), dtype=np.float32)
    for i, (name, transform) in enumerate(zip(s.dense, s.transforms)):
        x = dense_of(table.column(name).combine_chunks(), name, rows)
        dense[i] = transformed(x, transform)
        rows.fail(~np.isfinite(dense[i]), BAD_NUMBER,
                  lambda r, x=x, name=name: f"{name}={float(x[r])!r}: beyond float32")  # fmt: skip
    ids = np.zeros((len(s.sparse), n), dtype=np.int64)
    lists: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for j, (name, multi) in enumerate(zip(s.sparse, s.multi_hot_mask())):
        got = sparse_of(table.column(name).combine_chunks(), name, multi, s, rows)
        if multi:
            lists[j] = got
        else:
            ids[j] = got
    good = (rows.reason < 0) & ~skip
    bad = np.flatnonzero(rows.reason >= 0)
    keep = np.flatnonzero(good)
    return criteo.Parsed(
        lines=keep.astype(np.int64) + first_line,
        label=label[keep],
        dense=dense[:, keep],
        ids=ids[:, keep],
        bad_lines=bad.astype(np.int64) + first_line,
        bad_reasons=[REASONS[rows.reason[r]] for r in bad],
        bad_details=[rows.detail.get(int(r), "") for r in bad],
        lists={j: _kept_lists(v, o, keep) for j, (v, o) in lists.items()},
    )


def _kept_lists(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray):
    """The lists of ``rows`` (sorted row indices): (values, offsets from 0, int64)."""
    lengths, kept = take_lists(offsets, values, rows)
    return kept, starts(lengths)


def standardized(x: np.ndarray, moments: list[float]) -> np.ndarray:
    """A ``standardize`` column's (x - mean) / std (in float64, then float32), clipped to float32's
    finite range: a value far outside a near-constant training split (std 1e-41) stays finite."""
    mean, std = moments
    big = float(np.finfo(np.float32).max)
    return np.clip((x.astype(np.float64) - mean) / std, -big, big).astype(np.float32)


def transformed(x: np.ndarray, transform: str) -> np.ndarray:
    """float64 values -> float32 after ``log1p`` or ``none`` (``standardize``: the raw value;
    the encoder applies it once the training split's moments are known)."""
    if transform == "log1p":
        x = np.log1p(np.maximum(x, 0.0))
    with np.errstate(over="ignore"):  # beyond float32 -> inf: the caller fails those rows
        return x.astype(np.float32)


# ------------------------------------------------------------------------------------ parquet
def iter_parquet(
    path: str | Path, rows: int, s: Schema, unlabelled_ok: bool = False
) -> Iterator[tuple[pa.Table, int]]:
    """(batch of at most ``rows`` rows, its first row index) of the schema's columns
    (``unlabelled_ok``: the label column may be absent, for predict)."""
    try:
        f = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise rawtext.InputError(f"{path}: not a readable parquet file ({e})") from None
    names = [s.label, *s.dense, *s.sparse]
    if s.label not in f.schema_arrow.names and unlabelled_ok:
        names = names[1:]
    missing = [n for n in names if n not in f.schema_arrow.names]
    if missing:
        raise rawtext.InputError(f"{path}: no column {missing[0]!r}")
    first = 0
    batches = f.iter_batches(batch_size=max(1, rows), columns=names)
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowInvalid, OSError) as e:
            raise rawtext.InputError(f"{path}: unreadable after row {first} ({e})") from None
        if batch is None:
            return
        yield pa.Table.from_batches([batch]), first
        first += batch.num_rows


def parse_parquet(table: pa.Table, first_row: int, s: Schema) -> criteo.Parsed:
    """Parse a parquet batch under schema ``s`` (rows numbered like lines)."""
    rows = _Rows(table.num_rows)
    skip = np.zeros(table.num_rows, dtype=bool)
    if s.label not in table.column_names:  # unlabelled input (predict): every label 0
        zeros = np.zeros(table.num_rows, dtype=np.float32)
        return _finish(table, zeros, rows, skip, first_row, s, _pq_dense, _pq_sparse)
    col = _plain(table.column(s.label).combine_chunks())
    y = _pq_label(col, s.label)
    ok = ~np.isnan(y) & ((y == 0) | (y == 1))
    rows.fail(~ok, criteo.BAD_LABEL, lambda r: f"{s.label}={col[r].as_py()!r}")
    label = np.where(ok, y, 0).astype(np.float32)
    return _finish(table, label, rows, skip, first_row, s, _pq_dense, _pq_sparse)


def _pq_label(col: pa.Array, name: str) -> np.ndarray:
    """float64 label values; NaN where it is null or (strings) not a number, so the row is bad."""
    if _is_text(col.type):
        col = pc.cast(col, pa.string())
        ok = pc.fill_null(pc.match_substring_regex(col, _NUMBER), False)
        col = pc.if_else(ok, col, pa.scalar(None, pa.string()))
    elif not (_is_number(col.type) or pa.types.is_null(col.type)):
        raise rawtext.InputError(f"column {name!r}: a label holds 0/1 (numbers), not {col.type}")
    return pc.fill_null(pc.cast(col, pa.float64()), np.nan).to_numpy(zero_copy_only=False)


def _is_text(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t))  # fmt: skip


def _is_number(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
            or pa.types.is_decimal(t))  # fmt: skip


def _plain(col: pa.Array) -> pa.Array:
    return col.dictionary_decode() if pa.types.is_dictionary(col.type) else col


def _pq_dense(col: pa.Array, name: str, rows: _Rows) -> np.ndarray:
    col = _plain(col)
    if not _is_number(col.type):
        raise rawtext.InputError(f"column {name!r}: a dense column holds numbers, not {col.type}")
    values = pc.fill_null(pc.cast(col, pa.float64()), 0.0).to_numpy(zero_copy_only=False)
    rows.fail(~np.isfinite(values), BAD_NUMBER, lambda r: f"{name}={col[r].as_py()!r}")
    return values


def _pq_sparse(col: pa.Array, name: str, multi: bool, s: Schema, rows: _Rows):
    col = _plain(col)
    if not multi:
        return _pq_ids(col, name)
    if not pa.types.is_list(col.type) and not pa.types.is_large_list(col.type):
        raise rawtext.InputError(f"column {name!r}: multi-hot needs a list column, not {col.type}")
    col = pc.fill_null(col, pa.scalar([], col.type))
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = _plain(pc.list_flatten(col))
    owner = np.repeat(np.arange(len(col)), lengths)
    if flat.null_count:
        row_bad = np.zeros(len(col), dtype=bool)
        row_bad[owner[flat.is_null().to_numpy(zero_copy_only=False)]] = True
        rows.fail(row_bad, BAD_LIST, name)
    return _pq_ids(flat, name), np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)


def _pq_ids(col: pa.Array, name: str) -> np.ndarray:
    """Ids of a parquet column (see :mod:`.schema`); null -> MISSING_ID.  Integers (any width,
    unsigned too: the top bit cleared), booleans, strings/binaries, and floats holding integers
    (pandas stores an integer column with nulls as float64); anything else is refused."""
    null = col.is_null().to_numpy(zero_copy_only=False)
    if pa.types.is_boolean(col.type):
        col = pc.cast(col, pa.int8())
    if pa.types.is_floating(col.type):
        ids = _float_ids(col, name)
    elif pa.types.is_integer(col.type):
        ids = int_ids(pc.fill_null(col, 0).to_numpy(zero_copy_only=False))
    elif not (_is_text(col.type) or pa.types.is_null(col.type)):  # all null: MISSING_ID
        raise rawtext.InputError(
            f"column {name!r}: ids are integers or strings (a list column needs multi_hot: true),"
            f" not {col.type}"
        )
    else:
        col = pc.cast(col, pa.large_binary() if pa.types.is_large_string(col.type) or
                      pa.types.is_large_binary(col.type) else pa.binary())  # fmt: skip
        col = pc.cast(pc.fill_null(col, b""), pa.binary())
        offsets, data, _ = criteo.binary_buffers(col)
        ids = fnv1a(offsets - offsets[0], data[offsets[0] :])
    return np.where(null, MISSING_ID, ids)


def _float_ids(col: pa.Array, name: str) -> np.ndarray:
    """Ids of a float column whose values are integers (beyond int64: refused like 1.5)."""
    x = pc.fill_null(col, 0.0).to_numpy(zero_copy_only=False).astype(np.float64)
    bad = ~np.isfinite(x) | (x != np.floor(x)) | (np.abs(x) >= 2.0**63)
    if bad.any():
        v = float(x[np.flatnonzero(bad)[0]])
        raise rawtext.InputError(f"column {name!r}: ids are integers or strings, not {v!r}")
    return int_ids(x.astype(np.int64))
