"""The DLRM module: every parameter and buffer on the device it was built for."""

from __future__ import annotations

import torch

from dlrm_cache.embedding.base import SparseOptim, TableSpec
from dlrm_cache.embedding.direct import HostBackend
from dlrm_cache.model.dlrm import DLRM


def test_model_built_on_a_device_keeps_all_its_state_there():
    """torchrec's InteractionArch has an index buffer: left on the CPU it costs a copy per step on
    a GPU, and DDP (which broadcasts buffers) cannot send it over NCCL.  The meta device stands in."""
    emb = HostBackend([TableSpec("C1", 10, 4), TableSpec("C2", 20, 4)], SparseOptim())
    model = DLRM(emb, 13, 4, [8], [8], device=torch.device("meta"))
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    assert len(tensors) > 4
    assert {name: t.device.type for name, t in tensors if t.device.type != "meta"} == {}
