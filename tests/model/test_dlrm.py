"""The DLRM module: every parameter and buffer on the device it was built for; the interaction
equals torchrec's."""

from __future__ import annotations

import pytest
import torch
from torchrec.models.dlrm import InteractionArch

from dlrm_cache.embedding.base import SparseOptim, TableSpec
from dlrm_cache.embedding.direct import HostBackend
from dlrm_cache.model.dlrm import DLRM, DotInteraction


def test_model_built_on_a_device_keeps_all_its_state_there():
    """The interaction has an index buffer: left on the CPU it costs a copy per step on
    a GPU, and DDP (which broadcasts buffers) cannot send it over NCCL.  The meta device stands in."""
    emb = HostBackend([TableSpec("C1", 10, 4), TableSpec("C2", 20, 4)], SparseOptim())
    model = DLRM(emb, 13, 4, [8], [8], device=torch.device("meta"))
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    assert len(tensors) > 4
    assert {name: t.device.type for name, t in tensors if t.device.type != "meta"} == {}


@pytest.mark.parametrize("num_sparse", [1, 4, 26])
def test_dot_interaction_equals_torchrecs_interaction_arch_bit_for_bit(num_sparse):
    """Same products, a different gather: the output and both input gradients are identical."""
    g = torch.Generator().manual_seed(num_sparse)
    dense = torch.randn(7, 5, generator=g)
    sparse = torch.randn(7, num_sparse, 5, generator=g)
    upstream = torch.randn(7, 5 + (num_sparse + 1) * num_sparse // 2, generator=g)
    results = []
    for arch in (InteractionArch(num_sparse_features=num_sparse), DotInteraction(num_sparse)):
        d, s = dense.clone().requires_grad_(), sparse.clone().requires_grad_()
        out = arch(d, s)
        out.backward(upstream)
        results.append((out.detach(), d.grad, s.grad))
    for ref, ours in zip(*results):
        assert torch.equal(ref, ours)


def test_dot_interaction_under_bf16_autocast_joins_the_dense_dtype():
    """fbgemm's pooled rows arrive in fp32; under autocast the interaction runs in bf16 (its output
    too) and stays within bf16 rounding of the fp32 result."""
    g = torch.Generator().manual_seed(0)
    dense, sparse = torch.randn(4, 8, generator=g), torch.randn(4, 3, 8, generator=g)
    arch = DotInteraction(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = arch(dense.bfloat16(), sparse)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), arch(dense, sparse), rtol=2e-2, atol=5e-2)
