"""Parsing raw Criteo click-log lines: vectorized parsing and validation of blocks of whole lines
(read by :mod:`.rawtext`).

A line is ``label \\t I1..I13 \\t C1..C26`` (40 fields).  Lines are numbered from 1 in messages.

Policy, per line: acceptance is a property of the line alone (never of the lines read with it, so
``chunk_bytes`` cannot change the output).  The first failing check names the line's reason:

* too long (``"line too long"``): more than :data:`MAX_LINE_BYTES` bytes (no valid line has even 500),
  e.g. a binary file given as input.  Only the first ``MAX_LINE_BYTES + 1`` bytes of such a line
  are ever held in memory;
* wrong field count (``"wrong field count"``): not exactly 40 tab-separated fields, e.g. the 39-field
  lines of Kaggle's ``test.txt``, cut lines, or an empty line;
* label (``"label not 0/1"``): empty or anything but ``0``/``1`` (e.g. a header line);
* integer fields (``"non-integer in an integer field"``): anything but an optional ``-`` and decimal
  digits whose value fits in int64 (leading zeros allowed; no spaces, ``+``, ``0x``).  An empty
  integer is 0; a negative one is clipped to 0 (as DLRM does); the dense value is ``log(1 + x)`` as
  float32, so it is always finite;
* categorical fields (``"categorical not 1-8 hex digits"``): must be empty or 1-8 hex digits (either
  case).  The id is that hex number as int64; an empty field is :data:`format.MISSING_ID`.
* Any byte may appear (non-UTF-8, NUL, ...): such a line just fails one of the checks above.
* A carriage return is only a line end when followed by LF (or at the end of the file); anywhere
  else it makes its field invalid.  A UTF-8 byte order mark at the start of a file is ignored.

Parsing is pyarrow's multi-threaded CSV reader plus numpy: hex digits go through a byte lookup
table, never a Python loop per value.  Malformed lines are rare, so the fast path lets pyarrow
convert the integers, which is exact only for a block of the bytes a valid line can hold (pyarrow
also takes " 5" and "0x5"); any other block, or one pyarrow refuses, has its integers checked on
the raw bytes.  A block with lines of the wrong shape is laid out line by line: those lines are
blanked (their reason kept) and the block is parsed again, one row per line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from .format import DENSE_NAMES, LABEL, MISSING_ID, NUM_DENSE, NUM_SPARSE, SPARSE_NAMES
from .rawtext import BOM, MAX_LINE_BYTES, Block, iter_blocks, normalize_line_ends

NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE
COLUMNS = [LABEL, *DENSE_NAMES, *SPARSE_NAMES]

BAD_LONG = "line too long"
BAD_FIELDS = "wrong field count"
BAD_LABEL = "label not 0/1"
BAD_INT = "non-integer in an integer field"
BAD_HEX = "categorical not 1-8 hex digits"

# Bump when what a line parses to, or whether it is accepted, changes: datasets built under
# another version are not reused.  2: acceptance no longer depends on the other lines of a block.
LINE_POLICY_VERSION = 2
# Criteo 1TB's file names: day_0 ... day_23, plain or gzip (read in numeric order).
DAY_FILE = re.compile(r"^day_(\d+)(\.gz)?$")
_LINE_BYTES = b"0123456789abcdefABCDEF-\t\n"  # every byte of a valid line (after CRLF -> LF)


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
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_NOT_DIGIT = np.ones(256, dtype=np.uint8)
_NOT_DIGIT[ord("0") : ord("9") + 1] = 0


class BadLineError(ValueError):
    """A malformed line under ``bad_lines: fail``; the message is ``path:lineno: reason``."""


@dataclass
class Parsed:
    """The good lines of a block, plus where and why the others were rejected."""

    lines: np.ndarray  # (n,) int64 0-based line index in the file of each good row
    label: np.ndarray  # (n,) float32, 0 or 1
    # (dense features, n) float32 after the transform (Criteo: log1p(max(x, 0))), empty -> 0
    dense: np.ndarray
    ids: np.ndarray  # (sparse features, n) int64 ids, MISSING_ID for empty (feature-major)
    bad_lines: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # 0-based
    bad_reasons: list[str] = field(default_factory=list)  # reason of each bad line
    bad_details: list[str] = field(default_factory=list)  # e.g. "I3='x7'"
    # multi-hot features (index in the schema's sparse order): (values int64, offsets (n+1,)
    # int64 from 0); their rows of ``ids`` are unused
    lists: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


def day_file_name(day: int, gz: bool) -> str:
    """The name of day ``day``'s file (matches :data:`DAY_FILE`)."""
    return f"day_{day}" + (".gz" if gz else "")


def _read_table(data: bytes, typed: bool) -> pa.Table:
    """pyarrow CSV parse, one row per line (an empty line is an all-null row); raises
    ``pa.ArrowInvalid`` if a line does not have 40 fields or is too long for pyarrow's blocks, or
    (``typed``: integers converted by pyarrow) an integer field does not convert.

    Binary (not string) columns: no UTF-8 check, every byte goes through our own validation.  No
    ``invalid_row_handler``: pyarrow decodes the row as UTF-8 before calling it, and fails inside
    the callback on any other byte.
    """
    types = {n: pa.binary() for n in COLUMNS}
    if typed:
        types.update({n: pa.int64() for n in DENSE_NAMES})
    return pacsv.read_csv(
        pa.BufferReader(data),
        read_options=pacsv.ReadOptions(column_names=COLUMNS, block_size=4 << 20),
        parse_options=pacsv.ParseOptions(
            delimiter="\t", quote_char=False, ignore_empty_lines=False
        ),
        convert_options=pacsv.ConvertOptions(
            column_types=types,
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        ),
    )


def _plain(data: bytes) -> bool:
    """Only bytes a valid line can hold.  On those, pyarrow's int64 parser accepts exactly the
    policy's integers (its extras, " 5" and "0x5", need other bytes; a test checks the claim)."""
    return not data.translate(None, _LINE_BYTES)


def _may_have_long_line(data: bytes) -> bool:
    """False when no line is longer than MAX_LINE_BYTES: then every aligned window of half that
    size holds a line end (one memchr per window, not a pass over every byte)."""
    half = MAX_LINE_BYTES // 2
    return any(data.find(b"\n", k, k + half) < 0 for k in range(0, len(data) - half + 1, half))


@dataclass
class _Shape:
    """Lines a block held that cannot be a 40-field row (too long, wrong field count, empty)."""

    lines: np.ndarray  # 0-based line indices in the block
    reasons: list[str]
    details: list[str]


def _blank_bad_shapes(data: bytes) -> tuple[bytes, _Shape]:
    """The block with every line that cannot be a 40-field row emptied (its line end kept), so it
    parses as one row per line; and those lines with their reasons."""
    if not data.endswith(b"\n"):
        data += b"\n"  # a last line without one, once emptied, must still be a line
    arr = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(arr == 10)
    starts = np.concatenate(([0], ends[:-1] + 1))
    tabs = np.flatnonzero(arr == 9)
    fields = np.searchsorted(tabs, ends) - np.searchsorted(tabs, starts) + 1
    length = ends - starts
    too_long = length > MAX_LINE_BYTES
    blank = too_long | (fields != NUM_FIELDS)  # an empty line has one field
    lines = np.flatnonzero(blank)
    reasons = [BAD_LONG if too_long[k] else BAD_FIELDS for k in lines]
    details = [
        f"more than {MAX_LINE_BYTES} bytes"
        if too_long[k]
        else "empty line"
        if length[k] == 0
        else f"{fields[k]} fields, expected {NUM_FIELDS}"
        for k in lines
    ]
    delta = np.zeros(len(arr) + 1, dtype=np.int64)  # +1 where a blanked line starts, -1 at its end
    delta[starts[lines]] += 1
    delta[ends[lines]] -= 1
    keep = np.cumsum(delta[:-1]) == 0
    return arr[keep].tobytes(), _Shape(lines, reasons, details)


def binary_buffers(col: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A binary column's raw buffers without copies: (offsets [n+1], data bytes, lengths [n])."""
    offsets = np.frombuffer(
        col.buffers()[1], dtype=np.int32, count=len(col) + 1, offset=4 * col.offset
    )
    data_buf = col.buffers()[2]
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    )
    return offsets, data, np.diff(offsets)


def parse_hex(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Binary column -> (int64 ids, bad mask).  Empty/null -> MISSING_ID; not 1-8 hex digits -> bad."""
    n = len(col)
    offsets, data, lens = binary_buffers(col)
    ids = np.full(n, MISSING_ID, dtype=np.int64)
    bad = lens > 8
    present = (lens > 0) & ~bad
    if np.count_nonzero(lens == 8) == np.count_nonzero(
        lens
    ):  # usual: all present values have 8 digits
        digits = data[offsets[0] : offsets[-1]].reshape(-1, 8)
    else:  # left-pad shorter values with '0' through a gather
        sel = np.flatnonzero(present)
        col_idx = np.arange(8)
        pad = 8 - lens[sel][:, None]
        src = offsets[sel][:, None] + col_idx - pad
        digits = np.where(
            col_idx >= pad, data[np.clip(src, 0, max(len(data) - 1, 0))], ord("0")
        ).astype(np.uint8)
    pairs = _HEX_PAIR_LUT[np.ascontiguousarray(digits).view(np.uint16)]  # (m, 4) byte values
    ok = (pairs.view(np.uint64).ravel() & np.uint64(0xFF00FF00FF00FF00)) == 0  # no 256 marker
    values = pairs.astype(np.uint8).view(">u4").ravel().astype(np.int64)  # most significant first
    if len(values) == n:  # no empty values
        ids, bad = values, ~ok
    else:
        ids[present] = values
        bad[present] = ~ok
    return ids, bad


def _int_ok(col: pa.Array) -> np.ndarray:
    """Per value of a binary column: empty/null, or an optional ``-`` and digits that fit in int64.
    On the raw bytes with numpy (pyarrow's regex kernel costs ~10x more)."""
    n = len(col)
    offsets, data, lens = binary_buffers(col)
    first = offsets[0]
    not_digit = np.concatenate(
        ([0], np.cumsum(_NOT_DIGIT[data[first : offsets[-1]]], dtype=np.int64))
    )
    non_digits = not_digit[offsets[1:] - first] - not_digit[offsets[:-1] - first]  # per value
    minus = np.zeros(n, dtype=bool)
    present = lens > 0
    minus[present] = data[offsets[:-1][present]] == ord("-")
    digits = lens - minus
    ok = ~present | ((non_digits == minus) & (digits >= 1))
    for k in np.flatnonzero(ok & (digits > 18)):  # rare: 19+ digits may not fit
        ok[k] = _INT64_MIN <= int(col[k].as_py()) <= _INT64_MAX
    if col.null_count:
        ok |= col.is_null().to_numpy(zero_copy_only=False)
    return ok


def _dense_columns(table: pa.Table, typed: bool) -> tuple[np.ndarray, np.ndarray]:
    """(13, n) float32 log1p(max(x, 0)) with empty -> 0, and the bad-row mask.

    ``typed``: pyarrow converted the integers (see :func:`_plain`), so they all follow the policy;
    else the raw bytes are checked first.
    """
    n = table.num_rows
    dense = np.empty((NUM_DENSE, n), dtype=np.float32)
    bad = np.zeros(n, dtype=bool)
    for i, name in enumerate(DENSE_NAMES):
        col = table.column(name).combine_chunks()
        if not typed:
            ok = _int_ok(col)
            if not ok.all():
                bad |= ~ok
                col = pc.if_else(pa.array(ok), col, pa.scalar(None, pa.binary()))
            col = pc.cast(pc.cast(col, pa.string()), pa.int64())
        x = pc.fill_null(col, 0).to_numpy(zero_copy_only=False)
        dense[i] = np.log1p(np.maximum(x, 0).astype(np.float64))  # float64: exact up to 2**53
    return dense, bad


def _label_column(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(float32 labels, bad mask): exactly the bytes "0" or "1"."""
    col = table.column(LABEL).combine_chunks()
    one = pc.fill_null(pc.equal(col, pa.scalar(b"1", pa.binary())), False).to_numpy(
        zero_copy_only=False
    )
    zero = pc.fill_null(pc.equal(col, pa.scalar(b"0", pa.binary())), False).to_numpy(
        zero_copy_only=False
    )
    return one.astype(np.float32), ~(one | zero)


def _field_text(table: pa.Table, name: str, row: int) -> str:
    v = table.column(name)[row].as_py()
    return repr(v.decode("utf-8", "replace") if isinstance(v, bytes) else "")


def parse_block(
    data: bytes,
    first_line: int = 0,
    num_lines: int | None = None,
    at_file_start: bool | None = None,
) -> Parsed:
    """Parse one block of whole lines; ``first_line`` is the line index of its first line (in the
    file, or in whatever the caller counts from); ``at_file_start``: the block starts the file
    (default: ``first_line == 0``), where a byte order mark is dropped."""
    if at_file_start is None:
        at_file_start = first_line == 0
    if data.startswith(BOM):
        # A file's byte order mark is dropped.  Elsewhere it is data, but pyarrow would drop it at
        # the start of any block: its first byte is made NUL, which fails the same checks.
        data = data[len(BOM) :] if at_file_start else b"\0" + data[1:]
    data = normalize_line_ends(data)
    if num_lines is None:
        num_lines = data.count(b"\n") + (not data.endswith(b"\n"))
    table, typed = None, False
    if not _may_have_long_line(data):
        for typed in (True, False) if _plain(data) else (False,):
            try:
                table = _read_table(data, typed)
                break
            except (
                pa.ArrowInvalid
            ):  # an integer pyarrow cannot convert, or a line of the wrong shape
                continue
    shape = _Shape(np.empty(0, np.int64), [], [])
    # An empty line is an all-null row: only a null label makes the layout worth computing.
    if table is None or table.column(LABEL).null_count:
        data, shape = _blank_bad_shapes(data)
        typed = False
        table = _read_table(data, typed)
    n = table.num_rows
    if n != num_lines:
        raise RuntimeError(f"internal: {n} rows parsed from {num_lines} lines")
    shaped = np.zeros(n, dtype=bool)
    shaped[shape.lines] = True

    label, bad_label = _label_column(table)
    dense, bad_int = _dense_columns(table, typed)
    ids = np.empty((NUM_SPARSE, n), dtype=np.int64)  # feature-major: each feature contiguous
    bad_hex = np.zeros(n, dtype=bool)
    for j, name in enumerate(SPARSE_NAMES):
        ids[j], b = parse_hex(table.column(name).combine_chunks())
        bad_hex |= b

    # One reason per line, in the documented order of checks.
    bad_label &= ~shaped
    bad_int &= ~(shaped | bad_label)
    bad_hex &= ~(shaped | bad_label | bad_int)
    bad_lines = [shape.lines]
    reasons, details = list(shape.reasons), list(shape.details)
    for mask, reason in ((bad_label, BAD_LABEL), (bad_int, BAD_INT), (bad_hex, BAD_HEX)):
        rows = np.flatnonzero(mask)
        bad_lines.append(rows)
        reasons += [reason] * len(rows)
        details += [_bad_field(table, reason, int(r)) for r in rows]

    good = ~(shaped | bad_label | bad_int | bad_hex)
    row_line = np.arange(n, dtype=np.int64)
    if not good.all():
        row_line, label, dense, ids = row_line[good], label[good], dense[:, good], ids[:, good]
    all_bad = np.concatenate(bad_lines).astype(np.int64)
    order = np.argsort(all_bad, kind="stable")
    return Parsed(
        lines=row_line + first_line,
        label=label,
        dense=dense,
        ids=ids,
        bad_lines=all_bad[order] + first_line,
        bad_reasons=[reasons[k] for k in order],
        bad_details=[details[k] for k in order],
    )


def _bad_field(table: pa.Table, reason: str, row: int) -> str:
    """The first offending field of a bad row, as NAME='text' (for messages)."""
    if reason == BAD_LABEL:
        return f"{LABEL}={_field_text(table, LABEL, row)}"
    names = DENSE_NAMES if reason == BAD_INT else SPARSE_NAMES
    for name in names:
        value = table.column(name).slice(row, 1).combine_chunks()
        if not (_int_ok(value)[0] if reason == BAD_INT else not parse_hex(value)[1][0]):
            return f"{name}={_field_text(table, name, row)}"
    return ""


def read_file(
    path: str | Path, chunk_bytes: int, stop_line: int | None = None
) -> Iterator[tuple[Block, Parsed]]:
    """Parse a raw file block by block (bounded memory); see :func:`iter_blocks`."""
    for block in iter_blocks(path, chunk_bytes, stop_line):
        yield block, parse_block(block.data, block.first_line, block.num_lines)
