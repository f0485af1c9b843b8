"""The header line of text inputs (``schema.header: true``): the file's column names, in order.

Every input file must start with the same header, naming every column the schema uses once (extra
columns are read and ignored); otherwise the run stops before parsing, naming the file.  A parquet
file given as text is refused by name (its bytes would otherwise read as a garbled header).
"""

from __future__ import annotations

import csv
from pathlib import Path

from .. import rawtext
from ..schema import Schema
from .errors import PreprocessError

PARQUET_MAGIC = b"PAR1"


def read_header(files: list[Path], s: Schema) -> list[str]:
    """The columns named by every file's first line (the same in all of them)."""
    columns: list[str] | None = None
    for path in files:
        got = first_fields(path, s.delimiter)
        if columns is None:
            columns = got
            problem = header_problem(got, [s.label, *s.dense, *s.sparse])
            if problem:
                raise PreprocessError(f"{path}:1: {problem}")
        elif got != columns:
            raise PreprocessError(f"{path}:1: header differs from {files[0]}'s")
    return columns or []


def header_problem(header: list[str], names: list[str]) -> str:
    """'' or why a header cannot give the schema's columns ``names`` (missing, or named twice:
    which of the two would be the column is a guess)."""
    missing = [n for n in names if n not in header]
    if missing:
        hint = " (one field: another delimiter?)" if len(header) == 1 else ""
        return f"the header has no column {missing[0]!r}{hint}"
    twice = [n for n in names if header.count(n) > 1]
    if twice:
        return f"the header names column {twice[0]!r} {header.count(twice[0])} times"
    return ""


def refuse_parquet(path: Path, fmt: str) -> None:
    """A parquet file where the schema reads text (format ``fmt``) is refused by name."""
    with open(path, "rb") as f:
        if f.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC:
            raise rawtext.InputError(f"{path}: a parquet file, but the schema's format is {fmt}")


def first_fields(path: Path, delimiter: str) -> list[str]:
    """The fields of a text file's first line (a byte order mark dropped; quotes as CSV's)."""
    refuse_parquet(path, "csv" if delimiter == "," else "tsv")
    reader, raw = rawtext.open_raw(path)
    with raw, reader:
        line = reader.readline(rawtext.MAX_LINE_BYTES + 2)
    if line.startswith(rawtext.BOM):
        line = line[len(rawtext.BOM) :]
    text = line.rstrip(b"\r\n").decode("utf-8", "replace")
    if not text:
        raise rawtext.InputError(f"{path}:1: empty first line")
    try:
        return next(csv.reader([text], delimiter=delimiter))
    except csv.Error as e:  # a lone \r or a NUL inside a field: not a header
        raise rawtext.InputError(f"{path}:1: not a header line ({e})") from None
