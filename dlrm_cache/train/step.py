"""One training step, as the trainer and `dlrm-cache bench kind=train` run it, and the numerics of
a step that live outside the model: matrix-product precision.  (Autocast and torch.compile of the
dense path are the model's, see model/dlrm.py, so evaluation runs the same arithmetic as
training.)"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config.choices import Precision
from ..data.batch import Batch


def train_step(net: torch.nn.Module, opt: torch.optim.Optimizer, batch: Batch) -> torch.Tensor:
    """Forward, loss, backward and the dense optimizer's update for one batch; the loss (on the
    device: reading it waits for the step).  The embedding rows are updated inside the backward."""
    logits = net(batch.dense, batch.sparse)
    loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def set_matmul_precision(precision: Precision, device: torch.device) -> None:
    """TF32 matrix products on CUDA for ``tf32`` and ``bf16`` (the products autocast keeps in fp32),
    exact fp32 products for ``fp32``.  A no-op on the CPU: there fp32 and tf32 are the same thing.

    Process-wide state in torch: set for every run (or bench variant), so none inherits another's.
    """
    if device.type == "cuda":
        torch.set_float32_matmul_precision("highest" if precision is Precision.fp32 else "high")
