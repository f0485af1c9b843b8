"""Checks before a training run allocates: the dense layers, their gradients and their optimizer
state against the memory where they live (the embedding tables' host memory check is
:func:`.embeddings.check_host_memory`)."""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig, OmegaConf

from ..data.format import Manifest
from ..model.dcn import cross_shape
from ..model.dlrm import dense_shapes
from ..parallel.dist import DistInfo
from ..parallel.placement import available_host_bytes
from .optim import dense_state_floats


def device_bytes(device: torch.device, local_ranks: int) -> float:
    """Free memory where a rank's dense part lives: the GPU's, or the host's shared by its ranks."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    return available_host_bytes(local_ranks)


def check_dense_memory(
    cfg: DictConfig, manifest: Manifest, device: torch.device, info: DistInfo
) -> None:
    """Fail before allocating when the MLPs, their gradients and their optimizer state cannot fit
    where they live (every rank holds all of them), naming the layer keys that hold the most."""
    shapes = dense_shapes(
        len(manifest.dense_names),
        len(manifest.sparse_names),
        cfg.model.embedding_dim,
        list(cfg.model.bottom_mlp),
        list(cfg.model.top_mlp),
        cross_shape(cfg.model),
    )
    per_key = {
        key: sum(math.prod(s) for k, s in shapes.items() if k.startswith(part + "."))
        for key, part in (
            ("model.bottom_mlp", "dense_arch"),
            ("model.dcn_low_rank_dim", "inter_arch"),
            ("model.top_mlp", "over_arch"),
        )
    }
    params = sum(math.prod(s) for s in shapes.values())
    o = cfg.optim.dense
    need = 4 * params * (2 + dense_state_floats(o.name, o.momentum))  # weight, gradient, state
    have = device_bytes(device, info.local_world_size)
    if need > have:
        keys = [k for k, n in sorted(per_key.items(), key=lambda kv: -kv[1]) if n >= params / 10]
        raise ValueError(
            ", ".join(f"{k}={OmegaConf.select(cfg, k)}" for k in keys)
            + f": the dense layers' {params:,} parameters take {need / 2**30:.2f} GiB with their "
            f"gradients and optim.dense.name={o.name} state, but {have / 2**30:.2f} GiB of "
            f"{'GPU' if device.type == 'cuda' else 'host'} memory are available; use smaller layers"
        )
