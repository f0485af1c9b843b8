"""MLPerf DLRM v2's synthetic multi-hot set, made from a processed one-hot dataset
(`dlrm-cache preprocess input=<dataset> output=<new> multi_hot_sizes=mlperf`).

MLPerf's rule (torchrec_dlrm's ``multi_hot.py``, applied by
``materialize_synthetic_multihot_dataset.py``): for table ``j`` of ``n_j`` rows and size ``s_j``, a
lookup table ``T_j`` of ``n_j x (s_j - 1)`` ids is drawn once, from numpy's legacy generator seeded
with ``seed`` (0 in MLPerf), table after table in feature order: ``randint(0, n_j, (n_j, s_j - 1))``
(``uniform``) or ``pareto(a=0.25, (n_j, s_j - 1)).astype(int32) % n_j`` (``pareto``); a sample's
one-hot id ``x`` becomes the list ``[x, *T_j[x]]`` (so every list of a table has ``s_j`` ids).
:func:`lookup_tables` draws the same numbers, in blocks of rows into memory-mapped files of the
build directory (one draw over all rows gives the same numbers as the blocks; tests check it).

What differs from MLPerf's files: ``n_j`` and ``x`` are the input dataset's rows (its frequency
ranks, the rare row included), not MLPerf's ids after their modulus, so the lists hold other
numbers than MLPerf's even where the one-hot data were the same.  The result is a complete
processed dataset like preprocess's: every id of every training list counted
(``stats/counts.parquet``; an ``id`` there is an input row), tables re-ranked by those counts
(rank 0 = hottest, ties by the smaller id, the rare row last; the input's rare row stays the rare
row, together with ids seen fewer than ``min_count`` times, which cannot happen with the input's
own ``min_count``), the same splits and shards (row for row), features of size 1 one-hot.
Memory: a shard at a time; the lookup tables are memory-mapped files.  Two passes over the
shards (count, then encode), each a job per shard run by the preprocess workers.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..files.atomic import one_line, sha256_file
from .format import MANIFEST, MLPERF_MULTI_HOT_SIZES, Manifest
from .idrange import check_ids
from .parquet import read_parquet, write_shard
from .preprocess.errors import PreprocessError
from .preprocess.workers import Runner, star
from .schema import SCHEMA_FILE
from .stats import (
    COUNTS,
    SUMMARY,
    FeatureStats,
    format_summary,
    rank_feature,
    sum_by_id,
    summarize,
    write_counts,
)

PARETO_A = 0.25  # MLPerf's shape parameter
_BLOCK_IDS = 1 << 22  # lookup-table ids drawn (and written) at a time
WORK = ".work"


def parse_sizes(value: Any, count: int, key: str = "multi_hot_sizes") -> list[int]:
    """Ids per sample of each of ``count`` features from a config value: ``"mlperf"``
    (:data:`MLPERF_MULTI_HOT_SIZES`, 26 features), one int (every feature's size) or ``count``
    ints >= 1; ``[]`` -> all 1.  Anything else (a float, a word) is refused naming ``key``: a
    size is never rounded."""
    if isinstance(value, str):
        if value != "mlperf":
            raise ValueError(f"{key}={value!r}: the only preset is 'mlperf' (or give {count} ints)")
        if count != len(MLPERF_MULTI_HOT_SIZES):
            raise ValueError(f"{key}=mlperf: has 26 sizes, the data have {count} features")
        return list(MLPERF_MULTI_HOT_SIZES)
    if _is_int(value):
        value = [value] * count
    try:
        items = list(value)
    except TypeError:
        raise ValueError(
            f"{key}={value!r}: give 'mlperf', one int or a list of {count} ints"
        ) from None
    for i, s in enumerate(items):
        if not _is_int(s):
            raise ValueError(f"{key}[{i}]={s!r}: not an integer (ids per sample)")
    sizes = [int(s) for s in items]
    if sizes and (len(sizes) != count or min(sizes) < 1):
        raise ValueError(f"{key}: need {count} ints >= 1, got {sizes}")
    return sizes or [1] * count


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def check_room(
    sizes: list[int], source: Manifest, out: Path, workers: int, key: str = "multi_hot_sizes"
) -> None:
    """Refuse, naming ``key`` and the bytes, sizes whose work does not fit: the lookup tables
    (memory-mapped files beside ``out``) on its file system, or a shard's lists expanded in
    memory by each of ``workers`` (the ids, np.unique's sorted copy and the counts) in
    MemAvailable.  Checked before anything is drawn: a size of 10^8 would otherwise run until
    the disk is full or numpy fails to allocate."""
    from ..parallel.placement import available_host_bytes

    tables = sum(
        n * (s - 1) * (4 if n <= np.iinfo(np.int32).max else 8)
        for s, n in zip(sizes, source.table_sizes)
    )
    where = next(p for p in (out.parent, *out.parent.parents) if p.exists())
    free = shutil.disk_usage(where).free
    if tables > free:
        raise PreprocessError(
            f"{key}: the lookup tables need {tables:,} bytes ({tables / 2**30:,.1f} GiB; table "
            f"rows x (size - 1) ids) but {where} has {free:,} free; give smaller sizes"
        )
    rows = max((r for info in source.splits.values() for r in info.shard_rows), default=0)
    j = int(np.argmax(sizes))
    need = rows * sizes[j] * 8 * 3 * max(1, workers)
    avail = available_host_bytes(1)
    if need > avail:
        raise PreprocessError(
            f"{key}: size {sizes[j]} of {source.sparse_names[j]} expands a shard of {rows:,} rows "
            f"to {need:,} bytes ({need / 2**30:,.1f} GiB, over {max(1, workers)} workers) but "
            f"{avail:,.0f} bytes of memory are available; give smaller sizes"
        )


def _draw(rs: np.random.RandomState, rows: int, extra: int, n: int, dist: str) -> np.ndarray:
    """MLPerf's extra ids of ``rows`` consecutive rows of a table of ``n`` rows."""
    if dist == "uniform":
        return rs.randint(0, n, size=(rows, extra))
    with np.errstate(invalid="ignore", over="ignore"):  # huge draws cast as MLPerf's do
        return rs.pareto(a=PARETO_A, size=(rows, extra)).astype(np.int32) % n


def lookup_tables(
    sizes: list[int], rows: list[int], dist: str, seed: int, work: Path
) -> list[Path | None]:
    """MLPerf's lookup tables (int32 ``.npy`` files ``[n_j, s_j - 1]`` in ``work``; None for
    ``s_j == 1``), from one generator seeded with ``seed``, drawn in table order."""
    rs = np.random.RandomState(seed)
    out: list[Path | None] = []
    for j, (s, n) in enumerate(zip(sizes, rows)):
        if s == 1:  # MLPerf draws an empty array here: nothing of the stream is used
            out.append(None)
            continue
        path = work / f"lookup-{j:03d}.npy"
        dtype = np.int32 if n <= np.iinfo(np.int32).max else np.int64  # MLPerf's: int32
        table = np.lib.format.open_memmap(path, "w+", dtype, (n, s - 1))
        step = max(1, _BLOCK_IDS // (s - 1))
        for lo in range(0, n, step):
            table[lo : lo + step] = _draw(rs, min(step, n - lo), s - 1, n, dist)
        table.flush()
        del table
        out.append(path)
    return out


def expand(ids: np.ndarray, table: np.ndarray | None) -> np.ndarray:
    """One-hot ids ``[n]`` -> their lists ``[n, s]`` (``[x, *T[x]]``; no table: ``[n, 1]``)."""
    if table is None:
        return ids[:, None]
    return np.concatenate([ids[:, None].astype(table.dtype), table[ids]], axis=1)


def _tables(paths: list[str | None]) -> list[np.ndarray | None]:
    return [None if p is None else np.load(p, mmap_mode="r") for p in paths]


def _count_shard(
    path: str, names: list[str], paths: list[str | None], sizes: list[int]
) -> list[tuple]:
    """Per feature, the (ids, counts) of every list element of a training shard."""
    table = read_parquet(path, columns=names)
    check_ids(table, Path(path), names, sizes)
    out = []
    for name, lookup in zip(names, _tables(paths)):
        ids, counts = np.unique(expand(table.column(name).to_numpy(), lookup), return_counts=True)
        out.append((ids.astype(np.int64), counts.astype(np.int64)))
    return out


def rerank(
    ids: np.ndarray, counts: np.ndarray, n: int, min_count: int
) -> tuple[FeatureStats, np.ndarray]:
    """The new table of a feature whose input had ``n`` rows, from the training counts of its
    ids: (FeatureStats, new row of every input row).  The input's rare row ``n - 1`` stays the
    rare row (so does any id below ``min_count``); ids never counted go there too."""
    rare = ids == n - 1
    fs = rank_feature(ids[~rare], counts[~rare], min_count)
    fs.rare_count += int(counts[rare].sum())
    fs.rare_ids += int(rare.any())
    new = np.full(n, len(fs.ids), np.int64)
    new[fs.ids] = np.arange(len(fs.ids))
    return fs, new


def _encode_shard(
    src: str, dst: str, names: list[str], paths: list, ranks: list[str], sizes: list[int]
) -> int:
    """Write the multi-hot shard ``dst`` of input shard ``src`` (same rows, same order)."""
    table = read_parquet(src)
    check_ids(table, Path(src), names, sizes)
    cols = {c: table.column(c) for c in table.column_names if c not in names}
    for name, lookup, rank_path in zip(names, _tables(paths), ranks):
        new = np.load(rank_path, mmap_mode="r")
        lists = new[expand(table.column(name).to_numpy(), lookup)]
        dtype = np.int32 if len(new) and new.max() <= np.iinfo(np.int32).max else np.int64
        if lookup is None:
            cols[name] = pa.array(lists[:, 0].astype(dtype))
        else:
            offsets = np.arange(0, lists.size + 1, lists.shape[1], dtype=np.int32)
            cols[name] = pa.ListArray.from_arrays(
                offsets, pa.array(lists.reshape(-1).astype(dtype))
            )
    write_shard(pa.table({c: cols[c] for c in table.column_names}), dst)
    return table.num_rows


def materialize(cfg: Any, inp: Path, out: Path, runner: Runner) -> Manifest:
    """Build (or reuse) the multi-hot dataset ``out`` from the one-hot dataset ``inp``, with
    preprocess's guarantees: a temporary sibling directory renamed into place, manifest last, an
    up-to-date output reused, another one replaced only with ``overwrite``."""
    from ..files.outputs import DATASET, UnsafeOutput, check_output
    from .preprocess.output import prepare, publish

    source, sizes = _source(cfg, inp)
    check_room(sizes, source, out, runner.workers)
    try:
        check_output(out, "output", [("input", inp)], makes=DATASET)
        wanted = {
            **settings(cfg, source, sizes),
            "input_shards": source.check_shards(inp, list(source.splits)),
        }
    except (UnsafeOutput, ValueError, OSError) as e:
        raise PreprocessError(one_line(e)) from None
    reused, root = prepare(out, wanted, bool(cfg.overwrite), runner)
    if reused is not None:
        return reused
    assert root is not None

    def make() -> Manifest:
        manifest, stats = build(cfg, inp, source, sizes, root, runner)
        if runner.is_main:
            finish(root, manifest, stats, wanted)
        return manifest

    manifest = publish(root, out, runner, make)
    if runner.is_main:
        print(f"preprocess: multi-hot {manifest.multi_hot} ({sizes}) -> {out}")
    return manifest


def _source(cfg: Any, inp: Path) -> tuple[Manifest, list[int]]:
    """The input dataset and the sizes asked for, or the one-line error why not."""
    if not (inp / MANIFEST).is_file():
        raise PreprocessError(
            f"multi_hot_sizes: input {inp} is not a processed dataset (no {MANIFEST}); MLPerf's "
            "multi-hot set is made from one: preprocess the raw data first"
        )
    try:
        source = Manifest.load(inp, key="input")
    except (ValueError, OSError) as e:
        raise PreprocessError(one_line(e)) from None
    if source.multi_hot:
        raise PreprocessError(
            f"input {inp}: already multi-hot ({', '.join(source.multi_hot)}); give a one-hot dataset"
        )
    if not cfg.multi_hot_sizes:
        raise PreprocessError(
            f"input {inp} is a processed dataset: set multi_hot_sizes (mlperf, or "
            f"{len(source.sparse_names)} ints) to make its multi-hot version"
        )
    try:
        sizes = parse_sizes(cfg.multi_hot_sizes, len(source.sparse_names))
    except ValueError as e:
        raise PreprocessError(str(e)) from None
    return source, sizes


def settings(cfg: Any, source: Manifest, sizes: list[int]) -> dict[str, Any]:
    """What the output is a function of: the input dataset and the materialization's settings."""
    return {
        "input_identity": source.identity(),
        "multi_hot_sizes": sizes,
        "multi_hot_distribution": str(cfg.multi_hot_distribution),
        "multi_hot_seed": int(cfg.multi_hot_seed),
    }


def build(
    cfg: Any, inp: Path, source: Manifest, sizes: list[int], root: Path, runner: Runner
) -> tuple[Manifest, dict[str, FeatureStats]]:
    """Lookup tables, count pass, re-ranking and encode pass into ``root``: the new manifest
    (unsaved) and statistics."""
    names, work, rows = list(source.sparse_names), root / WORK, source.table_sizes
    tables: list[str | None] = []
    if runner.is_main:
        work.mkdir()
        for split in source.splits:
            (root / split).mkdir()
        if (inp / SCHEMA_FILE).is_file():  # how raw values became the rows: the lists' ids too
            shutil.copyfile(inp / SCHEMA_FILE, root / SCHEMA_FILE)
        dist, seed = str(cfg.multi_hot_distribution), int(cfg.multi_hot_seed)
        tables = [
            None if p is None else str(p) for p in lookup_tables(sizes, rows, dist, seed, work)
        ]
    tables = runner.share(tables)
    train = [str(inp / rel) for rel in source.splits["train"].shards]
    parts = runner.map(star, [(_count_shard, p, names, tables, rows) for p in train])
    stats: dict[str, FeatureStats] = {}
    ranks = [str(work / f"rank-{j:03d}.npy") for j in range(len(names))]
    for j, name in enumerate(names):
        ids, counts = sum_by_id(
            np.concatenate([p[j][0] for p in parts]), np.concatenate([p[j][1] for p in parts])
        )
        stats[name], new = rerank(ids, counts, rows[j], source.min_count)
        if runner.is_main:
            np.save(ranks[j], new)
    runner.gather(None)  # the rank files are written
    jobs = [
        (_encode_shard, str(inp / rel), str(root / rel), names, tables, ranks, rows)
        for info in source.splits.values()
        for rel in info.shards
    ]
    runner.map(star, jobs)
    runner.gather(None)  # every rank's shards are in
    manifest = replace(
        source,
        table_sizes=[fs.table_size for fs in stats.values()],
        stats_digest="",
        sources=[str(inp)],
        multi_hot=[n for n, s in zip(names, sizes) if s > 1],
    )
    return manifest, stats


def finish(root: Path, manifest: Manifest, stats: dict[str, FeatureStats], wanted: dict) -> None:
    """Statistics, the settings record and (last) the manifest of the dataset built in ``root``."""
    from .preprocess.output import SETTINGS

    shutil.rmtree(root / WORK)
    (root / "stats").mkdir()
    write_counts(root / COUNTS, stats)
    summary = summarize(stats)
    summary.update(min_count=manifest.min_count, hash_modulus=manifest.hash_modulus)
    (root / SUMMARY).write_text(json.dumps(summary, indent=2))
    print(format_summary(summary))
    manifest.stats_digest = sha256_file(root / COUNTS)
    (root / SETTINGS).write_text(json.dumps(wanted, indent=2))
    manifest.save(root)  # last: its presence marks the dataset complete
