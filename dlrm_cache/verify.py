"""`dlrm-cache verify DATASET`: read every file of a dataset and check it against its manifest.

Per shard: every page against its CRC32 (written by every dlrm-cache writer, see data/format.py),
the row count and columns the manifest records, labels 0 or 1, dense values finite, every id
inside its table.  The statistics: the sha256 the manifest records, every page's CRC.  Each bad
file is one line naming it; the command fails (exit 1) if there was any.  Reads the whole
dataset once, a shard at a time (memory: one shard).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import MISSING, OmegaConf

from .data.format import LABEL, MANIFEST, Manifest, one_line, read_parquet, sha256_file


@dataclass
class VerifyConfig:
    data_path: str = MISSING  # a processed dataset directory (or positional: dlrm-cache verify DIR)
    progress: bool = True  # a line per split on stderr


class VerifyFailed(ValueError):
    """Some files are damaged (each was named on its own line above)."""


def check_shard(root: Path, rel: str, rows: int, manifest: Manifest) -> int:
    """Raise ValueError naming ``root/rel`` for the first thing wrong with it; its rows."""
    path = root / rel
    table = read_parquet(path)  # every page verified
    manifest_path = root / MANIFEST
    missing = [
        c
        for c in (LABEL, *manifest.dense_names, *manifest.sparse_names)
        if c not in table.column_names
    ]
    if missing:
        raise ValueError(f"{path}: no column {missing[0]} ({manifest_path} lists it)")
    if table.num_rows != rows:
        raise ValueError(f"{path}: {table.num_rows} rows but {manifest_path} says {rows}")
    labels = table.column(LABEL).to_numpy()
    if not np.isin(labels, (0.0, 1.0)).all():
        raise ValueError(f"{path}: column {LABEL} holds values other than 0 and 1")
    for name in manifest.dense_names:
        if not np.isfinite(table.column(name).to_numpy()).all():
            raise ValueError(f"{path}: column {name} holds non-finite values")
    for name, size in zip(manifest.sparse_names, manifest.table_sizes):
        ids = table.column(name).to_numpy()
        if len(ids) and (ids.min() < 0 or ids.max() >= size):
            bad = int(ids.min() if ids.min() < 0 else ids.max())
            raise ValueError(
                f"{path}: column {name} holds id {bad}, outside [0, {size}) ({manifest_path})"
            )
    return rows


def check_stats(root: Path, manifest: Manifest) -> None:
    from .data.stats import COUNTS

    counts = root / COUNTS
    if manifest.stats_digest == "none":  # a dataset written without statistics
        return
    if sha256_file(counts) != manifest.stats_digest:
        raise ValueError(f"{counts}: its sha256 is not the stats_digest of {root / MANIFEST}")
    read_parquet(counts)


def verify(cfg: VerifyConfig | Any) -> None:
    if OmegaConf.is_missing(cfg, "data_path"):
        raise ValueError("no dataset: dlrm-cache verify DATASET_DIR (or data_path=DATASET_DIR)")
    root = Path(cfg.data_path)
    manifest = Manifest.load(root, key="data_path")
    bad, files, total = 0, 0, 0
    checks = [
        (f"{split} shards", [(rel, rows) for rel, rows in zip(info.shards, info.shard_rows)])
        for split, info in manifest.splits.items()
    ]
    for what, shards in checks:
        done = 0
        for rel, rows in shards:
            files += 1
            try:
                done += check_shard(root, rel, rows, manifest)
            except (ValueError, OSError) as e:
                bad += 1
                print(f"dlrm-cache verify: {one_line(e)}", file=sys.stderr)
        total += done
        if cfg.progress:
            print(f"{what}: {len(shards)} files, {done:,} rows read", file=sys.stderr)
    files += 1
    try:
        check_stats(root, manifest)
    except (ValueError, OSError) as e:
        bad += 1
        print(f"dlrm-cache verify: {one_line(e)}", file=sys.stderr)
    if bad:
        raise VerifyFailed(
            f"{root}: {bad} of {files} files damaged or not as {MANIFEST} says (listed above)"
        )
    print(f"{root}: ok: {files} files, {total:,} rows, every page checksum and the manifest agree")
