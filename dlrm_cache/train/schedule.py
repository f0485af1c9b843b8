"""The learning-rate schedule: one scale for the dense and the sparse learning rates per step."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from ..model.dlrm import DLRM


def lr_scale(step: int, warmup_steps: int, decay_start: int = 0, decay_steps: int = 0) -> float:
    """Linear warm-up, constant, then polynomial decay to zero (MLPerf DLRM's schedule)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay_steps > 0 and step >= decay_start:
        return max(0.0, 1.0 - (step - decay_start) / decay_steps) ** 2
    return 1.0


def set_learning_rates(model: DLRM, opt: torch.optim.Optimizer, cfg: DictConfig, step: int) -> None:
    """The configured learning rates (``optim.dense.lr``, ``optim.sparse.lr``) scaled for
    ``step``."""
    scale = lr_scale(step, cfg.optim.warmup_steps, cfg.optim.decay_start, cfg.optim.decay_steps)
    for group in opt.param_groups:
        group["lr"] = cfg.optim.dense.lr * scale
    model.embeddings.set_learning_rate(cfg.optim.sparse.lr * scale)
