"""Raw Criteo text -> processed dataset (`dlrm-cache preprocess`); layout in :mod:`..format`.

Stages, each a list of independent jobs run by ``workers`` processes (and divided among the ranks
under torchrun, :mod:`.workers`); memory ~ one block per worker plus distinct ids, not lines:

1. parse (:mod:`.parse`): each line is parsed once, into columnar parts on disk;
2. count (:mod:`.count`): ids per feature over the *training* rows, merged per feature, ranked by
   (count descending, id ascending), ids seen fewer than ``min_count`` times folded into the rare
   row (the last row); ``stats/counts.parquet`` and ``stats/summary.json`` are written;
3. encode (:mod:`.encode`): ids -> ranks (ids unseen in training -> rare row), parquet shards of
   ``rows_per_shard`` rows per split.

The output is a function of the inputs and the output-changing settings only, byte for byte: not of
``workers``, ``chunk_bytes`` or the number of ranks.  Lines are parsed by :mod:`..criteo`, which
states the malformed-line policy; :mod:`.badlines` counts and reports them; :mod:`.splits` says
which split a line is in; ``hash_modulus`` m > 0 maps id -> id mod m before counting (the empty
value stays :data:`..format.MISSING_ID`, its own row, so a table has at most m + 2 rows).
:mod:`.output` owns the output directory (reuse, atomic replacement, leftovers of killed runs).

Imports what `data/` may (`config/`, `files/`, `concurrency/`, `parallel/`) and `data/` itself.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ...files.atomic import resolve_path
from ...files.outputs import DATASET, UnsafeOutput, check_output
from ..config import PreprocessConfig
from ..format import MANIFEST, Manifest
from ..parquet import write_shard as _write_shard  # shards are written through this name
from ..rawschema import beside, load
from ..schema import Schema, SchemaError, resolve
from .build import build
from .errors import PreprocessError
from .header import read_header, refuse_parquet
from .output import SETTINGS, prepare, publish, settings
from .sources import find_sources, select_files, skipped_files
from .workers import Runner, available_cores

__all__ = ["PreprocessError", "SETTINGS", "preprocess"]


def _write(table: Any, path: Path) -> None:
    _write_shard(table, path)  # looked up at call time: a test may wrap it


def preprocess(cfg: PreprocessConfig | Any) -> Manifest:
    """Build (or reuse) the processed dataset described by ``cfg``; returns its manifest."""
    from hydra.utils import to_absolute_path

    inp = resolve_path(to_absolute_path(str(cfg.input)), "input")
    out = resolve_path(to_absolute_path(str(cfg.output)), "output")
    workers = int(getattr(cfg, "workers", 0)) or available_cores()
    runner = Runner(workers)
    failed = True
    try:
        manifest = _run(cfg, inp, out, runner)
        failed = False
        return manifest
    finally:
        runner.close(failed)


def _schema(cfg: Any, inp: Path, runner: Runner) -> Schema:
    """The resolved schema of ``cfg`` (Criteo's when it has none), or of the input's
    ``schema.yaml`` when ``cfg`` leaves it at Criteo's (:mod:`..rawschema`)."""
    node = getattr(cfg, "schema", None)
    try:
        if (path := beside(inp, node)) is not None:
            schema = load(path, int(cfg.hash_modulus))
            if runner.is_main:
                print(f"preprocess: schema from {path} (schema= chooses another)")
            return schema
        return Schema() if node is None else resolve(node, int(cfg.hash_modulus))
    except SchemaError as e:
        raise PreprocessError(str(e)) from None


def _run(cfg: Any, inp: Path, out: Path, runner: Runner) -> Manifest:
    if cfg.multi_hot_sizes or (inp / MANIFEST).is_file():  # a processed dataset in: MLPerf's
        from ..multihot import materialize  # multi-hot version of it (data/multihot.py)

        return materialize(cfg, inp, out, runner)
    t0 = time.perf_counter()
    schema = _schema(cfg, inp, runner)
    sources = find_sources(inp, "" if schema.format == "criteo" else f".{schema.format}")
    try:  # the rule every command's output follows (the output may be a dataset: it makes them)
        check_output(out, "output", [("input", p) for p in [inp, *sources]], makes=DATASET)
    except UnsafeOutput as e:
        raise PreprocessError(str(e)) from None
    if runner.is_main and schema.format != "criteo" and (line := skipped_files(inp, sources)):
        print(line)
    files, file_splits = select_files(cfg, inp, sources)
    if schema.text and schema.format != "criteo":
        for path in files:
            refuse_parquet(path, schema.format)
    if schema.header:
        schema.columns = read_header(files, schema)
    wanted = settings(cfg, files, schema)
    reused, root = prepare(out, wanted, bool(cfg.overwrite), runner)
    if reused is not None:
        return reused
    assert root is not None
    manifest = publish(
        root,
        out,
        runner,
        lambda: build(cfg, files, file_splits, wanted, root, runner, _write, schema),
    )
    dt = time.perf_counter() - t0
    lines = sum(s.rows for s in manifest.splits.values()) + sum(manifest.bad_lines.values())
    if runner.is_main:
        print(
            f"preprocess: {lines} lines in {dt:.1f}s ({lines / dt:,.0f} lines/s, "
            f"{runner.workers} worker(s) x {runner.world} rank(s)) -> {out}"
        )
    return manifest
