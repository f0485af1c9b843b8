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


# the dense optimizers optim.dense.momentum applies to (dense_optimizer passes it to these only)
MOMENTUM_OPTIMIZERS = ("sgd",)


def dense_state_fields(name: str, momentum: float = 0.0) -> tuple[str, ...]:
    """The state torch's optimizer keeps per dense parameter, each of the parameter's shape:
    Adam's two moments, Adagrad's sum of squares, SGD's momentum buffer (when it has momentum).
    Adam and Adagrad also count their steps (``step``, a scalar)."""
    fields = {"adam": ("exp_avg", "exp_avg_sq"), "adagrad": ("sum",)}
    return fields.get(name, ("momentum_buffer",) if momentum else ())


def dense_state_floats(name: str, momentum: float = 0.0) -> int:
    """Floats of optimizer state per dense parameter (:func:`dense_state_fields`)."""
    return len(dense_state_fields(name, momentum))


def dense_optimizer_problem(
    state: Any, shapes: list[tuple[int, ...]], name: str, momentum: float = 0.0
) -> str | None:
    """What keeps ``state`` (a checkpoint's ``optimizer.state_dict()``) from being the state of
    optimizer ``name`` over dense parameters of ``shapes`` (in the model's order): one group of
    them all, and each parameter's state (none yet, or :func:`dense_state_fields` as float32
    tensors of its shape, with ``step`` where the optimizer counts them); None if it is."""
    if not isinstance(state, dict) or not isinstance(state.get("state"), dict):
        return "no per-parameter state"
    groups = state.get("param_groups")
    if not (isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], dict)):
        return "not one parameter group"
    if groups[0].get("params") != list(range(len(shapes))):
        return f"its parameter group is not the model's {len(shapes)} dense parameters"
    fields = set(dense_state_fields(name, momentum))
    counted = fields | ({"step"} if name in ("adam", "adagrad") else set())
    for i, entry in state["state"].items():
        if not isinstance(i, int) or not 0 <= i < len(shapes) or not isinstance(entry, dict):
            return f"state of no parameter ({i!r})"
        if entry and set(entry) != counted:
            return f"parameter {i} holds {sorted(entry)}, not {sorted(counted)}"
        for k in fields & set(entry):
            v = entry[k]
            if not isinstance(v, torch.Tensor) or v.dtype != torch.float32:
                return f"parameter {i}'s {k} is not a float32 tensor"
            if tuple(v.shape) != shapes[i]:
                return f"parameter {i}'s {k} is {list(v.shape)}, the parameter {list(shapes[i])}"
    return None


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
