"""A run's best checkpoint, and when its training stops early (Lightning's ModelCheckpoint and
EarlyStopping, read from the run's records).

The facts are the run's log (``metrics.jsonl``): its ``eval`` records of the val split and its
``checkpoint`` records.  The best checkpoint of a run directory is, among the complete checkpoints
of its folder that its log records (as for the final one, :func:`.checkpoint.final_checkpoint`),
the one whose step's val evaluation is the best by the run's ``monitor.metric`` and
``monitor.mode``; ties go to the earlier step.  No pointer is stored: a resume cuts the log back
and a branch sets later checkpoints aside (:mod:`.branch`), and the best follows, so it is always
a checkpoint of the folder itself, described by the records beside it.

While a run trains (:class:`Tracker`), an evaluation better than every earlier one saves a
checkpoint of its step (its record says ``best_only`` unless ``checkpoint_every`` saves that step
anyway) and writes a ``best`` record; a ``best_only`` checkpoint goes when it is no longer among
the ``monitor.save_top_k`` best (:func:`prune`), never the newest.  ``monitor.patience``
evaluations in a row without a better one stop training.  A resumed run starts from the state its
kept records give (:meth:`Tracker.resumed`), so it stops where the uninterrupted run stops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.choices import Monitored, MonitorMode, Which
from ..config.schemas import MonitorConfig, flatten
from ..files.layout import CKPT_META
from ..rundir.records import CHECKPOINT, EVAL, START, logged_records
from .checkpoint import complete_checkpoints, find_checkpoint, remove_checkpoint, run_and_folder

MONITORED_SPLIT = "val"  # monitor.metric names val_<key of its eval records>


@dataclass(frozen=True)
class Monitor:
    """A monitored metric (``val_auc``) and whether larger is better."""

    metric: str
    larger: bool

    @classmethod
    def of(cls, config: dict[str, Any]) -> Monitor:
        """The ``monitor.*`` of a run's config (nested, plain); a run made before they existed
        was ranked by their defaults."""
        flat = flatten(config)
        metric = str(flat.get("monitor.metric", MonitorConfig.metric.value))
        mode = str(flat.get("monitor.mode", MonitorConfig.mode.value))
        if mode == MonitorMode.auto.value:
            return cls(metric, metric != Monitored.val_logloss.value)
        return cls(metric, mode == MonitorMode.max.value)

    def value(self, result: dict[str, Any]) -> float | None:
        """The monitored value of an evaluation (its record, or what it returned); None: none."""
        v = result.get(self.metric.removeprefix(f"{MONITORED_SPLIT}_"))
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
        return None

    def better(self, a: float, b: float) -> bool:
        return a > b if self.larger else a < b


def val_evaluations(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The val split's eval records by step (the first of a step)."""
    out: dict[int, dict[str, Any]] = {}
    for r in records:
        if r.get("kind") == EVAL and r.get("split") == MONITORED_SPLIT:
            out.setdefault(int(r["step"]), r)
    return out


def ranked(
    monitor: Monitor, records: list[dict[str, Any]], folder: Path | None
) -> list[tuple[int, float, Path | None]]:
    """(step, value, checkpoint) of every checkpoint that ``records`` record and evaluate, and
    that is complete in ``folder`` (None: wherever it is now, then no path), best first (ties:
    the earlier step first)."""
    complete = dict(complete_checkpoints(folder)) if folder is not None else {}
    recorded = {r.get("step") for r in records if r.get("kind") == CHECKPOINT}
    found = []
    for step, r in val_evaluations(records).items():
        v = monitor.value(r)
        if v is not None and step in recorded and (folder is None or step in complete):
            found.append((step, v, complete.get(step)))
    return sorted(found, key=lambda t: (-t[1] if monitor.larger else t[1], t[0]))


def run_records(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of ``run_dir``'s log (none: no log)."""
    return [r for r in logged_records(run_dir) if r is not None]


def run_monitor(records: list[dict[str, Any]]) -> Monitor:
    """The monitor of the run's last start record's config (its defaults without one)."""
    starts = [r for r in records if r.get("kind") == START and isinstance(r.get("config"), dict)]
    return Monitor.of(starts[-1]["config"] if starts else {})


@dataclass
class Best:
    step: int
    value: float
    path: Path
    monitor: Monitor
    # a better evaluated step the records name whose checkpoint is not in the folder (a branch
    # set it aside, or it was removed): (step, value)
    elsewhere: tuple[int, float] | None = None

    def describe(self, also: str = "") -> str:
        """For people: its metric and value, ``also``, and a better step it does not have."""
        out = f"best by {self.monitor.metric} ({self.value:.4f})" + (f", {also}" if also else "")
        if self.elsewhere is not None:
            step, value = self.elsewhere
            out += (
                f"; step {step}'s {value:.4f} was better, but its checkpoint is not in "
                f"{self.path.parent} (the run a branch came from keeps it, a branch set it "
                "aside, or it was removed)"
            )
        return out


def best_checkpoint(run_dir: Path, folder: Path | None = None) -> Best | None:
    """The run's best checkpoint (see the module's docstring); None: it evaluated none it has."""
    records = run_records(run_dir)
    monitor = run_monitor(records)
    top = ranked(monitor, records, folder if folder is not None else run_and_folder(run_dir)[1])
    if not top:
        return None
    step, value, path = top[0]
    assert path is not None
    anywhere = ranked(monitor, records, None)[0]
    elsewhere = anywhere[:2] if anywhere[0] != step else None
    return Best(step, value, path, monitor, elsewhere)


@dataclass
class Chosen:
    """The checkpoint a command takes, and which of the run's it is (for its output)."""

    path: Path
    which: str  # best | last | named (a checkpoint directory was named)
    note: str  # for people: "best by val_auc (0.8145), the last is step_00000040"


def choose_checkpoint(name: str, which: str, key: str, which_key: str) -> Chosen:
    """The checkpoint ``key=name`` names (a checkpoint directory: that one; a run directory, its
    checkpoints folder or a folder of ``step_N``: its best or last as ``which``, a :class:`Which`
    value, says).  FileNotFoundError: no checkpoint there; ValueError: ``best`` asked of a run
    that evaluated none of its checkpoints (the message names ``which_key``)."""
    p = Path(name).expanduser()
    if (p / CKPT_META).is_file():
        return Chosen(p, "named", "as named")
    last = find_checkpoint(name)
    if which == Which.last.value:
        return Chosen(last, "last", "last")
    best = best_checkpoint(*run_and_folder(p))
    if best is None and which == Which.best.value:
        raise ValueError(
            f"{key}={name} {which_key}=best: the run has no evaluated checkpoint (no val "
            f"evaluation of a step it has a checkpoint of); take its last with {which_key}=last"
        )
    if best is None:
        return Chosen(last, "last", "last (none evaluated to call best)")
    also = "also the last" if best.path == last else f"the last is {last.name}"
    return Chosen(best.path, "best", best.describe(also))


@dataclass
class Tracker:
    """The best evaluation so far, and the evaluations since it (early stopping's count)."""

    monitor: Monitor
    patience: int  # 0: no early stopping
    best: tuple[int, float] | None = None  # (step, value)
    since: int = 0

    @classmethod
    def resumed(
        cls, monitor: Monitor, patience: int, records: list[dict[str, Any]], folder: Path
    ) -> Tracker:
        """The state after ``records`` (a resumed run's kept log): the best of the checkpoints
        of ``folder`` they evaluate (a branch may have set a better one aside), and the val
        evaluations after it."""
        top = ranked(monitor, records, folder)
        best = (top[0][0], top[0][1]) if top else None
        steps = set(val_evaluations(records))
        since = sum(1 for s in steps if s > (best[0] if best else -1))
        return cls(monitor, patience, best, since)

    def observe(self, step: int, result: dict[str, Any]) -> bool:
        """Count an evaluation of ``step``; True: the best so far (strictly better than every
        earlier one; the first finite one is)."""
        v = self.monitor.value(result)
        if v is not None and (self.best is None or self.monitor.better(v, self.best[1])):
            self.best, self.since = (step, v), 0
            return True
        self.since += 1
        return False

    @property
    def value(self) -> float:
        """The best value so far (NaN: none)."""
        return self.best[1] if self.best is not None else math.nan

    @property
    def exhausted(self) -> bool:
        """``patience`` evaluations in a row without a better one: training stops."""
        return 0 < self.patience <= self.since

    def why_stopped(self) -> str:
        best = (
            f"{self.monitor.metric} {self.best[1]:.4f} at step {self.best[0]}"
            if self.best
            else f"no finite {self.monitor.metric}"
        )
        return f"{self.since} evaluation{'s' * (self.since != 1)} without a better {self.monitor.metric} than {best}"


def prune(monitor: Monitor, top_k: int, records: list[dict[str, Any]], folder: Path) -> list[Path]:
    """Remove the ``best_only`` checkpoints of ``folder`` (by ``records``) that are no longer
    among the ``top_k`` best evaluated (-1: none is removed), never the newest; returns them."""
    if top_k < 0:
        return []
    keep = {step for step, _, _ in ranked(monitor, records, folder)[:top_k]}
    only = {r.get("step") for r in records if r.get("kind") == CHECKPOINT and r.get("best_only")}
    complete = complete_checkpoints(folder)
    gone = [p for step, p in complete[:-1] if step in only and step not in keep]
    for p in gone:
        remove_checkpoint(p)
    return gone
