"""Raw Criteo text -> processed dataset (`dlrm-cache preprocess`); layout in :mod:`.format`.

Passes, all streaming (memory ~ distinct ids, not lines):

0. (``split: fraction`` without ``total_lines``, or a halved file under ``split: day``) count lines.
1. Count ids per feature over the *training* lines only (:class:`.stats.IdCounter`), rank them by
   (count descending, id ascending), fold ids seen fewer than ``min_count`` times into the rare row
   (the last row), write ``stats/counts.parquet`` and ``stats/summary.json``.
2. Parse every line again, map ids to ranks (ids unseen in training -> rare row), ``log1p`` the
   integers, and write parquet shards of ``rows_per_shard`` rows per split.

Lines are parsed by :mod:`.criteo`, which states the malformed-line policy.  With ``bad_lines:
skip`` malformed lines are left out, counted per reason (``Manifest.bad_lines``) and the first
``bad_line_reports`` are printed as ``path:line: reason``; with ``bad_lines: fail`` the first one
stops the run with that one-line message.  Split boundaries are physical line positions, so
malformed lines still occupy their place.  ``hash_modulus`` m > 0 maps id -> id mod m before
counting; the empty value stays :data:`.format.MISSING_ID` (-1), its own row, so a table has at most
m + 2 rows.

Re-runs: the dataset is built in a temporary sibling directory (shards under temporary names, the
manifest last) and then renamed into place, so ``output`` is either absent, the old complete
dataset or the new one; leftovers of a killed run are removed by the next run (one run per output
at a time).  An existing complete dataset is reused when its recorded inputs (path, size and a hash
of the first and last MiB of each file) and settings match, else the run stops unless
``overwrite=true``.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from tqdm import tqdm

from ..config import config_dict
from . import criteo
from .config import PreprocessConfig
from .format import (
    DENSE_NAMES,
    LABEL,
    MANIFEST,
    MISSING_ID,
    SCHEMA_VERSION,
    SPARSE_NAMES,
    SPLITS,
    Manifest,
    SplitInfo,
    recover_dir,
    replace_dir,
    resolve_path,
    sha256_file,
    write_parquet,
)
from .stats import (
    COUNTS,
    SUMMARY,
    FeatureStats,
    IdCounter,
    format_summary,
    rank_feature,
    summarize,
    write_counts,
)

SETTINGS = "preprocess.json"  # inputs + settings of the build, compared on re-runs
_OWN_ENTRIES = {"train", "val", "test", "stats", MANIFEST, SETTINGS}
_DAY_FILE = re.compile(r"^day_(\d+)(\.gz)?$")
_FINGERPRINT_BYTES = 1 << 20
# Settings that cannot change the output (acceptance of a line is a property of the line alone, so
# chunk_bytes is one of them).  Every other setting is recorded and compared on re-runs, so a
# setting added later counts as changing the output unless it is listed here.
_NOT_OUTPUT_KEYS = frozenset(
    {"input", "output", "bad_line_reports", "chunk_bytes", "cache_mb", "overwrite", "progress"}
)


class PreprocessError(ValueError):
    """A one-line, user-facing reason why preprocessing cannot run."""


# ------------------------------------------------------------------------------------ inputs
def find_sources(inp: Path) -> list[Path]:
    """A file, or a directory's day_N[.gz] files in numeric order (else its train.txt[.gz])."""
    if inp.is_file():
        return [inp.resolve()]
    if not inp.exists():
        raise PreprocessError(f"input {inp} does not exist")
    if not inp.is_dir():
        raise PreprocessError(f"input {inp} is not a regular file or a directory")
    days = sorted(
        (int(m.group(1)), p)
        for p in inp.iterdir()
        if (m := _DAY_FILE.match(p.name)) and p.is_file()
    )
    if days:
        return [p.resolve() for _, p in days]
    for name in ("train.txt", "train.txt.gz"):
        if (inp / name).is_file():
            return [(inp / name).resolve()]
    raise PreprocessError(f"input {inp}: no day_N[.gz] or train.txt[.gz] files in it")


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


# ------------------------------------------------------------------------------------ splits
@dataclass
class SplitPlan:
    """Which split each (file, line) belongs to.

    fraction: by line position over the concatenated files (``bounds`` = train end, val end, total).
    day: per file a split name, or "halve" (first half of its lines val, the rest test).
    """

    kind: str
    files: list[Path]
    bounds: tuple[int, int, int] = (0, 0, 0)
    file_splits: list[str] = field(default_factory=list)
    halve_at: dict[int, int] = field(default_factory=dict)

    def codes(self, i: int, offset: int, lines: np.ndarray) -> np.ndarray:
        """Split index (0 train, 1 val, 2 test) of the given file-local line indices of file i."""
        if self.kind == "fraction":
            return np.searchsorted(np.array(self.bounds[:2]), lines + offset, side="right").astype(
                np.int8
            )
        split = self.file_splits[i]
        if split == "halve":
            return np.where(lines < self.halve_at[i], 1, 2).astype(np.int8)
        return np.full(len(lines), SPLITS.index(split), dtype=np.int8)

    def train_stop(self, i: int, offset: int) -> int | None:
        """Pass 1: read file i up to this local line (None: to the end; 0: skip it)."""
        if self.kind == "fraction":
            return max(0, self.bounds[0] - offset)
        return None if self.file_splits[i] == "train" else 0

    def spec(self) -> dict[str, Any]:
        if self.kind == "fraction":
            a, b, n = self.bounds
            lines = {"train": [0, a], "val": [a, b], "test": [b, n]}  # half-open, 0-based
            return {"kind": "fraction", "total_lines": n, "lines": lines}
        out: dict[str, Any] = {"kind": "day", **{s: [] for s in SPLITS}, "halved": {}}
        for i, (p, s) in enumerate(zip(self.files, self.file_splits)):
            if s == "halve":
                out["val"].append(p.name)
                out["test"].append(p.name)
                out["halved"][p.name] = {
                    "val_lines": self.halve_at[i],
                    "test_from_line": self.halve_at[i],
                }
            else:
                out[s].append(p.name)
        return out


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


def plan_splits(cfg: Any, files: list[Path], file_splits: list[str], progress: bool) -> SplitPlan:
    """The split plan; counts lines where the plan needs them (see the module docstring)."""
    if cfg.split == "fraction":
        frac = float(cfg.train_fraction)
        total = int(cfg.total_lines) or sum(_count(p, progress) for p in files)
        n_train = int(total * frac)
        n_val = (total - n_train) // 2
        return SplitPlan("fraction", files, bounds=(n_train, n_train + n_val, total))
    halve_at = {
        i: _count(p, progress) // 2
        for i, (p, s) in enumerate(zip(files, file_splits))
        if s == "halve"
    }
    return SplitPlan("day", files, file_splits=file_splits, halve_at=halve_at)


def _source_key(p: Path) -> tuple:
    m = _DAY_FILE.match(p.name)
    return (0, int(m.group(1)), str(p)) if m else (1, 0, str(p))


def _count(path: Path, progress: bool) -> int:
    if progress:
        print(f"preprocess: counting lines of {path}")
    return criteo.count_lines(path)


# ------------------------------------------------------------------------------------ reading
@dataclass
class BadLineLog:
    policy: str
    max_reports: int
    counts: dict[str, int] = field(default_factory=dict)
    reports: list[str] = field(default_factory=list)
    first: dict[str, str] = field(default_factory=dict)  # reason -> its first line's message

    def add(self, path: Path, parsed: criteo.Parsed, keep: np.ndarray | None = None) -> None:
        """Record a block's bad lines (``keep``: the ones that count); raise under ``fail``."""
        for k, (line, reason) in enumerate(zip(parsed.bad_lines, parsed.bad_reasons)):
            if keep is not None and not keep[k]:
                continue
            msg = f"{path}:{int(line) + 1}: {reason} ({parsed.bad_details[k]})"
            if self.policy == "fail":
                raise criteo.BadLineError(msg)
            self.counts[reason] = self.counts.get(reason, 0) + 1
            self.first.setdefault(reason, msg)
            if len(self.reports) < self.max_reports:
                self.reports.append(msg)


def _prefetch(it: Iterator, depth: int = 2) -> Iterator:
    """Run an iterator in a background thread (parsing overlaps the consumer's numpy work)."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def work() -> None:
        try:
            for item in it:
                if stop.is_set():
                    return
                q.put(item)
            q.put(done)
        except BaseException as e:  # re-raised in the consumer
            q.put(e)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    try:
        while (item := q.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while t.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get(timeout=0.1)
            except queue.Empty:
                pass
        t.join()


@dataclass
class CachedBlock:
    first_line: int
    num_lines: int
    end: int  # text offset where the next block starts
    parsed: criteo.Parsed


class ParseCache:
    """Parsed blocks kept from pass 1 for pass 2, up to a fixed byte budget (memory stays bounded).

    It holds a prefix of each file's blocks (filling stops at the first block over the budget), so
    pass 2 takes those and then seeks to where they end.  With a budget that holds the whole
    training split (e.g. the default synthetic data) pass 2 only parses validation and test lines.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.used = 0
        self.full = False
        self.files: dict[int, list[CachedBlock]] = {}

    def put(self, i: int, block: criteo.Block, parsed: criteo.Parsed) -> None:
        size = parsed.lines.nbytes + parsed.label.nbytes + parsed.dense.nbytes + parsed.ids.nbytes
        if self.full or self.used + size > self.budget:
            self.full = True  # keep the prefix property
            return
        self.files.setdefault(i, []).append(
            CachedBlock(block.first_line, block.num_lines, block.end, parsed)
        )
        self.used += size

    def take(self, i: int) -> list[CachedBlock]:
        """File i's cached blocks, in order (removed from the cache)."""
        return self.files.pop(i, [])


def _read(
    plan: SplitPlan, chunk_bytes: int, train_only: bool, bar: tqdm, cache: ParseCache
) -> Iterator[tuple[int, int, int, criteo.Parsed]]:
    """(file index, file's global line offset, lines in the block, parsed) over the plan's files.

    Pass 1 (``train_only``) fills ``cache``; pass 2 starts each file with its cached blocks.
    """
    offset = 0
    for i, path in enumerate(plan.files):
        stop = plan.train_stop(i, offset) if train_only else None
        if stop == 0:
            if plan.kind == "fraction":
                return  # training lines are a prefix: nothing more to count
            continue
        done_bytes = bar.n
        start, n_lines = 0, 0
        for cached in [] if train_only else cache.take(i):
            yield i, offset, cached.num_lines, cached.parsed
            start, n_lines = cached.end, cached.first_line + cached.num_lines
            if not criteo.is_gzip(path):  # text offsets are file offsets
                bar.update(done_bytes + cached.end - bar.n)
        for block in criteo.iter_blocks(path, chunk_bytes, stop, start=start, start_line=n_lines):
            parsed = criteo.parse_block(block.data, block.first_line, block.num_lines)
            if train_only:
                cache.put(i, block, parsed)
            yield i, offset, block.num_lines, parsed
            n_lines = block.first_line + block.num_lines
            bar.update(done_bytes + block.bytes_read - bar.n)
        offset += n_lines


# ------------------------------------------------------------------------------------ pass 1
def _bar(total_bytes: int, desc: str, progress: bool) -> tqdm:
    return tqdm(total=total_bytes, unit="B", unit_scale=True, desc=desc, disable=not progress)


def _hash(ids: np.ndarray, modulus: int) -> np.ndarray:
    """id mod m; the empty value keeps MISSING_ID."""
    if modulus <= 0:
        return ids
    return np.where(ids == MISSING_ID, MISSING_ID, ids % modulus)


def count_ids(
    plan: SplitPlan, cfg: Any, bad: BadLineLog, cache: ParseCache
) -> tuple[dict[str, FeatureStats], int]:
    """Pass 1: per-feature stats over the training lines; returns them and the count of good
    training lines.  ``bad`` gets the malformed training lines (pass 2 reports every split's)."""
    counters = [IdCounter() for _ in SPARSE_NAMES]
    total_bytes = sum(p.stat().st_size for p in plan.files)
    n_train = 0
    bar = _bar(total_bytes, "pass 1/2 (count ids)", cfg.progress)
    with bar:
        for i, offset, _n, parsed in _prefetch(_read(plan, int(cfg.chunk_bytes), True, bar, cache)):
            bad.add(plan.files[i], parsed, plan.codes(i, offset, parsed.bad_lines) == 0)
            train = plan.codes(i, offset, parsed.lines) == 0
            ids = parsed.ids if train.all() else parsed.ids[:, train]
            ids = _hash(ids, int(cfg.hash_modulus))
            n_train += ids.shape[1]
            for j, c in enumerate(counters):
                c.add(ids[j])
    stats = {}
    for name, c in zip(SPARSE_NAMES, counters):
        ids, counts = c.result()
        stats[name] = rank_feature(ids, counts, int(cfg.min_count))
    return stats, n_train


# ------------------------------------------------------------------------------------ pass 2
class RankLookup:
    """id -> row for one feature: its rank if kept, else the rare (last) row."""

    def __init__(self, fs: FeatureStats, dtype: np.dtype) -> None:
        self.index = pd.Index(fs.ids)  # hash table: O(1) per lookup even for 10M-id tables
        self.rare = fs.table_size - 1
        self.dtype = dtype

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        pos = self.index.get_indexer(ids)  # position in rank order, -1 if not kept
        return np.where(pos >= 0, pos, self.rare).astype(self.dtype)


def _write_shard(table: pa.Table, path: Path) -> None:
    """Write a shard under a temporary name, then rename it into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    # lz4 without dictionary pages: ~3x faster to write than the defaults, ~30% larger.
    write_parquet(
        table, tmp, row_group_size=table.num_rows, compression="lz4", use_dictionary=False
    )
    os.replace(tmp, path)


class AsyncWriter:
    """Writes shards on two threads (parquet encoding releases the GIL), a bounded number in flight."""

    def __init__(self, workers: int = 2) -> None:
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.pending: deque[Future] = deque()
        self.workers = workers

    def submit(self, table: pa.Table, path: Path) -> None:
        while len(self.pending) >= self.workers:
            self.pending.popleft().result()  # re-raises a writer's error here
        self.pending.append(self.pool.submit(_write_shard, table, path))

    def close(self) -> None:
        """Wait for every shard; raises the first writer error."""
        while self.pending:
            self.pending.popleft().result()
        self.pool.shutdown(wait=True)

    def abort(self) -> None:
        """Stop without raising (after another error; a no-op after close)."""
        self.pool.shutdown(wait=True, cancel_futures=True)


class ShardWriter:
    """Buffers rows of one split and writes exactly ``rows_per_shard`` rows per shard."""

    def __init__(self, root: Path, split: str, rows_per_shard: int, io: AsyncWriter) -> None:
        self.root, self.split, self.rows_per_shard, self.io = root, split, rows_per_shard, io
        (root / split).mkdir(parents=True, exist_ok=True)
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.buffered = 0
        self.info = SplitInfo(rows=0, shards=[], shard_rows=[])

    def add(self, label: np.ndarray, dense: np.ndarray, rows: np.ndarray) -> None:
        """label (n,), dense (13, n), rows (26, n)."""
        if len(label) == 0:
            return
        self.parts.append((label, dense, rows))
        self.buffered += len(label)
        if self.buffered >= self.rows_per_shard:
            self._flush(final=False)

    def close(self) -> SplitInfo:
        self._flush(final=True)
        return self.info

    def _flush(self, final: bool) -> None:
        if not self.parts:
            return
        label = np.concatenate([p[0] for p in self.parts])
        dense = np.concatenate([p[1] for p in self.parts], axis=1)
        rows = np.concatenate([p[2] for p in self.parts], axis=1)
        start = 0
        while len(label) - start >= self.rows_per_shard or (final and start < len(label)):
            stop = min(start + self.rows_per_shard, len(label))
            self._write(label[start:stop], dense[:, start:stop], rows[:, start:stop])
            start = stop
        self.parts = (
            [(label[start:], dense[:, start:], rows[:, start:])] if start < len(label) else []
        )
        self.buffered = len(label) - start

    def _write(self, label: np.ndarray, dense: np.ndarray, rows: np.ndarray) -> None:
        cols = {LABEL: pa.array(label)}
        cols.update({n: pa.array(dense[i]) for i, n in enumerate(DENSE_NAMES)})
        cols.update({n: pa.array(rows[j]) for j, n in enumerate(SPARSE_NAMES)})
        rel = f"{self.split}/part-{len(self.info.shards):05d}.parquet"
        self.io.submit(pa.table(cols), self.root / rel)
        self.info.shards.append(rel)
        self.info.shard_rows.append(len(label))
        self.info.rows += len(label)


def write_shards(
    plan: SplitPlan,
    cfg: Any,
    stats: dict[str, FeatureStats],
    root: Path,
    bad: BadLineLog,
    cache: ParseCache,
) -> tuple[dict[str, SplitInfo], int]:
    """Pass 2: every line -> (label, log1p dense, ranks) -> shards.  Returns splits and lines read."""
    big = max(fs.table_size for fs in stats.values()) > np.iinfo(np.int32).max
    lookups = [RankLookup(stats[n], np.dtype(np.int64 if big else np.int32)) for n in SPARSE_NAMES]
    io = AsyncWriter()
    writers = [ShardWriter(root, s, int(cfg.rows_per_shard), io) for s in SPLITS]
    total_bytes = sum(p.stat().st_size for p in plan.files)
    lines_read = 0
    bar = _bar(total_bytes, "pass 2/2 (write shards)", cfg.progress)
    try:
        for i, offset, num_lines, parsed in _prefetch(
            _read(plan, int(cfg.chunk_bytes), False, bar, cache)
        ):
            bad.add(plan.files[i], parsed)
            lines_read += num_lines
            codes = plan.codes(i, offset, parsed.lines)
            ids = _hash(parsed.ids, int(cfg.hash_modulus))
            rows = np.empty(ids.shape, dtype=lookups[0].dtype)  # (26, n)
            for j, lookup in enumerate(lookups):
                rows[j] = lookup(ids[j])
            for s, w in enumerate(writers):
                sel = codes == s
                if sel.all():
                    w.add(parsed.label, parsed.dense, rows)
                elif sel.any():
                    w.add(parsed.label[sel], parsed.dense[:, sel], rows[:, sel])
        splits = {s: w.close() for s, w in zip(SPLITS, writers)}
        io.close()  # every shard is on disk (or its error raised) before the manifest is written
    finally:
        io.abort()
        bar.close()
    return splits, lines_read


# ------------------------------------------------------------------------------------ output dir
def _settings(cfg: Any, plan_files: list[Path]) -> dict[str, Any]:
    d = config_dict(cfg)
    return {
        "inputs": [fingerprint(p) for p in plan_files],
        "line_policy": criteo.LINE_POLICY_VERSION,
        **{k: v for k, v in sorted(d.items()) if k not in _NOT_OUTPUT_KEYS},
    }


def _check_reuse(out: Path, settings: dict[str, Any], overwrite: bool) -> Manifest | None:
    """The existing dataset if it can be reused; None if it must be (re)built."""
    if not (out / MANIFEST).exists() or overwrite:
        return None
    try:
        recorded = json.loads((out / SETTINGS).read_text())
    except (OSError, ValueError):
        recorded = None
    if recorded == settings:
        return Manifest.load(out)
    changed = sorted(k for k in settings if recorded is None or recorded.get(k) != settings[k])
    raise PreprocessError(
        f"{out} already holds a dataset built from other inputs/settings ({', '.join(changed) or 'unknown'}); "
        "pass overwrite=true to rebuild it"
    )


def _clean_stale(out: Path) -> None:
    """Remove build directories left by killed runs, and finish a replacement a kill interrupted
    (the old dataset back if the new one never arrived)."""
    recover_dir(out)
    for p in out.parent.glob(f".{out.name}.*"):
        if p.is_dir() and re.fullmatch(rf"\.{re.escape(out.name)}\.tmp-\d+", p.name):
            shutil.rmtree(p)


def _check_replaceable(out: Path) -> None:
    """Refuse to replace a directory that holds anything but a (partial) dataset of ours."""
    if not out.exists():
        return
    if not out.is_dir():
        raise PreprocessError(f"output {out} exists and is not a directory")
    foreign = [
        p.name for p in out.iterdir() if p.name not in _OWN_ENTRIES and not p.name.startswith(".")
    ]
    if foreign:
        raise PreprocessError(
            f"output {out} holds files that are not a processed dataset ({', '.join(sorted(foreign)[:3])}); "
            "choose another output"
        )


def _build(cfg: Any, plan: SplitPlan, settings: dict[str, Any], root: Path) -> Manifest:
    cache = ParseCache(int(cfg.cache_mb) << 20)
    train_bad = BadLineLog(str(cfg.bad_lines), 0)
    stats, n_train = count_ids(plan, cfg, train_bad, cache)
    if n_train == 0:
        raise PreprocessError(_why_no_training_lines(cfg, plan, train_bad))
    summary = summarize(stats)
    summary.update(
        min_count=int(cfg.min_count), hash_modulus=int(cfg.hash_modulus), train_lines=n_train
    )
    (root / "stats").mkdir(parents=True)
    write_counts(root / COUNTS, stats)
    (root / SUMMARY).write_text(json.dumps(summary, indent=2))
    print(format_summary(summary))

    bad = BadLineLog(str(cfg.bad_lines), int(cfg.bad_line_reports))
    splits, lines_read = write_shards(plan, cfg, stats, root, bad, cache)
    if plan.kind == "fraction" and lines_read != plan.bounds[2]:
        raise PreprocessError(
            f"total_lines={plan.bounds[2]} but the inputs have {lines_read} lines; fix or drop total_lines"
        )
    for msg in bad.reports:
        print(f"preprocess: skipped {msg}")
    if bad.counts:
        print(f"preprocess: skipped {sum(bad.counts.values())} malformed lines: {bad.counts}")
    (root / SETTINGS).write_text(json.dumps(settings, indent=2))
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        table_sizes=[stats[n].table_size for n in SPARSE_NAMES],
        splits=splits,
        stats_digest=sha256_file(root / COUNTS),
        min_count=int(cfg.min_count),
        hash_modulus=int(cfg.hash_modulus),
        sources=[str(p) for p in plan.files],
        split_spec=plan.spec(),
        bad_lines=dict(sorted(bad.counts.items())),
    )
    manifest.save(root)  # last: its presence marks the dataset complete
    return manifest


def _why_no_training_lines(cfg: Any, plan: SplitPlan, bad: BadLineLog) -> str:
    """The one-line error when pass 1 found no good training line: which lines there were and why
    each kind was rejected (with its first line), plus what that usually means."""
    where = f"no valid training lines in {', '.join(map(str, plan.files))} (split={cfg.split})"
    if not bad.counts:
        if plan.kind == "day":
            return f"{where}: the training files have no lines"
        total = plan.bounds[2]
        if total == 0:
            return f"{where}: the input has no lines"
        return f"{where}: {total} line(s) in all, and train_fraction={float(cfg.train_fraction):g} leaves none for training"
    per_reason = "; ".join(
        f"{reason}: {n} (first: {bad.first[reason]})"
        for reason, n in sorted(bad.counts.items(), key=lambda kv: -kv[1])
    )
    hints = []
    if f"({criteo.NUM_FIELDS - 1} fields, expected" in bad.first.get(criteo.BAD_FIELDS, ""):
        hints.append(
            f"{criteo.NUM_FIELDS - 1} fields is a file without the label column, like Criteo's test files"
        )
    if re.search(r":1: ", bad.first.get(criteo.BAD_LABEL, "")):
        hints.append("line 1 looks like a header (Criteo files have none)")
    hints.append("the input must be raw Criteo text: label, 13 integers, 26 hex ids, tab-separated")
    return f"{where}: all {sum(bad.counts.values())} training lines are malformed. {per_reason}. ({'; '.join(hints)})"


def preprocess(cfg: PreprocessConfig | Any) -> Manifest:
    """Build (or reuse) the processed dataset described by ``cfg``; returns its manifest."""
    from hydra.utils import to_absolute_path

    inp = resolve_path(to_absolute_path(str(cfg.input)), "input")
    out = resolve_path(to_absolute_path(str(cfg.output)), "output")
    sources = find_sources(inp)
    if any(out == p or out in p.parents for p in [inp, *sources]):
        raise PreprocessError(f"output {out} would contain the input {inp}; choose another output")
    out.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(out)

    t0 = time.perf_counter()
    files, file_splits = select_files(cfg, inp, sources)
    settings = _settings(cfg, files)
    reused = _check_reuse(out, settings, bool(cfg.overwrite))
    if reused is not None:
        print(f"preprocess: up to date, reusing {out}")
        return reused
    _check_replaceable(out)

    root = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        root.mkdir()  # first, so an output that cannot be written fails before any reading
    except PermissionError as e:
        raise PreprocessError(
            f"output {out}: cannot create files in {out.parent} ({e.strerror})"
        ) from None
    try:
        plan = plan_splits(cfg, files, file_splits, bool(cfg.progress))
        manifest = _build(cfg, plan, settings, root)
        replace_dir(root, out)  # the old dataset stays complete until the new one is in
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    dt = time.perf_counter() - t0
    lines = sum(s.rows for s in manifest.splits.values()) + sum(manifest.bad_lines.values())
    print(f"preprocess: {lines} lines in {dt:.1f}s ({lines / dt:,.0f} lines/s) -> {out}")
    return manifest
