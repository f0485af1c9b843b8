"""Reading raw text files as blocks of whole lines, in bounded memory.

Inputs may be plain or gzip (detected by the magic bytes, not the name) and may use CRLF line ends
(:func:`normalize_line_ends`).  A block is ``chunk_bytes`` plus the rest of its last line; a line
longer than :data:`MAX_LINE_BYTES` is cut (enough is kept to know it is too long), so no input can
make a block much larger.  A gzip file that is cut short or corrupt raises :class:`InputError`
naming the file.  What the lines mean is the parsers' job (:mod:`.criteo`, :mod:`.tabular`).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MAX_LINE_BYTES = (
    64 << 10
)  # longest line parsed (without its line end); pyarrow needs < its 4 MiB block
_GZIP_MAGIC = b"\x1f\x8b"
BOM = b"\xef\xbb\xbf"
_CORRUPT_GZIP = (EOFError, zlib.error, gzip.BadGzipFile)


class InputError(ValueError):
    """An input file that cannot be read as text lines (e.g. a truncated gzip); names the file."""


@dataclass
class Block:
    """Complete lines read from one file."""

    data: bytes
    first_line: int  # 0-based index in the file of the block's first line
    num_lines: int
    end: int  # offset just past the block in the (decompressed) text: where the next block starts
    bytes_read: int  # bytes consumed from the file on disk so far (compressed bytes for gzip)


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
    path: str | Path,
    chunk_bytes: int,
    stop_line: int | None = None,
    start: int = 0,
    start_line: int = 0,
) -> Iterator[Block]:
    """Yield blocks of whole lines (``chunk_bytes`` plus the rest of the last line) until EOF or
    ``stop_line``, from text offset ``start`` (a block's ``end``, whose first line is ``start_line``).

    The last block may extend past ``stop_line``; callers filter by line index.  A line longer than
    :data:`MAX_LINE_BYTES` that ends a block is cut after ``MAX_LINE_BYTES + 1`` bytes (its line end
    kept), so a block never holds much more than ``chunk_bytes`` whatever the input.
    """
    reader, raw = open_raw(path)
    try:
        with raw, reader:
            if start:
                reader.seek(
                    start
                )  # gzip: decompresses up to there, still much cheaper than parsing
            line, pos = start_line, start
            while stop_line is None or line < stop_line:
                data = reader.read(chunk_bytes)
                if not data:
                    break
                consumed = len(data)
                if not data.endswith(b"\n"):
                    rest, n = _rest_of_line(
                        reader
                    )  # complete the last line (one copy, not a carry)
                    data += rest
                    consumed += n
                n = data.count(b"\n") + (
                    not data.endswith(b"\n")
                )  # a last line without newline counts
                pos += consumed
                yield Block(data, line, n, pos, raw.tell())
                line += n
    except _CORRUPT_GZIP as e:
        raise InputError(f"{path}: truncated or corrupt gzip file ({e})") from None


def _rest_of_line(reader: BinaryIO) -> tuple[bytes, int]:
    """(the rest of the current line, bytes consumed); past ``MAX_LINE_BYTES + 1`` bytes the line's
    text is skipped, not kept (enough is kept to know it is too long)."""
    rest = reader.readline(MAX_LINE_BYTES + 2)  # + 1 for the line end
    consumed = len(rest)
    if len(rest) == MAX_LINE_BYTES + 2 and not rest.endswith(b"\n"):
        while skipped := reader.readline(1 << 20):
            consumed += len(skipped)
            if skipped.endswith(b"\n"):
                rest += b"\n"
                break
    return rest, consumed


def read_range(path: str | Path, start: int, end: int) -> bytes:
    """The whole lines of a plain file that start in bytes [start, end): from the first line start
    at or after ``start`` through the line that crosses ``end`` (see :func:`iter_blocks` for how a
    too-long last line is cut)."""
    with open(path, "rb") as f:
        pos = start
        if start > 0:
            f.seek(start - 1)  # a line starts at ``start`` iff the byte before it ends one
            k = f.read(end - start + 1).find(b"\n")  # never past ``end``: a long line costs once
            if k < 0:
                return b""
            pos += k
            f.seek(pos)
        if pos >= end:
            return b""
        data = f.read(end - pos)
        if data and not data.endswith(b"\n"):
            data += _rest_of_line(f)[0]
        return data


def count_lines(path: str | Path, chunk_bytes: int = 4 << 20) -> int:
    """Physical lines in a file (a last line without newline counts)."""
    reader, raw = open_raw(path)
    buf = bytearray(chunk_bytes)  # reused: no fresh pages per read
    view = memoryview(buf)
    try:
        with raw, reader:
            n, last = 0, b"\n"
            while size := reader.readinto(view):  # type: ignore[attr-defined]
                n += buf.count(b"\n", 0, size)
                last = bytes(view[size - 1 : size])
            return n + (last != b"\n")
    except _CORRUPT_GZIP as e:
        raise InputError(f"{path}: truncated or corrupt gzip file ({e})") from None


def normalize_line_ends(data: bytes) -> bytes:
    """CRLF -> LF; a final lone CR ends the last line; other CRs become NUL (an invalid byte)."""
    if b"\r" not in data:
        return data
    data = data.replace(b"\r\n", b"\n")
    if data.endswith(b"\r"):
        data = data[:-1]
    return data.replace(b"\r", b"\0")
