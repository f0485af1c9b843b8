"""The numerics of a training step that live outside the model: matrix-product precision and the
dense optimizer's implementation.  (Autocast and torch.compile of the dense path are the model's,
see model/dlrm.py, so evaluation runs the same arithmetic as training.)"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..config import Precision

# Optimizers whose fused (one kernel for all parameters) implementation exists on a device type in
# every torch this project supports (2.11 and 2.13).  Adagrad's fused CUDA kernel is newer than some
# of them, so there it runs as foreach (a few multi-tensor kernels), still not one kernel per tensor.
FUSED_DEVICES = {"sgd": {"cpu", "cuda"}, "adam": {"cpu", "cuda"}, "adagrad": {"cpu"}}


def set_matmul_precision(precision: Precision, device: torch.device) -> None:
    """TF32 matrix products on CUDA for ``tf32`` and ``bf16`` (the products autocast keeps in fp32),
    exact fp32 products for ``fp32``.  A no-op on the CPU: there fp32 and tf32 are the same thing.

    Process-wide state in torch: set for every run (or bench variant), so none inherits another's.
    """
    if device.type == "cuda":
        torch.set_float32_matmul_precision("highest" if precision is Precision.fp32 else "high")


def dense_optimizer_impl(name: str, device: torch.device) -> dict[str, bool]:
    """``fused=True`` where the device has the fused kernel, else ``foreach=True``."""
    if device.type in FUSED_DEVICES.get(name, set()):
        return {"fused": True}
    return {"foreach": True}


def dense_optimizer(name: str, params: Iterable[torch.nn.Parameter], device: torch.device, lr: float,
                    weight_decay: float = 0.0, momentum: float = 0.0) -> torch.optim.Optimizer:
    """The MLPs' optimizer (embedding rows are updated inside fbgemm's backward)."""
    impl = dense_optimizer_impl(name, device)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, **impl)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, weight_decay=weight_decay, **impl)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, **impl)
    raise ValueError(f"optim.dense.name={name!r}: choose one of {sorted(FUSED_DEVICES)}")
