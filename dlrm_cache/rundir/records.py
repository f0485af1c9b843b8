"""The run directory's contract: its file names, the kinds of record in its log, and the one writer
and the one reader of that log.  `train` writes a run directory, `report` reads it back; both spell
the contract through this module only.

A run directory holds ``metrics.jsonl`` (one JSON object per line, each with ``kind`` and ``time``:
seconds since the writer started), ``summary.json`` once the run has finished, ``checkpoints/`` and
Hydra's ``.hydra/``; `report` adds ``report.png`` and ``report.md``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from omegaconf import OmegaConf

from ..console.readable import summary_order
from ..files.atomic import atomic_write_text, to_json

# metrics.jsonl, summary.json, checkpoints/step_N (train/checkpoint.py writes them), abandoned/
from ..files.layout import ABANDONED as ABANDONED
from ..files.layout import CKPT_DIR as CKPT_DIR
from ..files.layout import METRICS as METRICS
from ..files.layout import SNAPSHOT
from ..files.layout import SUMMARY as SUMMARY

REPORT_PNG: Final = "report.png"
REPORT_MD: Final = "report.md"

# Record kinds, in the order a run writes them.
START: Final = "start"  # a (re)start: step, total_steps, world_size, config (resolved)
FIRST_STEP: Final = (
    "first_step"  # step, startup_s (job start to the first step; see train/timing.py)
)
TRAIN: Final = "train"  # step, epoch, loss, samples_per_s, the embedding counters of the interval
EVAL: Final = "eval"  # step, split, auc, logloss, accuracy, samples
CHECKPOINT: Final = "checkpoint"  # step, path; best_only: saved for a best evaluation alone
BEST: Final = (
    "best"  # step, path, the monitored metric's value: a better evaluation (train/best.py)
)
SUMMARY_RECORD: Final = "summary"  # the final summary (as summary.json)

# What `report` reads of each kind of record: numbers (a null is a number: no value), checked
# when the log is read back, so a record without one is a line naming it, not a KeyError.
NUMBERS: Final = {
    TRAIN: ("step", "loss", "samples_per_s"),
    EVAL: ("step", "auc", "logloss"),
}


class JsonlLog:
    """Appends one JSON object per line; only rank 0 writes.

    An existing log is continued: a last line cut short by a kill is dropped, and ``keep`` (a run
    resumed into its own run directory: the records up to its checkpoint) drops the records of
    the steps the run is about to redo, so each step is recorded once.  ``records`` counts lines.
    """

    def __init__(self, path: Path, enabled: bool = True, keep: int | None = None) -> None:
        self.path = path
        self.enabled = enabled
        self.sinks: list[
            Callable[[dict], None]
        ] = []  # also handed every record written (TensorBoard)
        self.t0 = time.time()
        self.records = 0
        if enabled and path.exists():
            text = path.read_text()
            lines = text.splitlines(keepends=True)
            kept = [line for line in lines[:keep] if line.endswith("\n")]
            if len(kept) != len(lines):
                atomic_write_text(path, "".join(kept))
            self.records = len(kept)

    def write(self, kind: str, **fields: Any) -> None:
        if not self.enabled:
            return
        record = {"kind": kind, "time": round(time.time() - self.t0, 3), **fields}
        with open(self.path, "a") as f:
            f.write(to_json(record, default=_plain) + "\n")
        self.records += 1
        for sink in self.sinks:
            sink(record)


def _plain(x: Any) -> Any:
    """JSON for what ``json`` cannot write: a tensor as its value(s), anything else as text."""
    import torch

    if isinstance(x, torch.Tensor):
        return x.item() if x.numel() == 1 else x.tolist()
    return str(x)


def open_log(run_dir: Path, enabled: bool = True, keep: int | None = None) -> JsonlLog:
    """The run's log (see :class:`JsonlLog` for ``enabled`` and ``keep``)."""
    return JsonlLog(run_dir / METRICS, enabled=enabled, keep=keep)


def is_run_dir(path: Path) -> bool:
    return (path / METRICS).is_file()


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``run_dir``'s log, checked to begin with a start record that holds the run's
    config; bad input raises a one-line error naming the file (and line)."""
    metrics = run_dir / METRICS
    if not metrics.is_file():
        raise FileNotFoundError(
            f"{run_dir}: not a run directory (no {METRICS}) nor a sweep directory (no */{METRICS})"
        )
    records = []
    for i, line in enumerate(metrics.read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(_nulls_as_nan(json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(f"{metrics}:{i}: not a JSON record ({e.msg})") from None
            r = records[-1]
            kind = r.get("kind") if isinstance(r, dict) else None
            missing = [k for k in NUMBERS.get(str(kind), ()) if not _number(r.get(k))]
            if missing:
                raise ValueError(
                    f"{metrics}:{i}: a {kind} record without the number {missing[0]!r} "
                    "(not written by dlrm-cache train, or edited)"
                )
    if not records:
        raise ValueError(f"{metrics}: empty (the run wrote no records)")
    if records[0].get("kind") != START or "config" not in records[0]:
        raise ValueError(
            f"{metrics}:1: no start record with the run's config (not written by dlrm-cache train)"
        )
    return records


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def logged_records(run_dir: Path) -> list[dict[str, Any] | None]:
    """Every complete line of ``run_dir``'s log, in order (item k is the line a ``keep`` of k + 1
    keeps last, see :class:`JsonlLog`): its record, or None for a line that is not a JSON object.
    A last line cut short by a kill is not a line; no log: none."""
    metrics = run_dir / METRICS
    if not metrics.is_file():
        return []
    out: list[dict[str, Any] | None] = []
    for line in metrics.read_text(errors="replace").splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        out.append(_nulls_as_nan(record) if isinstance(record, dict) else None)
    return out


def recorded_checkpoints(run_dir: Path) -> set[int] | None:
    """The steps of the checkpoints ``run_dir``'s log records (None: it has no log).

    A run writes a checkpoint record before each save, and a resume into the run directory cuts
    the log back to its checkpoint's records, so these are the checkpoints of the run as its
    records describe it (a save that did not complete is recorded but has no complete checkpoint).
    Only the checkpoint records are parsed (a long log is mostly train records); a last line cut
    short by a kill is not a record.
    """
    metrics = run_dir / METRICS
    if not metrics.is_file():
        return None
    steps = set()
    with open(metrics, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            if f'"{CHECKPOINT}"' not in line or not line.endswith("\n"):
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{metrics}:{i}: not a JSON record ({e.msg})") from None
            if isinstance(record, dict) and record.get("kind") == CHECKPOINT:
                step = record.get("step")
                if not isinstance(step, int) or isinstance(step, bool):
                    raise ValueError(f"{metrics}:{i}: a checkpoint record without an integer step")
                steps.add(step)
    return steps


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """summary.json, the keys a person looks for first (``readable.SUMMARY_FIRST``)."""
    text = to_json(summary_order(summary), indent=2, default=str)
    atomic_write_text(run_dir / SUMMARY, text)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """``summary.json`` (None: the run has not finished)."""
    path = run_dir / SUMMARY
    if not path.is_file():
        return None
    try:
        summary: dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg})") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{path}: not a summary (a JSON object of the run's results)")
    return _nulls_as_nan(summary)


def _nulls_as_nan(record: Any) -> Any:
    """A record's ``null`` values as NaN: the writer writes a non-finite number (the AUC of an
    empty validation split, a rate over no time) as ``null`` (data.files.to_json)."""
    if isinstance(record, dict):
        return {k: math.nan if v is None else v for k, v in record.items()}
    return record


def hydra_cwd(run_dir: Path) -> str | None:
    """The directory Hydra recorded the run was started from, if it did."""
    hydra_yaml = run_dir / SNAPSHOT / "hydra.yaml"
    if not hydra_yaml.is_file():
        return None
    try:
        cwd = OmegaConf.load(hydra_yaml).hydra.runtime.cwd
    except Exception:  # not Hydra's file after all: no record
        return None
    return cwd if isinstance(cwd, str) else None
