"""Metrics: torchmetrics for AUC/accuracy, JSON lines for the record, a small table for people."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from ..data.format import atomic_write_text


class EvalMetrics:
    """AUC, log loss and accuracy over one pass of a split (reduced across ranks by torchmetrics)."""

    def __init__(self, device: torch.device) -> None:
        # imported here: torchmetrics pulls in matplotlib (~1 s), which the training steps before the
        # first evaluation do not need
        from torchmetrics.classification import BinaryAccuracy, BinaryAUROC

        self.auroc = BinaryAUROC().to(device)
        self.accuracy = BinaryAccuracy().to(device)
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.count = torch.zeros((), dtype=torch.float64, device=device)

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        if labels.numel() == 0:  # a rank's share of an uneven last batch (torchmetrics rejects it)
            return
        probs = torch.sigmoid(logits.float())
        self.auroc.update(probs, labels.long())
        self.accuracy.update(probs, labels.long())
        self.loss_sum += F.binary_cross_entropy_with_logits(logits.float(), labels, reduction="sum").double()
        self.count += labels.numel()

    def compute(self) -> dict[str, float]:
        loss_sum, count = self.loss_sum.clone(), self.count.clone()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(loss_sum)
            torch.distributed.all_reduce(count)
        n = count.item()
        return {
            "auc": float(self.auroc.compute()) if n else math.nan,
            "logloss": loss_sum.item() / n if n else math.nan,
            "accuracy": float(self.accuracy.compute()) if n else math.nan,
            "samples": int(n),
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
        self.sinks: list[Callable[[dict], None]] = []  # also handed every record written (TensorBoard)
        self.t0 = time.time()
        self.records = 0
        if enabled and path.exists():
            text = path.read_text()
            lines = text.splitlines(keepends=True)
            kept = [line for line in lines[:keep] if line.endswith("\n")]
            if len(kept) != len(lines):
                atomic_write_text(path, "".join(kept))
            self.records = len(kept)

    def write(self, kind: str, **fields) -> None:
        if not self.enabled:
            return
        record = {"kind": kind, "time": round(time.time() - self.t0, 3), **fields}
        with open(self.path, "a") as f:
            f.write(json.dumps(record, default=_plain) + "\n")
        self.records += 1
        for sink in self.sinks:
            sink(record)


def _plain(x):
    if isinstance(x, torch.Tensor):
        return x.item() if x.numel() == 1 else x.tolist()
    return str(x)


def format_table(rows: list[tuple[str, object]], title: str = "") -> str:
    """A two-column table: name | value."""
    cells = [(k, _fmt(v)) for k, v in rows]
    w0 = max(len(k) for k, _ in cells)
    w1 = max(len(v) for _, v in cells)
    line = "+" + "-" * (w0 + 2) + "+" + "-" * (w1 + 2) + "+"
    out = [title] if title else []
    out.append(line)
    out.extend(f"| {k:<{w0}} | {v:>{w1}} |" for k, v in cells)
    out.append(line)
    return "\n".join(out)


def _fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        if v.is_integer() and abs(v) >= 1000:  # counters that stats() reports as floats
            return f"{int(v):,}"
        return f"{v:,.4f}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


# Embedding stats that describe the cache (take the latest value) rather than count events.
_LEVELS = {"cache_bytes", "cache_rows", "static_rows", "static_bytes", "window_rows", "window_bytes",
           "window_needed_rows"}


class StatsTotals:
    """Adds up the per-interval counters of ``EmbeddingBackend.stats()`` over a whole run.

    Rates are averaged weighted by the accesses of each interval, sizes keep their last value,
    everything else is summed.  ``combine`` merges the totals of several ranks.
    """

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weighted: dict[str, float] = {}
        self.weight: dict[str, float] = {}
        self.levels: dict[str, float] = {}

    def add(self, stats: dict[str, float]) -> None:
        w = float(stats.get("accesses", 1.0))
        for k, v in stats.items():
            if k in _LEVELS:
                self.levels[k] = v
            elif "rate" in k:
                weight = w if not k.startswith("hit_rate/") else 1.0
                self.weighted[k] = self.weighted.get(k, 0.0) + v * weight
                self.weight[k] = self.weight.get(k, 0.0) + weight
            else:
                self.sums[k] = self.sums.get(k, 0.0) + v

    def combine(self, others: list["StatsTotals"]) -> "StatsTotals":
        out = StatsTotals()
        for o in others:
            for k, v in o.sums.items():
                out.sums[k] = out.sums.get(k, 0.0) + v
            for k, v in o.weighted.items():
                out.weighted[k] = out.weighted.get(k, 0.0) + v
                out.weight[k] = out.weight.get(k, 0.0) + o.weight[k]
            for k, v in o.levels.items():
                out.levels[k] = out.levels.get(k, 0.0) + v  # per-rank caches add up
        return out

    def result(self, per_table: bool = True) -> dict[str, float]:
        out = dict(self.sums)
        out.update({k: self.weighted[k] / self.weight[k] for k in self.weighted if self.weight[k]})
        out.update(self.levels)
        if not per_table:
            out = {k: v for k, v in out.items() if "/" not in k}
        return dict(sorted(out.items()))
