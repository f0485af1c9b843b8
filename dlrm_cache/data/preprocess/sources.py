"""Which raw files to read, in which order, in which pieces (tasks), and how to recognise them.

A task is a byte range of one plain file (``chunk_bytes``, at least 64 KiB) or a whole gzip file
(gzip cannot be entered in the middle).  A range owns the lines that *start* inside it: it begins
after the first line end at or after ``start - 1`` and reads through the line that crosses ``end``.
Acceptance of a line is a property of the line alone (:mod:`..criteo`), so where the ranges fall
cannot change the output: the task list is a unit of work, not of meaning.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import criteo, rawtext
from .errors import PreprocessError

_FINGERPRINT_BYTES = 1 << 20


@dataclass(frozen=True)
class Task:
    """A piece of one input file parsed by one worker: bytes [start, end) (end None: to EOF)."""

    index: int  # position in the global read order
    file: int  # index into the plan's files
    path: str
    start: int
    end: int | None
    size: int  # bytes of the file this task covers (for the progress bar)


def find_sources(inp: Path, suffix: str = "") -> list[Path]:
    """A file, or a directory's day_N[.gz] files in numeric order (else, with ``suffix``, e.g.
    ".csv", its files named *.csv[.gz] in name order; else its train.txt[.gz])."""
    if inp.is_file():
        return [inp.resolve()]
    if not inp.exists():
        raise PreprocessError(f"input {inp} does not exist")
    if not inp.is_dir():
        raise PreprocessError(f"input {inp} is not a regular file or a directory")
    days = sorted(
        (int(m.group(1)), p)
        for p in inp.iterdir()
        if (m := criteo.DAY_FILE.match(p.name)) and p.is_file()
    )
    if days:
        return [p.resolve() for _, p in days]
    named = sorted(
        p
        for p in inp.iterdir()
        if suffix
        and p.name.endswith((suffix, f"{suffix}.gz" if suffix != ".parquet" else suffix))
        and p.is_file()
    )
    if suffix:
        _refuse_foreign(inp, suffix, named)
    if named:
        return [p.resolve() for p in named]
    for name in ("train.txt", "train.txt.gz"):
        if (inp / name).is_file():
            return [(inp / name).resolve()]
    also = f" or *{suffix}" if suffix else ""
    raise PreprocessError(f"input {inp}: no day_N[.gz]{also} or train.txt[.gz] files in it")


# a data file by its name (any case, any compression): read, or refused when another format's
_DATA_NAME = re.compile(r"\.(csv|tsv|parquet)(\.[A-Za-z0-9]+)?$", re.IGNORECASE)


def _pattern(suffix: str) -> str:
    return f"*{suffix}" if suffix == ".parquet" else f"*{suffix}[.gz]"


def _refuse_foreign(inp: Path, suffix: str, named: list[Path]) -> None:
    """A directory holding data files this format does not read (another format, ``.CSV``,
    ``.csv.bz2``) is refused: reading only part of what the user gave would be a silent loss.
    Hidden and ``_``-prefixed files (``.crc``, ``_SUCCESS``) are not data."""
    foreign = sorted(
        p.name
        for p in inp.iterdir()
        if p.is_file() and p not in named and _DATA_NAME.search(p.name)
        and not p.name.startswith((".", "_"))
    )  # fmt: skip
    if foreign:
        listed = ", ".join(foreign[:5]) + (
            f" (+{len(foreign) - 5} more)" if len(foreign) > 5 else ""
        )
        raise PreprocessError(
            f"input {inp}: holds {listed}, which format={suffix[1:]} does not read (it reads"
            f" {_pattern(suffix)}): move them out, or give one file as input="
        )


def skipped_files(inp: Path, sources: list[Path]) -> str:
    """'' or the line naming the files of input directory ``inp`` that are not read."""
    if not inp.is_dir():
        return ""
    read = set(sources)
    other = sorted(p.name for p in inp.iterdir() if p.is_file() and p.resolve() not in read)
    if not other:
        return ""
    listed = ", ".join(other[:5]) + (f" (+{len(other) - 5} more)" if len(other) > 5 else "")
    return f"preprocess: input {inp}: not read ({len(other)} file(s) of no input name): {listed}"


def fingerprint(path: Path) -> dict[str, Any]:
    """Cheap identity of an input: size plus sha256 of its first and last MiB (not the mtime)."""
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(_FINGERPRINT_BYTES))
        if size > _FINGERPRINT_BYTES:
            f.seek(max(_FINGERPRINT_BYTES, size - _FINGERPRINT_BYTES))
            h.update(f.read())
    return {"path": str(path), "size": size, "head_tail_sha256": h.hexdigest()}


def _resolve_names(names: list[str], inp: Path) -> list[Path]:
    base = inp if inp.is_dir() else inp.parent
    out = []
    for n in names:
        p = Path(n) if Path(n).is_absolute() else base / n
        if not p.is_file():
            raise PreprocessError(f"split file {n!r} not found under {base}")
        out.append(p.resolve())
    return out


def select_files(cfg: Any, inp: Path, sources: list[Path]) -> tuple[list[Path], list[str]]:
    """The files to read, in day order, and (split=day) each file's split or "halve"."""
    if cfg.split == "fraction":
        return sources, []
    if not (cfg.train_files or cfg.val_files or cfg.test_files):
        if len(sources) < 2:
            raise PreprocessError(
                f"split=day needs at least 2 input files, found {len(sources)} in {inp}"
            )
        train, val, test = sources[:-1], sources[-1:], sources[-1:]
    else:
        train, val, test = (
            _resolve_names(list(x), inp) for x in (cfg.train_files, cfg.val_files, cfg.test_files)
        )
    files: list[Path] = []
    splits: list[str] = []
    for names, split in ((train, "train"), (val, "val"), (test, "test")):
        for p in names:
            s = "halve" if split != "train" and p in val and p in test else split
            if p in files:
                if s == "halve":
                    continue
                raise PreprocessError(f"{p.name} is listed in more than one split")
            files.append(p)
            splits.append(s)
    order = sorted(range(len(files)), key=lambda k: _source_key(files[k]))  # read in day order
    return [files[k] for k in order], [splits[k] for k in order]


def _source_key(p: Path) -> tuple:
    m = criteo.DAY_FILE.match(p.name)
    return (0, int(m.group(1)), str(p)) if m else (1, 0, str(p))


MIN_TASK_BYTES = 64 << 10  # a task's fixed costs (a job, its files) stay small next to parsing


def plan_tasks(files: list[Path], chunk_bytes: int, whole: bool = False) -> list[Task]:
    """The read order cut into tasks: byte ranges of max(chunk_bytes, MIN_TASK_BYTES) of plain
    files, whole gzip files (``whole``: every file whole, e.g. parquet)."""
    task_bytes = max(chunk_bytes, MIN_TASK_BYTES)
    tasks: list[Task] = []
    for i, p in enumerate(files):
        size = p.stat().st_size
        if whole or rawtext.is_gzip(p) or size <= task_bytes:
            tasks.append(Task(len(tasks), i, str(p), 0, None, size))
            continue
        for s in range(0, size, task_bytes):
            e = min(s + task_bytes, size)
            tasks.append(Task(len(tasks), i, str(p), s, e, e - s))
    return tasks
