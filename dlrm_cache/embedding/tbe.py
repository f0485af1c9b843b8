"""fbgemm table-batched embeddings (TBE): construction and row access shared by every backend.

fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen`` keeps all tables of one module in one flat buffer
per placement (``weights_dev``/``weights_host``/``weights_uvm``) and applies the optimizer inside
the backward kernel.  When every table has the same dimension, the flat buffer viewed as
``[sum(rows), dim]`` is the tables stacked in order; the freq_cache uses exactly that view to move
rows and their optimizer state in and out of its slot buffer.
"""

from __future__ import annotations

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
    BoundsCheckMode,
    CacheAlgorithm,
    EmbeddingLocation,
    PoolingMode,
)
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)

from .base import SparseOptim

_OPTIM = {
    "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "adagrad": EmbOptimType.EXACT_ADAGRAD,
    "sgd": EmbOptimType.EXACT_SGD,
}

CACHE_ALGORITHMS = {"lru": CacheAlgorithm.LRU, "lfu": CacheAlgorithm.LFU}


def make_tbe(
    rows: list[int],
    dim: int,
    optim: SparseOptim,
    device: torch.device,
    location: EmbeddingLocation | None = None,
    **kwargs,
) -> SplitTableBatchedEmbeddingBagsCodegen:
    """A TBE with one table per entry of ``rows``, the fused optimizer and sum pooling."""
    if device.type == "cpu":
        location, compute = EmbeddingLocation.HOST, ComputeDevice.CPU
    else:
        location, compute = location or EmbeddingLocation.DEVICE, ComputeDevice.CUDA
    specs = [(int(r), int(dim), location, compute) for r in rows]
    return SplitTableBatchedEmbeddingBagsCodegen(
        specs,
        optimizer=_OPTIM[optim.name],
        learning_rate=optim.lr,
        eps=optim.eps,
        pooling_mode=PoolingMode.SUM,
        device=device,
        # Indices are validated once in the loader; the kernels' own check costs a pass per step.
        bounds_check_mode=BoundsCheckMode.NONE,
        **kwargs,
    )


def _flat(tbe: SplitTableBatchedEmbeddingBagsCodegen, prefix: str) -> torch.Tensor:
    """The one non-empty buffer among ``<prefix>_dev``, ``_host`` and ``_uvm``."""
    for suffix in ("dev", "host", "uvm"):
        t = getattr(tbe, f"{prefix}_{suffix}", None)
        if t is not None and t.numel() > 0:
            return t
    raise RuntimeError(f"TBE has no {prefix} buffer")


def weights_view(tbe: SplitTableBatchedEmbeddingBagsCodegen, dim: int) -> torch.Tensor:
    """All rows of all tables as one ``[sum(rows), dim]`` view (tables stacked in order).

    ``.data``, not ``.detach()``: the cache fills and evicts slots while a batch's backward is
    still pending.  Those slots are never the batch's own (its slots stay pinned until it retires),
    so the writes must not bump the version counter autograd checks on the saved weights.
    """
    return _flat(tbe, "weights").data.view(-1, dim)


def momentum_view(
    tbe: SplitTableBatchedEmbeddingBagsCodegen, optim: SparseOptim, dim: int
) -> torch.Tensor | None:
    """Optimizer state as ``[sum(rows)]`` (rowwise) or ``[sum(rows), dim]``; None for SGD."""
    if optim.state_per_row == 0:
        return None
    flat = _flat(tbe, "momentum1").data
    return flat if optim.state_per_row == 1 else flat.view(-1, dim)


def set_learning_rate(tbe: SplitTableBatchedEmbeddingBagsCodegen, lr: float) -> None:
    tbe.set_learning_rate(lr)
