"""The stages of one build, in order, from the raw files to a complete dataset in ``root``.

Every stage's jobs go through :class:`.workers.Runner`; what a stage hands to the next is either
small (line counts, rows per split, bad-line records: returned by the jobs) or lives in the
work area ``root/.work`` (parsed parts, partial counts, id tables), removed before the manifest.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ...files.atomic import sha256_file
from ..format import SCHEMA_VERSION, SPLITS, Manifest, SplitInfo
from ..schema import Schema
from ..stats import COUNTS, SUMMARY, format_summary, summarize, write_counts
from . import count, encode, moments, parse
from .badlines import BadLineLog, why_no_training_lines
from .errors import PreprocessError
from .output import SETTINGS
from .sources import plan_tasks
from .splits import SplitPlan, plan_splits
from .workers import Runner, star

WORK = ".work"
STAGES = ("parse", "stage", "count", "merge", "rank", "read", "encode", "write")


class Timings:
    """CPU seconds per stage (summed over workers: robust to a busy machine) and wall seconds
    per phase."""

    def __init__(self) -> None:
        self.busy = dict.fromkeys(STAGES, 0.0)
        self.wall: dict[str, float] = {}

    def add(self, secs: dict[str, float]) -> None:
        for k, v in secs.items():
            self.busy[k] += v

    def line(self) -> str:
        busy = ", ".join(f"{k} {v:.1f}" for k, v in self.busy.items())
        wall = ", ".join(f"{k} {v:.1f}" for k, v in self.wall.items())
        return f"preprocess: CPU seconds per stage: {busy}; wall seconds: {wall}"


def _bar(total: int, desc: str, unit: str, progress: bool) -> tqdm:
    return tqdm(total=total, unit=unit, unit_scale=True, desc=desc, disable=not progress)


def build(
    cfg: Any,
    files: list[Path],
    file_splits: list[str],
    wanted: dict[str, Any],
    root: Path,
    runner: Runner,
    write: Callable[[Any, Path], None],
    schema: Schema,
) -> Manifest:
    """Build the dataset into ``root`` (rank 0 writes the shared files); returns its manifest.
    A schema other than the default Criteo one is saved as ``schema.json`` (with its moments)."""
    work = root / WORK
    if runner.is_main:
        work.mkdir()
        for split in SPLITS:
            (root / split).mkdir()
    runner.gather(None)
    timings = Timings()
    progress = bool(cfg.progress) and runner.is_main

    t = time.perf_counter()
    tasks = plan_tasks(files, int(cfg.chunk_bytes), whole=schema.format == "parquet")
    modulus = int(cfg.hash_modulus)
    jobs = [
        (
            parse.parse_task,
            task,
            int(cfg.chunk_bytes),
            schema,
            str(work),
            int(cfg.bad_line_reports),
        )
        for task in tasks
    ]
    sizes = [task.size for task in runner.mine(tasks)]
    with _bar(sum(sizes), "parse", "B", progress) as bar:
        done = iter(sizes)
        results = runner.map(star, jobs, done=lambda _: bar.update(next(done)))
    parts = [p for task_parts, _ in results for p in task_parts]
    for _, secs in results:
        timings.add(secs)
    timings.wall["parse"] = time.perf_counter() - t

    t = time.perf_counter()
    header = int(schema.header)
    file_lines, spans = _line_offsets(tasks, parts, len(files), header)
    plan = plan_splits(cfg, files, file_splits, [n - header for n in file_lines], header)
    bad = BadLineLog(str(cfg.bad_lines), int(cfg.bad_line_reports))
    for part, span in zip(parts, spans):
        bad.add(files[part.file], part, span.file_line)
    split_rows, stats = _count(cfg, plan, spans, work, runner, timings, progress, schema)
    timings.wall["count"] = time.perf_counter() - t
    n_train = sum(r[0] for r in split_rows)
    if n_train == 0:
        raise PreprocessError(
            why_no_training_lines(cfg, plan, _train_bad(cfg, plan, parts, spans, files))
        )
    summary = summarize(stats)
    summary.update(min_count=int(cfg.min_count), hash_modulus=modulus, train_lines=n_train)
    if runner.is_main:
        (root / "stats").mkdir()
        write_counts(root / COUNTS, stats)
        (root / SUMMARY).write_text(json.dumps(summary, indent=2))
        print(format_summary(summary))

    t = time.perf_counter()
    table_sizes = [stats[n].table_size for n in schema.sparse]
    splits = _encode(
        cfg, spans, split_rows, table_sizes, work, root, runner, write, timings, progress, schema
    )
    timings.wall["encode"] = time.perf_counter() - t
    for msg in bad.reports:
        if runner.is_main:
            print(f"preprocess: skipped {msg}")
    if bad.counts and runner.is_main:
        print(f"preprocess: skipped {sum(bad.counts.values())} malformed lines: {bad.counts}")
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        table_sizes=table_sizes,
        splits=splits,
        stats_digest="",
        min_count=int(cfg.min_count),
        hash_modulus=modulus,
        sources=[str(p) for p in plan.files],
        split_spec=plan.spec(),
        bad_lines=dict(sorted(bad.counts.items())),
        dense_names=list(schema.dense),
        sparse_names=list(schema.sparse),
        multi_hot=list(schema.multi_hot),
        schema_digest="" if schema.is_default else schema.digest(),
    )
    runner.gather(None)  # every rank is done with the work area
    if runner.is_main:
        shutil.rmtree(work)
        manifest.stats_digest = sha256_file(root / COUNTS)
        (root / SETTINGS).write_text(json.dumps(wanted, indent=2))
        if not schema.is_default:
            schema.save(root)
        manifest.save(root)  # last: its presence marks the dataset complete
        print(timings.line())
    return manifest


def _line_offsets(
    tasks: list, parts: list[parse.Part], n_files: int, header: int
) -> tuple[list[int], list[count.PartSpan]]:
    """Lines per file, and each part's first line in its file and its file's first data line
    among all files' data lines (``header``: lines per file that are not data)."""
    task_lines = [0] * len(tasks)
    for p in parts:
        task_lines[p.task] += p.num_lines
    task_first = [0] * len(tasks)
    file_lines = [0] * n_files
    for task in tasks:
        task_first[task.index] = file_lines[task.file]
        file_lines[task.file] += task_lines[task.index]
    data_lines = [max(n - header, 0) for n in file_lines]
    file_first = np.concatenate(([0], np.cumsum(data_lines)[:-1])).astype(int).tolist()
    spans = [
        count.PartSpan(p.prefix, p.file, task_first[p.task] + p.first_line, file_first[p.file])
        for p in parts
    ]
    return file_lines, spans


def _train_bad(
    cfg: Any,
    plan: SplitPlan,
    parts: list[parse.Part],
    spans: list[count.PartSpan],
    files: list[Path],
) -> BadLineLog:
    """The malformed lines of the training split (for the error when it has no good line)."""
    log = BadLineLog("skip", 0)
    for part, span in zip(parts, spans):
        keep = plan.codes(span.file, span.global_line, part.bad_lines + span.file_line) == 0
        log.add(files[part.file], part, span.file_line, keep)
    return log


def _count(
    cfg: Any,
    plan: SplitPlan,
    spans: list[count.PartSpan],
    work: Path,
    runner: Runner,
    timings: Timings,
    progress: bool,
    schema: Schema,
) -> tuple[list[list[int]], dict]:
    """Rows per split of every part, and the ranked per-feature stats; sets the schema's
    standardize moments."""
    n_groups = max(1, min(len(spans), runner.workers * runner.world))
    bounds = [len(spans) * g // n_groups for g in range(n_groups + 1)]
    groups = [str(work / f"counts-{g:04d}") for g in range(n_groups)]
    std = tuple(i for i, t in enumerate(schema.transforms) if t == "standardize")
    multi = tuple(schema.multi_hot_mask())
    jobs: list[tuple] = [  # (function, *arguments) per job, one list per stage
        (count.count_group, plan, spans[bounds[g] : bounds[g + 1]], groups[g], multi, std)
        for g in range(n_groups)
    ]
    with _bar(len(spans), "count", "part", progress) as bar:
        results = runner.map(star, jobs, done=lambda r: bar.update(len(r[0])))
    split_rows = [rows for group_rows, _, _ in results for rows in group_rows]
    timings.add({"count": sum(secs for _, secs, _ in results)})
    for k, i in enumerate(std):
        total = results[0][2][k]
        for r in results[1:]:
            total = moments.add(total, r[2][k])
        schema.moments[schema.dense[i]] = moments.mean_std(total)
    n_sparse = len(schema.sparse)
    buckets = n_groups
    merged = [
        [str(work / f"merged-{j:02d}-{b:04d}") for b in range(buckets)] for j in range(n_sparse)
    ]
    jobs = [
        (count.merge_bucket, j, b, buckets, groups, merged[j][b], schema.id_high)
        for j in range(n_sparse)
        for b in range(buckets)
    ]
    timings.add({"merge": sum(runner.map(star, jobs))})
    prefixes = [count.feature_prefix(work, j) for j in range(n_sparse)]
    jobs = [
        (count.rank, j, merged[j], int(cfg.min_count), schema.hashes[j], prefixes[j])
        for j in range(n_sparse)
    ]
    ranked = runner.map(star, jobs)
    timings.add({"rank": sum(r.seconds for r in ranked)})
    stats = {name: count.load_stats(prefixes[j], ranked[j]) for j, name in enumerate(schema.sparse)}
    return split_rows, stats


# Per process, within one encode stage: the tables, mapped once.  Emptied when the stage ends:
# a later build in the same process (workers=1 runs the jobs here) has tables at the same paths
# (the build directory is named by the pid) with other contents.
_ENCODER: dict[tuple, encode.Encoder] = {}


def _encode_job(
    tables: tuple[str, ...],
    sizes: tuple[int, ...],
    job: encode.ShardJob,
    root: Path,
    write: Callable,
    schema: Schema,
) -> dict[str, float]:
    enc = _ENCODER.get(tables)
    if enc is None:
        _ENCODER.clear()
        enc = _ENCODER[tables] = encode.Encoder(list(tables), list(sizes), schema)
    return enc.shard(job, root, write)


def _encode(
    cfg: Any,
    spans: list[count.PartSpan],
    split_rows: list[list[int]],
    table_sizes: list[int],
    work: Path,
    root: Path,
    runner: Runner,
    write: Callable,
    timings: Timings,
    progress: bool,
    schema: Schema,
) -> dict[str, SplitInfo]:
    shard_jobs = encode.plan_shards([s.prefix for s in spans], split_rows, int(cfg.rows_per_shard))
    tables = tuple(f"{count.feature_prefix(work, j)}.table" for j in range(len(schema.sparse)))
    flat = [job for split in SPLITS for job in shard_jobs[split]]
    jobs = [(_encode_job, tables, tuple(table_sizes), job, root, write, schema) for job in flat]
    rows = [j.rows for j in runner.mine(flat)]
    try:
        with _bar(sum(rows), "encode", "row", progress) as bar:
            done = iter(rows)
            results = runner.map(star, jobs, done=lambda _: bar.update(next(done)))
    finally:
        _ENCODER.clear()
    for secs in results:
        timings.add(secs)
    return {
        split: SplitInfo(
            rows=sum(j.rows for j in shard_jobs[split]),
            shards=[j.rel for j in shard_jobs[split]],
            shard_rows=[j.rows for j in shard_jobs[split]],
        )
        for split in SPLITS
    }
