"""The loss guard: training stops on a loss that says the run has gone wrong, before it is saved.

Every step's loss is kept on the device (a reference to the detached 0-d tensor: no copy, no host
sync) and :meth:`LossGuard.check` reads them all at once where the loop reads the device anyway:
at each log interval, and before every evaluation and checkpoint.  So a checkpoint never holds
a step after a bad one: the last good checkpoint stays the newest.

A step is bad when its loss is not finite, or when the mean loss of the last :data:`SAMPLES`
training samples (the steps holding them, this one included) exceeds ``factor`` times the larger
of the loss of chance (ln 2: a model that learned nothing) and the largest such mean of the
``window`` steps judged before it whose samples its own do not include.  A mean over samples, not a step's loss: the loss of one
sample is no measure of a run (a confident model's rare mistake costs 100x its typical sample, so
single-sample batches spread far beyond any factor), while the mean over a thousand samples is as
steady at batch size 1 as at 1024.  The floor at chance: a loss below ``factor`` x ln 2 on average
is a model doing better than coin flips, never a diverged one.  A damaged shard or a learning rate
that diverges sends the mean orders of magnitude past it (the issue's damaged shard: 7e27).
Under torchrun the per-step losses are averaged over the ranks first (one all-reduce per check),
so every rank reaches the same verdict on the same step.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

SAMPLES = 1024  # training samples whose mean loss is judged (at least one step's)
CHANCE = math.log(2)  # the loss of predicting 1/2 for every sample


class LossDiverged(ValueError):
    """A bad loss: the message names the step, the loss, the bound and the batch's shards."""


class LossGuard:
    def __init__(
        self,
        factor: float,
        data_root: str | Path,
        batch_size: int,
        window: int = 1000,
        samples: int = SAMPLES,
    ) -> None:
        """``batch_size``: the global batch of every training step (the loop drops partial ones)."""
        self.factor = factor  # 0: only non-finite losses stop the run
        self.root = Path(data_root)
        self.span = max(1, math.ceil(samples / batch_size))  # steps per judged mean
        self.samples = self.span * batch_size
        self.last: deque[float] = deque(maxlen=self.span)  # the latest steps' losses
        self.recent: deque[float] = deque(maxlen=window)  # judged means, oldest first
        self.overlapping: deque[float] = deque()  # the latest span - 1 means, not yet in recent
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
            why = self.judge(v)
            if why is not None:
                shards = ", ".join(str(self.root / s) for s in source) or "an unknown shard"
                raise LossDiverged(
                    f"step {step}: training loss {v:.4g}{why}, on a batch from {shards}; stopped "
                    "before saving it (the newest checkpoint is the last good one). Check the data "
                    "(`dlrm-cache verify`) or lower the learning rates"
                )

    def bound(self) -> float | None:
        """The largest mean loss the next full window may have (None: ``factor`` is 0)."""
        if self.factor <= 0:
            return None
        return self.factor * max(CHANCE, max(self.recent, default=0.0))

    def judge(self, loss: float) -> str | None:
        """Take the next step's ``loss``: what is wrong with it (to follow the loss in a
        sentence), or None."""
        if not math.isfinite(loss):
            return " is not finite"
        self.last.append(loss)
        if len(self.last) < self.span:  # not yet a mean over SAMPLES samples: nothing to judge
            return None
        mean = sum(self.last) / self.span
        bound = self.bound()
        if bound is not None and mean > bound:
            over = "" if self.span == 1 else f" ({mean:.4g} over its last {self.samples} samples)"
            was = max(self.recent, default=0.0)
            like = (
                f"the largest of the previous {len(self.recent)} steps ({was:.4g})"
                if was > CHANCE
                else f"the loss of chance (ln 2 = {CHANCE:.3f})"
            )
            return f"{over} is more than {self.factor:g}x {like}"
        # a mean enters the reference once its window no longer overlaps the next one: a step
        # change is then judged whole against the means before it, not against its own ramp
        self.overlapping.append(mean)
        while len(self.overlapping) >= self.span:
            self.recent.append(self.overlapping.popleft())
        return None
