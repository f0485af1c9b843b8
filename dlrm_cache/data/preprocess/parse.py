"""Pass 1a: raw text -> columnar parts, each line parsed exactly once.

A worker parses one :class:`.sources.Task` into parts (one per block read) and writes each part's
good rows as ``.npy`` columns under the build directory's work area: ``label`` (n,) float32,
``dense`` (13, n) float32 (already ``log1p``), ``ids`` (26, n) hashed ids (int32 when
``hash_modulus`` fits in it, else int64) and ``lines`` (n,) int32, the row's line index within
the part (a block is < 2 GiB).
Counting and encoding read these columns (memory-mapped), never the text again.

Line numbers are task-local here: a task does not know how many lines precede it in its file
until every task is parsed; :mod:`.passes` adds the offsets.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import criteo, rawtext, tabular
from ..format import MISSING_ID
from ..schema import Schema
from .sources import Task

COLUMNS = ("label", "dense", "ids", "lines")
# Bad lines per reason, as small codes in the part record (messages keep the reason's text).
REASONS = (
    criteo.BAD_LONG,
    criteo.BAD_FIELDS,
    criteo.BAD_LABEL,
    criteo.BAD_INT,
    criteo.BAD_HEX,
    tabular.BAD_NUMBER,
    tabular.BAD_LIST,
)


@dataclass
class Part:
    """What the parent needs to know about one parsed part (its columns are on disk)."""

    task: int
    index: int  # within its task
    file: int
    prefix: str  # path prefix of its column files
    first_line: int  # task-local index of its first line
    num_lines: int
    rows: int  # good lines
    bad_lines: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # part-local
    bad_reasons: np.ndarray = field(default_factory=lambda: np.empty(0, np.int8))  # REASONS index
    details: dict[int, str] = field(default_factory=dict)  # part-local line -> "reason (detail)"


def ids_dtype(hash_modulus: int | list[int]) -> np.dtype:
    """Hashed ids fit int32 when every modulus does (the empty value stays MISSING_ID = -1)."""
    moduli = hash_modulus if isinstance(hash_modulus, list) else [hash_modulus]
    fits = all(0 < m <= np.iinfo(np.int32).max for m in moduli)
    return np.dtype(np.int32 if fits else np.int64)


def hash_features(parsed: criteo.Parsed, s: Schema) -> None:
    """Every feature's ids (and list values) mod its column's modulus, in place."""
    dtype = ids_dtype(s.hashes)
    ids = np.empty(parsed.ids.shape, dtype=dtype)
    for j, m in enumerate(s.hashes):
        ids[j] = hash_ids(parsed.ids[j], m)
    parsed.ids = ids
    for j, (values, offsets) in parsed.lists.items():
        parsed.lists[j] = (hash_ids(values, s.hashes[j]).astype(dtype), offsets)


def hash_ids(ids: np.ndarray, modulus: int) -> np.ndarray:
    """id mod m; the empty value keeps MISSING_ID."""
    if modulus <= 0:
        return ids
    return np.where(ids == MISSING_ID, MISSING_ID, ids % modulus).astype(ids_dtype(modulus))


def load_column(prefix: str, name: str) -> np.ndarray:
    """One column of a part, memory-mapped (read-only)."""
    return np.load(f"{prefix}.{name}.npy", mmap_mode="r")


def _parsed(task: Task, chunk_bytes: int, s: Schema) -> Iterator[tuple[criteo.Parsed, int, int]]:
    """(block parsed with task-local line 0 first, its first task-local line, its lines)."""
    if s.format == "parquet":
        for table, first in tabular.iter_parquet(task.path, max(1, chunk_bytes // 256), s):
            try:
                yield tabular.parse_parquet(table, 0, s), first, table.num_rows
            except rawtext.InputError as e:  # a column of the wrong type: name the file
                raise rawtext.InputError(f"{task.path}: {e}") from None
        return
    for data, first, at_start in _blocks(task, chunk_bytes):
        n_lines = data.count(b"\n") + (not data.endswith(b"\n"))
        if s.fast:
            parsed = criteo.parse_block(data, 0, n_lines, at_file_start=at_start)
        else:
            parsed = tabular.parse_text(data, 0, at_start, s)
        yield parsed, first, n_lines


def _blocks(task: Task, chunk_bytes: int) -> Iterator[tuple[bytes, int, bool]]:
    """(data, task-local first line, starts the file) per block of the task."""
    if task.end is None:  # a whole file: plain or gzip, in chunk_bytes blocks
        for block in rawtext.iter_blocks(task.path, chunk_bytes):
            yield block.data, block.first_line, block.first_line == 0
        return
    data = rawtext.read_range(task.path, task.start, task.end)
    pos = line = 0
    while pos < len(data):  # blocks of chunk_bytes plus the rest of their last line
        cut = data.find(b"\n", min(pos + chunk_bytes, len(data)) - 1)
        stop = len(data) if cut < 0 else cut + 1
        piece = data[pos:stop]
        yield piece, line, task.start == 0 and pos == 0
        line += piece.count(b"\n") + (not piece.endswith(b"\n"))
        pos = stop


def parse_task(
    task: Task, chunk_bytes: int, schema: Schema, work: str, max_details: int
) -> tuple[list[Part], dict[str, float]]:
    """Parse one task into parts on disk; returns the parts and the seconds spent per stage.

    ``max_details``: the messages kept per part (the first ones, plus the first of each reason):
    enough for any report the parent prints, whatever the count of bad lines.  A multi-hot
    feature j also gets ``mh{j}.values`` and ``mh{j}.offsets`` ((n + 1,) int64 from 0).
    """
    parts: list[Part] = []
    secs = {"parse": 0.0, "stage": 0.0}
    blocks = _parsed(task, chunk_bytes, schema)
    t0 = time.process_time()
    for k, (parsed, first, n_lines) in enumerate(blocks):
        hash_features(parsed, schema)
        t1 = time.process_time()
        prefix = str(Path(work) / f"part-{task.index:06d}-{k:05d}")
        cols = {
            "label": parsed.label,
            "dense": parsed.dense,
            "ids": parsed.ids,
            "lines": parsed.lines.astype(np.int32),
        }
        for j, (values, offsets) in parsed.lists.items():
            cols[f"mh{j:02d}.values"], cols[f"mh{j:02d}.offsets"] = values, offsets
        for name, arr in cols.items():
            np.save(f"{prefix}.{name}.npy", np.ascontiguousarray(arr))
        secs["stage"] += time.process_time() - t1
        secs["parse"] += t1 - t0
        parts.append(_part(task, k, prefix, first, n_lines, len(parsed.label), parsed, max_details))
        t0 = time.process_time()
    return parts, secs


def _part(
    task: Task,
    k: int,
    prefix: str,
    first: int,
    n_lines: int,
    rows: int,
    parsed: criteo.Parsed,
    max_details: int,
) -> Part:
    reasons, details = _bad_fields(parsed, max_details)
    return Part(
        task.index,
        k,
        task.file,
        prefix,
        first,
        n_lines,
        rows,
        parsed.bad_lines.astype(np.int64),
        reasons,
        details,
    )


def _bad_fields(parsed: criteo.Parsed, max_details: int) -> tuple[np.ndarray, dict[int, str]]:
    """A parsed block's bad-line reasons (REASONS codes) and the messages kept: its first
    ``max_details`` and the first of each reason."""
    reasons = np.array([REASONS.index(r) for r in parsed.bad_reasons], dtype=np.int8)
    keep: set[int] = set(range(min(max_details, len(reasons))))
    keep.update(int(np.argmax(reasons == r)) for r in np.unique(reasons))  # first of each reason
    details = {
        int(parsed.bad_lines[i]): f"{parsed.bad_reasons[i]} ({parsed.bad_details[i]})" for i in keep
    }
    return reasons, details


def bad_part(parsed: criteo.Parsed, max_details: int) -> Part:
    """Only ``parsed``'s bad lines as a :class:`Part` (its lines as ``parse_block`` numbered them):
    what :meth:`BadLineLog.add` records, for a caller that parses blocks itself (predict)."""
    reasons, details = _bad_fields(parsed, max_details)
    n = len(parsed.label) + len(reasons)
    return Part(
        0, 0, 0, "", 0, n, len(parsed.label), parsed.bad_lines.astype(np.int64), reasons, details
    )
