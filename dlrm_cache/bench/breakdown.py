"""Where a DLRM training step's time goes (``bench kind=train``): the step split into its phases.

The split step computes what the training step computes (same forward, same gradients, same
updates), only with the embedding output detached between the two backward calls so that the
dense backward and the embedding backward (with fbgemm's fused row update) are timed apart.
On a GPU the phases are CUDA events on the compute stream, read once after the last step (no
synchronisation inside a step); each phase's time is the device time from the end of the previous
phase to its own end, so it includes the device idling while the host launches that phase's
kernels.  On the CPU they are ``perf_counter`` marks.  "between steps" is the rest of the wall time:
the input pipeline, the cache's prefetch on the training thread, and the device idling in between.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ..data.batch import Batch
from ..model.dlrm import DLRM

PHASES = (
    "embedding forward",
    "dense forward",
    "dense backward",
    "embedding backward+update",
    "optimizer",
)
BETWEEN = "between steps"


class PhaseClock:
    """Marks at phase ends, per step: CUDA events on a GPU, host clock readings on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.steps: list[list] = []

    def _now(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def reset(self) -> None:
        """Forget the steps so far (the warm-up of the split step)."""
        self.steps.clear()

    def start(self) -> None:
        self.steps.append([self._now()])

    def mark(self) -> None:
        self.steps[-1].append(self._now())

    def _ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else 1000 * (b - a)

    def result(self) -> dict[str, float]:
        """Mean ms per step for each phase and for the time between steps."""
        if self.cuda:
            self.steps[-1][-1].synchronize()
        n = len(self.steps)
        out = {
            p: sum(self._ms(s[i], s[i + 1]) for s in self.steps) / n for i, p in enumerate(PHASES)
        }
        # from the first step's start to the last one's end, minus the phases: the gaps between steps
        wall = self._ms(self.steps[0][0], self.steps[-1][-1]) / n
        out[BETWEEN] = wall - sum(out.values())
        return out


def split_step(model: DLRM, opt: torch.optim.Optimizer, batch: Batch, clock: PhaseClock) -> None:
    """One training step, phase by phase (the model in training mode, as in the trainer)."""
    clock.start()
    pooled = model.pooled(batch.sparse)
    clock.mark()
    leaf = pooled.detach().requires_grad_()
    loss = F.binary_cross_entropy_with_logits(model.dense_forward(batch.dense, leaf), batch.labels)
    clock.mark()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    clock.mark()
    pooled.backward(leaf.grad)
    clock.mark()
    opt.step()
    clock.mark()


def format_breakdown(phases: dict[str, float]) -> str:
    return "    " + "  ".join(f"{name} {ms:.3f}" for name, ms in phases.items()) + " (ms/step)"
