"""Metrics: torchmetrics for AUC/accuracy, the embedding counters over a run, a small table for people.
(The run's JSON-lines record is rundir/records.py's.)"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..console.readable import format_value, natural_key
from ..embedding.rates import is_rate, rate_weight_key


class EvalMetrics:
    """AUC, log loss and accuracy over one pass of a split (gathered across ranks at the end).

    ``update`` only queues device work: no host read per batch (torchmetrics' modules check their
    inputs' range on the host at every update), so evaluation batches flow like training ones;
    ``compute`` reads once.  AUC is torchmetrics' exact (threshold-free) ``binary_auroc``; accuracy
    thresholds probabilities at 0.5 as torchmetrics' ``BinaryAccuracy`` does (``p > 0.5``).
    """

    def __init__(self, device: torch.device) -> None:
        self.probs: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.correct = torch.zeros((), dtype=torch.float64, device=device)
        self.count = torch.zeros((), dtype=torch.float64, device=device)

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        probs = torch.sigmoid(logits.float())
        self.probs.append(probs)
        self.labels.append(labels)
        self.loss_sum += F.binary_cross_entropy_with_logits(
            logits.float(), labels, reduction="sum"
        ).double()
        self.correct += ((probs > 0.5) == (labels > 0.5)).sum().double()
        self.count += labels.numel()

    def compute(self) -> dict[str, float]:
        # imported here: torchmetrics pulls in matplotlib (~1 s), which the training steps before the
        # first evaluation do not need
        from torchmetrics.functional.classification import binary_auroc
        from torchmetrics.utilities.distributed import gather_all_tensors

        sums = torch.stack([self.loss_sum, self.correct, self.count])
        probs = torch.cat(self.probs) if self.probs else sums.new_zeros(0, dtype=torch.float32)
        labels = torch.cat(self.labels) if self.labels else probs.new_zeros(0)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(sums)
            probs, labels = (
                torch.cat(gather_all_tensors(probs)),
                torch.cat(gather_all_tensors(labels)),
            )
        loss_sum, correct, n = sums.tolist()
        # one class only (a single line, a split of clicks): no AUC; torchmetrics warned and gave 0
        both = bool(n) and bool(labels.min() != labels.max())
        return {
            "auc": float(binary_auroc(probs, labels.long(), validate_args=False))
            if both
            else math.nan,
            "logloss": loss_sum / n if n else math.nan,
            "accuracy": correct / n if n else math.nan,
            "samples": int(n),
        }


def interval_line(
    step: int, total_steps: int, loss: float, samples_per_s: float, stats: dict[str, float]
) -> str:
    """A log interval for people: its step, mean loss, throughput and cache hit rate."""
    parts = [f"step {step:,}/{total_steps:,}: loss {loss:.4f}", f"{samples_per_s:,.0f} samples/s"]
    for key, what in (("hit_rate", "hit rate"), ("hit_rate_distinct", "hit rate (distinct ids)")):
        if key in stats:
            parts.append(f"{what} {stats[key]:.4f}")
            break
    return ", ".join(parts)


def format_table(rows: list[tuple[str, object]], title: str = "") -> str:
    """A two-column table: name | value (written as ``readable.format_value`` says for the name)."""
    cells = [(k, format_value(k, v)) for k, v in rows]
    w0 = max(len(k) for k, _ in cells)
    w1 = max(len(v) for _, v in cells)
    line = "+" + "-" * (w0 + 2) + "+" + "-" * (w1 + 2) + "+"
    out = [title] if title else []
    out.append(line)
    out.extend(f"| {k:<{w0}} | {v:>{w1}} |" for k, v in cells)
    out.append(line)
    return "\n".join(out)


# Embedding stats that describe the cache (take the latest value) rather than count events.
_LEVELS = {
    "cache_bytes",
    "cache_rows",
    "static_rows",
    "static_bytes",
    "window_rows",
    "window_bytes",
    "window_needed_rows",
}


class StatsTotals:
    """Adds up the per-interval counters of ``EmbeddingBackend.stats()`` over a whole run.

    Each rate is averaged weighted by the count it is a fraction of (``RATE_WEIGHTS``:
    ``hit_rate/C3`` by ``accesses/C3``), so an interval's rate counts as much as its accesses and
    an interval without any adds nothing; a rate never measured has no value.  Sizes keep their
    last value, everything else is summed.  ``combine`` merges the totals of several ranks.
    """

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weighted: dict[str, float] = {}
        self.weight: dict[str, float] = {}
        self.levels: dict[str, float] = {}

    def add(self, stats: dict[str, float]) -> None:
        for k, v in stats.items():
            if k in _LEVELS:
                self.levels[k] = v
            elif is_rate(k):
                weight = stats.get(rate_weight_key(k), 0.0)
                if weight and math.isfinite(v):
                    self.weighted[k] = self.weighted.get(k, 0.0) + v * weight
                    self.weight[k] = self.weight.get(k, 0.0) + weight
            else:
                self.sums[k] = self.sums.get(k, 0.0) + v

    def combine(self, others: list[StatsTotals]) -> StatsTotals:
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
        return dict(sorted(out.items(), key=lambda kv: natural_key(kv[0])))
