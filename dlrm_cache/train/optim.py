"""The dense optimizer (the MLPs'): which one, and its fastest implementation on the device.
Embedding rows are updated inside fbgemm's backward (``embedding.base.SparseOptim``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from omegaconf import DictConfig

# Optimizers whose fused (one kernel for all parameters) implementation exists on a device type in
# every torch this project supports (2.11 and 2.13).  Adagrad's fused CUDA kernel is newer than
# some of them, so there it runs as foreach (a few multi-tensor kernels), still not one kernel per
# tensor.
FUSED_DEVICES = {"sgd": {"cpu", "cuda"}, "adam": {"cpu", "cuda"}, "adagrad": {"cpu"}}


def dense_state_floats(name: str, momentum: float = 0.0) -> int:
    """Floats of optimizer state per dense parameter: Adam's two moments, Adagrad's sum of squares,
    SGD's momentum buffer (when it has momentum)."""
    return {"adam": 2, "adagrad": 1}.get(name, 1 if momentum else 0)


def dense_optimizer_impl(name: str, device: torch.device) -> dict[str, Any]:
    """``fused=True`` where the device has the fused kernel, else ``foreach=True``."""
    if device.type in FUSED_DEVICES.get(name, set()):
        return {"fused": True}
    return {"foreach": True}


def dense_optimizer(
    name: str,
    params: Iterable[torch.nn.Parameter],
    device: torch.device,
    lr: float,
    weight_decay: float = 0.0,
    momentum: float = 0.0,
) -> torch.optim.Optimizer:
    """The MLPs' optimizer (embedding rows are updated inside fbgemm's backward)."""
    impl = dense_optimizer_impl(name, device)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, **impl)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, weight_decay=weight_decay, **impl)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, **impl)
    raise ValueError(f"optim.dense.name={name!r}: choose one of {sorted(FUSED_DEVICES)}")


# the param-group keys that say how an optimizer runs (which kernels), not what it computes
IMPL_KEYS = ("fused", "foreach")


def load_dense_state(opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """``opt.load_state_dict(state)`` keeping ``opt``'s implementation (:data:`IMPL_KEYS`, chosen
    for this device by :func:`dense_optimizer_impl`) rather than the writer's: a checkpoint written
    on a GPU resumes on a CPU and back, and the writer's flags may name a kernel this device lacks
    (torch 2.11 has no fused Adagrad on CUDA).  Set before loading, so the state's tensors are
    placed as this implementation wants them."""
    groups = [
        {**saved, **{k: now.get(k) for k in IMPL_KEYS}}
        for saved, now in zip(state["param_groups"], opt.param_groups, strict=True)
    ]
    opt.load_state_dict({**state, "param_groups": groups})


def build_dense_optimizer(
    cfg: DictConfig, params: Iterable[torch.nn.Parameter], device: torch.device
) -> torch.optim.Optimizer:
    """:func:`dense_optimizer` as the train config's ``optim.dense`` says."""
    o = cfg.optim.dense
    return dense_optimizer(o.name, params, device, o.lr, o.weight_decay, o.momentum)
