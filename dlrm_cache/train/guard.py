"""The loss guard: training stops on a loss that says the run has gone wrong, before it is saved.

Every step's loss is kept on the device (a reference to the detached 0-d tensor: no copy, no host
sync) and :meth:`LossGuard.check` reads them all at once where the loop reads the device anyway:
at each log interval, and before every evaluation and checkpoint.  So a checkpoint never holds
a step after a bad one: the last good checkpoint stays the newest.

A step's loss is bad when it is not finite, or when it exceeds ``factor`` times the largest loss
of the ``window`` steps checked before it (once ``least`` of them have been seen).  The largest,
not a typical, loss: small batches have single-sample losses many times the median, and a
diverging run's loss grows by orders of magnitude (the issue's damaged shard: 7e27), so the bound
catches those and not a noisy run.  Under torchrun the per-step losses are averaged over the ranks
first (one all-reduce per check), so every rank reaches the same verdict on the same step.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist


class LossDiverged(ValueError):
    """A bad loss: the message names the step, the loss, the bound and the batch's shards."""


class LossGuard:
    def __init__(
        self, factor: float, data_root: str | Path, window: int = 1000, least: int = 10
    ) -> None:
        self.factor = factor  # 0: only non-finite losses stop the run
        self.root = Path(data_root)
        self.least = least
        self.recent: deque[float] = deque(maxlen=window)  # checked losses, oldest first
        self._losses: list[torch.Tensor] = []
        self._steps: list[tuple[int, Sequence[str]]] = []  # (step, the shards of its batch)

    def record(self, step: int, loss: torch.Tensor, source: Sequence[str]) -> None:
        """Step ``step`` (counted from 1) had ``loss`` on a batch from the shards ``source``."""
        self._losses.append(loss.detach())
        self._steps.append((step, source))

    def check(self) -> None:
        """Raise :class:`LossDiverged` for the first bad step recorded since the last check."""
        if not self._losses:
            return
        values = torch.stack(self._losses).float()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(values)
            values /= dist.get_world_size()
        steps, self._losses, self._steps = self._steps, [], []
        for (step, source), v in zip(steps, values.tolist()):
            why = self.problem(v)
            if why is not None:
                shards = ", ".join(str(self.root / s) for s in source) or "an unknown shard"
                raise LossDiverged(
                    f"step {step}: training loss {v:.4g} {why}, on a batch from {shards}; stopped "
                    "before saving it (the newest checkpoint is the last good one). Check the data "
                    "(`dlrm-cache verify`) or lower the learning rates"
                )
            self.recent.append(v)

    def bound(self) -> float | None:
        """The largest loss the next step may have (None: no bound yet, or ``factor`` is 0)."""
        if self.factor <= 0 or len(self.recent) < self.least:
            return None
        return self.factor * max(self.recent)

    def problem(self, loss: float) -> str | None:
        if not math.isfinite(loss):
            return "is not finite"
        bound = self.bound()
        if bound is not None and loss > bound:
            return (
                f"is more than {self.factor:g}x the largest of the previous {len(self.recent)} "
                f"steps ({bound / self.factor:.4g})"
            )
        return None
