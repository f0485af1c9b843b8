"""The header line of text inputs (``schema.header: true``): the file's column names, in order.

Every input file must start with the same header, naming every column the schema uses (extra
columns are read and ignored); otherwise the run stops before parsing, naming the file.
"""

from __future__ import annotations

import csv
from pathlib import Path

from .. import rawtext
from ..schema import Schema
from .errors import PreprocessError


def read_header(files: list[Path], s: Schema) -> list[str]:
    """The columns named by every file's first line (the same in all of them)."""
    columns: list[str] | None = None
    for path in files:
        got = first_fields(path, s.delimiter)
        if columns is None:
            columns = got
            missing = [n for n in [s.label, *s.dense, *s.sparse] if n not in got]
            if missing:
                raise PreprocessError(f"{path}:1: the header has no column {missing[0]!r}")
        elif got != columns:
            raise PreprocessError(f"{path}:1: header differs from {files[0]}'s")
    return columns or []


def first_fields(path: Path, delimiter: str) -> list[str]:
    """The fields of a text file's first line (a byte order mark dropped; quotes as CSV's)."""
    reader, raw = rawtext.open_raw(path)
    with raw, reader:
        line = reader.readline(rawtext.MAX_LINE_BYTES + 2)
    if line.startswith(rawtext.BOM):
        line = line[len(rawtext.BOM) :]
    text = line.rstrip(b"\r\n").decode("utf-8", "replace")
    if not text:
        raise rawtext.InputError(f"{path}:1: empty first line")
    return next(csv.reader([text], delimiter=delimiter))
