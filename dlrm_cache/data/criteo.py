"""Reading raw Criteo click-log text: streaming blocks, vectorized parsing and validation.

A line is ``label \\t I1..I13 \\t C1..C26`` (40 fields).  Inputs may be plain or gzip (detected by
the magic bytes, not the name) and may use CRLF line ends.  Lines are numbered from 1 in messages.

Policy, per line (the first failing check names the line's reason):

* wrong field count (``"wrong field count"``): not exactly 40 tab-separated fields, e.g. the 39-field
  lines of Kaggle's ``test.txt``, cut lines, or an empty line;
* label (``"label not 0/1"``): empty or anything but ``0``/``1``;
* integer fields (``"non-integer in an integer field"``): anything but an optional ``-`` and decimal
  digits that fit in int64.  An empty integer is 0; a negative one is clipped to 0 (as DLRM does);
  the dense value is ``log(1 + x)`` as float32, so it is always finite;
* categorical fields (``"categorical not 1-8 hex digits"``): must be empty or 1-8 hex digits (either
  case).  The id is that hex number as int64; an empty field is :data:`format.MISSING_ID`.
* A carriage return is only a line end when followed by LF (or at the end of the file); anywhere
  else it makes its field invalid.

Parsing is pyarrow's multi-threaded CSV reader plus numpy: hex digits go through a byte lookup
table, never a Python loop per value.  Malformed lines are rare, so the fast path assumes none and
only a block that has some is re-read as raw bytes to find and classify them.
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from .format import DENSE_NAMES, LABEL, MISSING_ID, NUM_DENSE, NUM_SPARSE, SPARSE_NAMES

NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE
COLUMNS = [LABEL, *DENSE_NAMES, *SPARSE_NAMES]

BAD_FIELDS = "wrong field count"
BAD_LABEL = "label not 0/1"
BAD_INT = "non-integer in an integer field"
BAD_HEX = "categorical not 1-8 hex digits"

_GZIP_MAGIC = b"\x1f\x8b"
_INT_RE = r"^-?[0-9]{1,18}$"  # 18 digits always fit in int64 (pyarrow's own parser accepts 19)



def _pair_lut() -> np.ndarray:
    """Two ASCII bytes (as a native uint16) -> their hex byte value, or 256 if either is not hex."""
    digit = np.full(256, 256, dtype=np.uint16)
    digit[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
    digit[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16)
    digit[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)
    pairs = np.arange(1 << 16, dtype=np.uint16).view(np.uint8).reshape(-1, 2)  # native byte order
    hi, lo = digit[pairs[:, 0]], digit[pairs[:, 1]]
    return np.where((hi < 16) & (lo < 16), hi * 16 + lo, 256).astype(np.uint16)


_HEX_PAIR_LUT = _pair_lut()  # 128 KiB: one lookup decodes two hex digits


class BadLineError(ValueError):
    """A malformed line under ``bad_lines: fail``; the message is ``path:lineno: reason``."""


@dataclass
class Block:
    """Complete lines read from one file."""

    data: bytes
    first_line: int  # 0-based index in the file of the block's first line
    num_lines: int
    end: int  # offset just past the block in the (decompressed) text: where the next block starts
    bytes_read: int  # bytes consumed from the file on disk so far (compressed bytes for gzip)


@dataclass
class Parsed:
    """The good lines of a block, plus where and why the others were rejected."""

    lines: np.ndarray  # (n,) int64 0-based line index in the file of each good row
    label: np.ndarray  # (n,) float32, 0 or 1
    dense: np.ndarray  # (13, n) float32 log1p(max(x, 0)), empty -> 0 (feature-major)
    ids: np.ndarray  # (26, n) int64 hex ids, MISSING_ID for empty (feature-major)
    bad_lines: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # 0-based
    bad_reasons: list[str] = field(default_factory=list)  # reason of each bad line
    bad_details: list[str] = field(default_factory=list)  # e.g. "I3='x7'"


# --------------------------------------------------------------------------------------- reading
def is_gzip(path: str | Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == _GZIP_MAGIC


def open_raw(path: str | Path) -> tuple[BinaryIO, BinaryIO]:
    """(reader, underlying file): gzip is detected by its magic bytes."""
    raw = open(path, "rb")
    if raw.read(2) == _GZIP_MAGIC:
        raw.seek(0)
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw  # type: ignore[return-value]
    raw.seek(0)
    return raw, raw


def iter_blocks(
    path: str | Path, chunk_bytes: int, stop_line: int | None = None, start: int = 0, start_line: int = 0
) -> Iterator[Block]:
    """Yield blocks of whole lines (``chunk_bytes`` plus the rest of the last line) until EOF or
    ``stop_line``, from text offset ``start`` (a block's ``end``, whose first line is ``start_line``).

    The last block may extend past ``stop_line``; callers filter by line index.
    """
    reader, raw = open_raw(path)
    with raw, reader:
        if start:
            reader.seek(start)  # gzip: decompresses up to there, still much cheaper than parsing
        line, pos = start_line, start
        while stop_line is None or line < stop_line:
            data = reader.read(chunk_bytes)
            if not data:
                break
            if not data.endswith(b"\n"):
                data += reader.readline()  # complete the last line (one copy, not a carry)
            n = data.count(b"\n") + (not data.endswith(b"\n"))  # a last line without newline counts
            pos += len(data)
            yield Block(data, line, n, pos, raw.tell())
            line += n


def count_lines(path: str | Path, chunk_bytes: int = 4 << 20) -> int:
    """Physical lines in a file (a last line without newline counts)."""
    reader, raw = open_raw(path)
    buf = bytearray(chunk_bytes)  # reused: no fresh pages per read
    view = memoryview(buf)
    with raw, reader:
        n, last = 0, b"\n"
        while size := reader.readinto(view):  # type: ignore[attr-defined]
            n += buf.count(b"\n", 0, size)
            last = bytes(view[size - 1 : size])
        return n + (last != b"\n")


# --------------------------------------------------------------------------------------- parsing
def _normalize_line_ends(data: bytes) -> bytes:
    """CRLF -> LF; a final lone CR ends the last line; other CRs become NUL (an invalid byte)."""
    if b"\r" not in data:
        return data
    data = data.replace(b"\r\n", b"\n")
    if data.endswith(b"\r"):
        data = data[:-1]
    return data.replace(b"\r", b"\0")


def _read_table(data: bytes, typed: bool) -> tuple[pa.Table, int]:
    """pyarrow CSV parse; returns the table and how many rows had the wrong field count."""
    skipped = 0

    def on_invalid(_row: object) -> str:
        nonlocal skipped
        skipped += 1
        return "skip"

    # Binary (not string) columns: no UTF-8 check, any byte is caught by our own validation.
    types = {n: pa.int64() if typed else pa.binary() for n in DENSE_NAMES}
    types.update({n: pa.binary() for n in (LABEL, *SPARSE_NAMES)})
    table = pacsv.read_csv(
        pa.BufferReader(data),
        read_options=pacsv.ReadOptions(column_names=COLUMNS, block_size=4 << 20),
        parse_options=pacsv.ParseOptions(
            delimiter="\t", quote_char=False, ignore_empty_lines=False, invalid_row_handler=on_invalid
        ),
        convert_options=pacsv.ConvertOptions(
            column_types=types, null_values=[""], strings_can_be_null=True, quoted_strings_can_be_null=False
        ),
    )
    return table, skipped


def _line_layout(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Per line: number of tab-separated fields, and whether the line is empty."""
    arr = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(arr == 10)
    if len(ends) == 0 or ends[-1] != len(arr) - 1:
        ends = np.append(ends, len(arr))  # last line without newline
    starts = np.concatenate(([0], ends[:-1] + 1))
    tabs = np.flatnonzero(arr == 9)
    fields = np.searchsorted(tabs, ends) - np.searchsorted(tabs, starts) + 1
    return fields, ends == starts


def parse_hex(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Binary column -> (int64 ids, bad mask).  Empty/null -> MISSING_ID; not 1-8 hex digits -> bad."""
    n = len(col)
    offsets = np.frombuffer(col.buffers()[1], dtype=np.int32, count=n + 1, offset=4 * col.offset)
    data_buf = col.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    lens = np.diff(offsets)
    ids = np.full(n, MISSING_ID, dtype=np.int64)
    bad = lens > 8
    present = (lens > 0) & ~bad
    if np.count_nonzero(lens == 8) == np.count_nonzero(lens):  # usual: all present values have 8 digits
        digits = data[offsets[0] : offsets[-1]].reshape(-1, 8)
    else:  # left-pad shorter values with '0' through a gather
        sel = np.flatnonzero(present)
        col_idx = np.arange(8)
        pad = 8 - lens[sel][:, None]
        src = offsets[sel][:, None] + col_idx - pad
        digits = np.where(col_idx >= pad, data[np.clip(src, 0, max(len(data) - 1, 0))], ord("0")).astype(np.uint8)
    pairs = _HEX_PAIR_LUT[np.ascontiguousarray(digits).view(np.uint16)]  # (m, 4) byte values
    ok = (pairs.view(np.uint64).ravel() & np.uint64(0xFF00FF00FF00FF00)) == 0  # no 256 marker
    values = pairs.astype(np.uint8).view(">u4").ravel().astype(np.int64)  # most significant first
    if len(values) == n:  # no empty values
        ids, bad = values, ~ok
    else:
        ids[present] = values
        bad[present] = ~ok
    return ids, bad


def _dense_columns(table: pa.Table, typed: bool) -> tuple[np.ndarray, np.ndarray]:
    """(13, n) float32 log1p(max(x, 0)) with empty -> 0, and the bad-row mask."""
    n = table.num_rows
    dense = np.empty((NUM_DENSE, n), dtype=np.float32)
    bad = np.zeros(n, dtype=bool)
    for i, name in enumerate(DENSE_NAMES):
        col = table.column(name).combine_chunks()
        if not typed:  # validate the raw bytes, null the bad ones, then convert
            ok = pc.fill_null(pc.match_substring_regex(col, _INT_RE), True).to_numpy(zero_copy_only=False)
            bad |= ~ok
            col = pc.if_else(pa.array(ok), col, pa.scalar(None, pa.binary()))
            col = pc.cast(pc.cast(col, pa.string()), pa.int64())
        x = pc.fill_null(col, 0).to_numpy(zero_copy_only=False)
        dense[i] = np.log1p(np.maximum(x, 0).astype(np.float64))  # float64: exact up to 2**53
    return dense, bad


def _label_column(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(float32 labels, bad mask): exactly the bytes "0" or "1"."""
    col = table.column(LABEL).combine_chunks()
    one = pc.fill_null(pc.equal(col, pa.scalar(b"1", pa.binary())), False).to_numpy(zero_copy_only=False)
    zero = pc.fill_null(pc.equal(col, pa.scalar(b"0", pa.binary())), False).to_numpy(zero_copy_only=False)
    return one.astype(np.float32), ~(one | zero)


def _field_text(table: pa.Table, name: str, row: int) -> str:
    v = table.column(name)[row].as_py()
    return repr(v.decode("utf-8", "replace") if isinstance(v, bytes) else "")


def parse_block(data: bytes, first_line: int = 0, num_lines: int | None = None) -> Parsed:
    """Parse one block of whole lines; ``first_line`` is the file line index of its first line."""
    data = _normalize_line_ends(data)
    if num_lines is None:
        num_lines = data.count(b"\n") + (not data.endswith(b"\n"))
    typed = True
    try:
        table, skipped = _read_table(data, typed=True)
    except pa.ArrowInvalid:  # a conversion error somewhere: validate the raw bytes instead
        typed = False
        table, skipped = _read_table(data, typed=False)
    n = table.num_rows

    # Map table rows to lines.  pyarrow drops lines with the wrong field count but keeps empty
    # lines as all-null rows, so the mapping is the identity unless something was dropped.
    empty_row = np.zeros(n, dtype=bool)
    bad_lines: list[np.ndarray] = []
    reasons: list[str] = []
    details: list[str] = []
    # An empty line is an all-null row: only a null label makes the layout worth computing.
    if skipped or n != num_lines or not typed or table.column(LABEL).null_count:
        fields, empty = _line_layout(data)
        kept = (fields == NUM_FIELDS) | empty
        row_line = np.flatnonzero(kept)
        if len(row_line) != n:
            raise RuntimeError(f"internal: {n} rows parsed from {len(row_line)} lines")
        empty_row = empty[row_line]
        wrong = np.flatnonzero(~kept | empty)
        bad_lines.append(wrong)
        reasons += [BAD_FIELDS] * len(wrong)
        details += ["empty line" if empty[k] else f"{fields[k]} fields, expected {NUM_FIELDS}" for k in wrong]
    else:
        row_line = np.arange(n)

    label, bad_label = _label_column(table)
    dense, bad_int = _dense_columns(table, typed)
    ids = np.empty((NUM_SPARSE, n), dtype=np.int64)  # feature-major: each feature contiguous
    bad_hex = np.zeros(n, dtype=bool)
    for j, name in enumerate(SPARSE_NAMES):
        ids[j], b = parse_hex(table.column(name).combine_chunks())
        bad_hex |= b

    # One reason per line, in the documented order of checks.
    bad_label &= ~empty_row
    bad_int &= ~(empty_row | bad_label)
    bad_hex &= ~(empty_row | bad_label | bad_int)
    for mask, reason in ((bad_label, BAD_LABEL), (bad_int, BAD_INT), (bad_hex, BAD_HEX)):
        rows = np.flatnonzero(mask)
        bad_lines.append(row_line[rows])
        reasons += [reason] * len(rows)
        details += [_bad_field(table, reason, int(r)) for r in rows]

    good = ~(empty_row | bad_label | bad_int | bad_hex)
    if not good.all():
        row_line, label, dense, ids = row_line[good], label[good], dense[:, good], ids[:, good]
    all_bad = np.concatenate(bad_lines) if bad_lines else np.empty(0, np.int64)
    order = np.argsort(all_bad, kind="stable")
    return Parsed(
        lines=row_line.astype(np.int64) + first_line,
        label=label,
        dense=dense,
        ids=ids,
        bad_lines=all_bad[order].astype(np.int64) + first_line,
        bad_reasons=[reasons[k] for k in order],
        bad_details=[details[k] for k in order],
    )


def _bad_field(table: pa.Table, reason: str, row: int) -> str:
    """The first offending field of a bad row, as NAME='text' (for messages)."""
    if reason == BAD_LABEL:
        return f"{LABEL}={_field_text(table, LABEL, row)}"
    names = DENSE_NAMES if reason == BAD_INT else SPARSE_NAMES
    pattern = _INT_RE if reason == BAD_INT else r"^[0-9a-fA-F]{1,8}$"
    for name in names:
        v = table.column(name)[row].as_py()
        if v is not None and not re.fullmatch(pattern.strip("^$"), v.decode("utf-8", "replace")):
            return f"{name}={_field_text(table, name, row)}"
    return ""


def read_file(path: str | Path, chunk_bytes: int, stop_line: int | None = None) -> Iterator[tuple[Block, Parsed]]:
    """Parse a raw file block by block (bounded memory); see :func:`iter_blocks`."""
    for block in iter_blocks(path, chunk_bytes, stop_line):
        yield block, parse_block(block.data, block.first_line, block.num_lines)
