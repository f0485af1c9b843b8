"""`dlrm-cache predict`: click probabilities of a trained run, for raw Criteo lines or a split.

Streaming: raw text is parsed ``chunk_bytes`` at a time on a background thread (as `preprocess`
reads it, see :mod:`dlrm_cache.after.rawinput`), a processed split is read shard by shard as training's
evaluation reads it; batches of ``batch_size`` go through the run's model and out to the file, so
memory is bounded by the chunk and the tables (memory-mapped from the checkpoint), not the input.

Output: one row per scored line: ``line`` (1-based line number in a raw file) or ``row`` (0-based
position in a processed split), ``probability`` (float32), and ``label`` where the input has one
(null for a line whose label field is empty: scored, and left out of the metrics).  It is written
under a temporary name beside ``output`` and renamed into place when complete; the output may not
be an input nor lie in a checkpoint, run or dataset directory (:mod:`dlrm_cache.files.outputs`), and an
input of which no line can be scored is an error, not an empty output.

With labels, AUC, log loss and accuracy are computed by training's own evaluation metrics over the
same batches: on a processed split with the run's ``data.eval_batch_size`` (the default), one
process gives exactly the numbers `train test=true` reported for that checkpoint (a run that
evaluated on N ranks: equal up to float summation order).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from tqdm import tqdm

from ..concurrency.threads import Prefetcher
from ..data.format import MANIFEST, Manifest
from ..data.loader import ShardStream
from ..data.schema import Schema
from ..files.atomic import WriteError, atomic_file
from ..files.outputs import check_output, reported_if_written, stop_on_signals
from ..parallel.dist import resolve_device
from ..train.metrics import EvalMetrics, format_table
from .config import require
from .rawbatch import Batcher, Indexed
from .rawinput import (
    LABELLED,
    IdMapper,
    detect_width,
    input_schema,
    new_bad_line_log,
    read_rows,
    read_schema_rows,
)
from .trained import Trained, open_trained


@dataclass
class Source:
    """What is scored: batches with their line/row numbers, and how to show progress."""

    index_name: str  # "line" (raw text) | "row" (processed split)
    labelled: bool
    batches: Callable[[Callable[[int], None]], Iterator[Indexed]]  # takes a progress callback
    total: int  # for the progress bar
    unit: str
    bad: Any = None  # the raw input's bad-line log


def predict(cfg: Any) -> dict[str, Any]:
    """Score ``cfg.input`` with ``cfg.checkpoint``; returns the summary it prints."""
    require(cfg, checkpoint="runs/train/DATE/TIME", input="test.txt", output="predictions.parquet")
    output = Path(str(cfg.output)).expanduser()
    made: list[tuple[int, int]] = []  # the temporary output's device and inode, once created
    # SIGTERM too removes the temporary output; one that came after the rename names the output
    with reported_if_written(output, made), stop_on_signals():
        return _predict(cfg, output, made)


def _predict(cfg: Any, output: Path, made: list[tuple[int, int]]) -> dict[str, Any]:
    fmt = output_format(output, str(cfg.format))
    device = resolve_device(str(cfg.device))
    inp = Path(str(cfg.input)).expanduser()
    is_dataset = (inp / MANIFEST).is_file()
    if is_dataset:  # a split of a dataset: the run must have been trained on that dataset
        trained = open_trained(str(cfg.checkpoint), str(inp), "input", str(cfg.which))
    else:
        trained = open_trained(str(cfg.checkpoint), cfg.dataset, "dataset", str(cfg.which))
    reads = [("input", inp), ("checkpoint", trained.checkpoint.path)]
    check_output(output, "output", [*reads, ("dataset", trained.data_path)])
    batch_size = int(cfg.batch_size) or int(trained.config.get("data.eval_batch_size", 8192))
    source = (
        split_source(trained, inp, str(cfg.split), batch_size)
        if is_dataset
        else raw_source(cfg, trained, inp, batch_size)
    )
    model = trained.model(device)

    metrics = EvalMetrics(device) if source.labelled else None
    scored, labelled, t0 = 0, 0, time.perf_counter()
    bar = tqdm(
        total=source.total,
        unit=source.unit,
        unit_scale=True,
        desc="predict",
        disable=not cfg.progress,
        dynamic_ncols=True,
    )
    with (
        bar,
        PredictionWriter(output, fmt, source.index_name, source.labelled, made) as out,
        torch.no_grad(),
        _background(source.batches(lambda n: bar.update(n - bar.n))) as batches,
    ):
        for index, batch, known in batches:
            # ids stay on the host, where the tables are; the dense part runs on `device`
            logits = model(batch.dense.to(device), batch.sparse)
            probs = torch.sigmoid(logits)
            if metrics is not None:
                labels = batch.labels.to(device)
                if known is not None:  # lines with an empty label: scored, not measured
                    mask = torch.from_numpy(known).to(device)
                    logits, labels = logits[mask], labels[mask]
                metrics.update(logits, labels)
                labelled += len(labels)
            out.write(
                index,
                probs.cpu().numpy(),
                batch.labels.numpy() if source.labelled else None,
                known,
            )
            scored += len(index)
            if source.unit == "row":
                bar.update(len(index))
        if scored == 0:  # raised inside the writer's block: no output is left
            raise ValueError(nothing_scored(cfg, source))
        # every label field empty: no metrics.  Computed before the output is renamed into
        # place, so a signal during it stops the command with no output, as it says
        results = metrics.compute() if metrics is not None and labelled else None
    seconds = time.perf_counter() - t0
    return _report(cfg, trained, source, output, scored, labelled, seconds, results)


def nothing_scored(cfg: Any, source: Source) -> str:
    """Why an input gave no line to score: preprocess's count per reason, with each reason's first
    line."""
    bad = source.bad
    if bad is None or not bad.counts:
        return f"input={cfg.input}: no line to score"
    n = sum(bad.counts.values())
    return f"input={cfg.input}: no line to score: all {n} lines are malformed. {bad.per_reason()}"


def _report(
    cfg: Any,
    trained: Trained,
    source: Source,
    output: Path,
    scored: int,
    labelled: int,
    seconds: float,
    metrics: dict[str, float] | None,
) -> dict[str, Any]:
    if source.bad is not None:
        for msg in source.bad.reports:
            print(f"predict: skipped {msg}")
        if source.bad.counts:
            print(
                f"predict: skipped {sum(source.bad.counts.values())} malformed lines: "
                f"{source.bad.counts}"
            )
    summary: dict[str, Any] = {
        "checkpoint": str(trained.checkpoint.path),
        "step": trained.checkpoint.step,
        "which": trained.chosen.note,
        "scored": scored,
        "seconds": round(seconds, 3),
        f"{source.index_name}s_per_s": scored / seconds if seconds > 0 else float("nan"),
    }
    if source.bad is not None:
        summary["skipped"] = sum(source.bad.counts.values())
    if source.labelled and labelled < scored:
        summary["labelled"] = labelled  # the rest had an empty label field
    if metrics is not None:
        summary.update(metrics)
    summary["output"] = str(output)
    print(format_table(list(summary.items()), title=f"dlrm-cache predict: {cfg.input}"))
    return summary


# ---------------------------------------------------------------------------------------- inputs
def split_source(trained: Trained, root: Path, split: str, batch_size: int) -> Source:
    """A split of the dataset the run was trained on, in shard order (as training evaluates it)."""
    manifest: Manifest = trained.manifest
    if split not in manifest.splits:
        raise ValueError(
            f"split={split}: {root} has no such split (has {', '.join(manifest.splits)})"
        )
    if manifest.splits[split].rows == 0:
        raise ValueError(f"split={split}: {root} has no rows in that split; nothing to score")
    manifest.check_shards(root, [split])
    stream = ShardStream(
        root, manifest, split, batch_size, shuffle=False, drop_last=False, key="batch_size"
    )

    def batches(progress: Callable[[int], None]) -> Iterator[Indexed]:
        at = 0
        for batch in stream.batches():
            yield np.arange(at, at + batch.size, dtype=np.int64), batch, None
            at += batch.size

    return Source("row", True, batches, manifest.splits[split].rows, "row")


def raw_source(cfg: Any, trained: Trained, path: Path, batch_size: int) -> Source:
    """A raw Criteo text file, mapped through the trained dataset's statistics."""
    if not path.exists():
        raise FileNotFoundError(f"input={path}: no such file or processed dataset directory")
    if not path.is_file():
        raise ValueError(
            f"input={path}: neither a raw Criteo text file nor a processed dataset "
            f"(a directory with {MANIFEST})"
        )
    schema = Schema.load(trained.data_path, trained.manifest.hash_modulus)
    if set(schema.multi_hot) != set(trained.manifest.multi_hot):
        raise ValueError(
            f"input={path}: the run's dataset {trained.data_path} holds multi-hot lists made from "
            "a processed dataset's rows (preprocess multi_hot_sizes=), not from raw ids; score a "
            "processed split of it instead (input=<that dataset>)"
        )
    bad = new_bad_line_log(str(cfg.bad_lines), int(cfg.bad_line_reports))
    batcher = Batcher(trained.manifest.sparse_names)
    if not schema.fast:
        return _schema_source(cfg, trained, path, batch_size, schema, bad, batcher)
    width = detect_width(path)
    mapper = IdMapper(trained.data_path, trained.manifest, schema.hashes)

    def batches(progress: Callable[[int], None]) -> Iterator[Indexed]:
        rows = read_rows(path, width, mapper, int(cfg.chunk_bytes), bad, progress)
        return batcher.rebatch(rows, batch_size)

    return Source("line", width == LABELLED, batches, path.stat().st_size, "B", bad)


def _schema_source(
    cfg: Any,
    trained: Trained,
    path: Path,
    batch_size: int,
    schema: Schema,
    bad: Any,
    batcher: Batcher,
) -> Source:
    """Raw input of the dataset's own schema (or Criteo's with multi-hot columns): text lines or
    parquet rows."""
    schema, labelled = input_schema(path, schema)
    mapper = IdMapper(trained.data_path, trained.manifest, schema.hashes)

    def batches(progress: Callable[[int], None]) -> Iterator[Indexed]:
        rows = read_schema_rows(path, schema, labelled, mapper, int(cfg.chunk_bytes), bad, progress)
        return batcher.rebatch(rows, batch_size)

    # parquet rows are numbered like lines (from 1, as bad-row messages name them)
    return Source("line", labelled, batches, path.stat().st_size, "B", bad)


@contextlib.contextmanager
def _background(it: Iterator[Indexed], depth: int = 2) -> Iterator[Iterator[Indexed]]:
    """Parsing and batching on a loader thread, ``depth`` batches ahead of the model."""
    reader = Prefetcher(it, depth)
    try:
        yield reader
    finally:
        reader.close()


# ---------------------------------------------------------------------------------------- output
def output_format(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    return "csv" if path.suffix.lower() == ".csv" else "parquet"


class PredictionWriter:
    """Streams prediction rows into a temporary file beside ``path``: renamed into place when the
    ``with`` block ends normally, removed when it raises (no half-written output, ever)."""

    def __init__(
        self,
        path: Path,
        fmt: str,
        index_name: str,
        labelled: bool,
        made: list[tuple[int, int]] | None = None,
    ) -> None:
        """``made``: given the temporary file's device and inode when it is created (to tell
        later whether it was renamed into place, :func:`~dlrm_cache.files.outputs.reported_if_written`)."""
        self.path = path
        self.made = made if made is not None else []
        self.fmt = fmt
        fields = [(index_name, pa.int64()), ("probability", pa.float32())]
        self.schema = pa.schema(fields + ([("label", pa.int8())] if labelled else []))
        self._stack = contextlib.ExitStack()
        self._writer: Any = None

    def __enter__(self) -> PredictionWriter:
        if self.path.is_dir():
            raise IsADirectoryError(f"output={self.path}: is a directory; name a file")
        try:
            f = self._stack.enter_context(atomic_file(self.path, "wb"))
        except OSError as e:
            raise WriteError(
                f"output={self.path}: cannot write there ({e.strerror or e})"
            ) from None
        st = os.fstat(f.fileno())
        self.made[:] = [(st.st_dev, st.st_ino)]
        if self.fmt == "csv":
            import pyarrow.csv as pacsv

            self._writer = pacsv.CSVWriter(f, self.schema)
        else:
            import pyarrow.parquet as pq

            self._writer = pq.ParquetWriter(f, self.schema)
        return self

    def write(
        self,
        index: np.ndarray,
        probs: np.ndarray,
        labels: np.ndarray | None,
        known: np.ndarray | None = None,
    ) -> None:
        """A batch's rows; ``known``: which rows have a label (the others' label is null)."""
        cols = [pa.array(index, pa.int64()), pa.array(probs.astype(np.float32, copy=False))]
        if labels is not None:
            mask = None if known is None else ~known
            cols.append(pa.array(labels.astype(np.int8), mask=mask))
        try:
            self._writer.write_table(pa.Table.from_arrays(cols, schema=self.schema))
        except OSError as e:
            raise WriteError(
                f"output={self.path}: write failed ({e.strerror or e}); nothing was kept"
            ) from None

    def __exit__(self, exc_type, exc, tb) -> None:
        failure = None
        if self._writer is not None:
            try:
                self._writer.close()  # the parquet footer
            except OSError as e:
                failure = WriteError(
                    f"output={self.path}: write failed ({e.strerror or e}); nothing was kept"
                )
        if exc is None and failure is not None:
            self._stack.__exit__(WriteError, failure, None)  # removes the temporary file
            raise failure
        self._stack.__exit__(exc_type, exc, tb)
