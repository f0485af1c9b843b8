"""`dlrm-cache verify DATASET`: read every file of a dataset and check it as every command that
reads it would, and more.

What `train`, `predict` and `export` check is checked here by the same functions: the manifest
(:meth:`Manifest.load`: its fields, no shard listed twice or in two splits), every shard's footer
against it (:meth:`Manifest.check_shard`: a regular file, its rows and columns), every id inside
its table (:func:`~dlrm_cache.data.idrange.check_ids`), the statistics (:func:`read_checked`: the
file the manifest's digest names, table sizes the manifest's, a row per kept id).  And more:
every page against its CRC32, labels 0 or 1, dense values finite, the statistics' rows in rank
order, statistics beside a manifest that records none.  Each bad file is one line naming it; the
command fails (exit 1) if there was any.  Reads the whole dataset once, a shard at a time
(memory: one shard).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import MISSING, OmegaConf

from ..files.atomic import one_line
from .format import LABEL, MANIFEST, Manifest
from .idrange import check_ids
from .parquet import read_parquet
from .stats import COUNTS, SUMMARY, check_stats


@dataclass
class VerifyConfig:
    data_path: str = MISSING  # a processed dataset directory (or positional: dlrm-cache verify DIR)
    progress: bool = True  # a line per split on stderr


class VerifyFailed(ValueError):
    """Some files are damaged (each was named on its own line above)."""


def check_shard(root: Path, rel: str, rows: int, manifest: Manifest) -> int:
    """Raise ValueError naming ``root/rel`` for the first thing wrong with it; its rows."""
    manifest.check_shard(root, rel, rows)  # train's and predict's footer check
    path = root / rel
    table = read_parquet(path)  # every page verified
    # as the loader does (a multi-hot column: every element of every list)
    check_ids(table, path, manifest.sparse_names, manifest.table_sizes, manifest.multi_hot)
    labels = table.column(LABEL).to_numpy()
    if not np.isin(labels, (0.0, 1.0)).all():
        raise ValueError(f"{path}: column {LABEL} holds values other than 0 and 1")
    for name in manifest.dense_names:
        if not np.isfinite(table.column(name).to_numpy()).all():
            raise ValueError(f"{path}: column {name} holds non-finite values")
    return rows


def check_statistics(root: Path, manifest: Manifest) -> bool:
    """Raise ValueError naming the file for what is wrong with the statistics; whether there are
    any (a dataset written without them trains on every placement but freq_cache)."""
    if manifest.stats_digest == "none":
        present = [root / p for p in (COUNTS, SUMMARY) if (root / p).exists()]
        if present:
            raise ValueError(
                f"{present[0]}: present, but {root / MANIFEST} records no statistics "
                "(stats_digest none): written or replaced after the dataset? the freq_cache "
                "placement and predict on raw lines refuse them; preprocess the data again"
            )
        return False
    check_stats(root, manifest)
    return True


# what the manifest claims of how its dataset was built, also recorded by what built it
BUILD_KEYS = ("hash_modulus", "min_count")


def check_build_record(root: Path, manifest: Manifest) -> None:
    """Raise ValueError naming the manifest when it claims another ``hash_modulus`` or
    ``min_count`` than the build recorded in ``preprocess.json`` (a multi-hot set: its input's,
    which it keeps) and the statistics' summary: a manifest edited after the build maps raw ids
    (predict's raw input) otherwise than its shards were.  A dataset without those records (built
    elsewhere) has nothing to compare."""
    from .preprocess.output import SETTINGS  # (not at import: commands/store.py imports this)

    for record in (root / SETTINGS, root / SUMMARY):
        try:
            built = json.loads(record.read_text()) if record.is_file() else {}
        except ValueError as e:
            raise ValueError(f"{record}: not JSON ({one_line(e)})") from None
        if isinstance(built, dict) and isinstance(built.get("input_identity"), dict):
            built = built["input_identity"]  # the multi-hot materialization's record
        for key in BUILD_KEYS:
            if isinstance(built, dict) and key in built and built[key] != getattr(manifest, key):
                raise ValueError(
                    f"{root / MANIFEST}: {key} {getattr(manifest, key)}, but {record} records "
                    f"{built[key]}, which the dataset was built with (the manifest was edited?); "
                    "preprocess the data again"
                )


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
    stats = True
    try:
        check_build_record(root, manifest)
        stats = check_statistics(root, manifest)
    except (ValueError, OSError) as e:
        bad += 1
        print(f"dlrm-cache verify: {one_line(e)}", file=sys.stderr)
    if bad:
        raise VerifyFailed(
            f"{root}: {bad} of {files} files damaged or not as {MANIFEST} says (listed above)"
        )
    print(
        f"{root}: ok: {files} files, {total:,} rows, every page checksum and the manifest agree"
        + ("" if stats else " (no statistics: the freq_cache placement needs them)")
    )
