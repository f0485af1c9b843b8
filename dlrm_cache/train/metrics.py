"""Metrics: torchmetrics for AUC/accuracy, JSON lines for the record, a small table for people."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torchmetrics.classification import BinaryAccuracy, BinaryAUROC


class EvalMetrics:
    """AUC, log loss and accuracy over one pass of a split (reduced across ranks by torchmetrics)."""

    def __init__(self, device: torch.device) -> None:
        self.auroc = BinaryAUROC().to(device)
        self.accuracy = BinaryAccuracy().to(device)
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.count = torch.zeros((), dtype=torch.float64, device=device)

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
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
    """Appends one JSON object per line; only rank 0 writes."""

    def __init__(self, path: Path, enabled: bool = True) -> None:
        self.path = path
        self.enabled = enabled
        self.t0 = time.time()

    def write(self, kind: str, **fields) -> None:
        if not self.enabled:
            return
        record = {"kind": kind, "time": round(time.time() - self.t0, 3), **fields}
        with open(self.path, "a") as f:
            f.write(json.dumps(record, default=_plain) + "\n")


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
        return f"{v:,.4f}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)
