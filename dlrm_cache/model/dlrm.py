"""DLRM: bottom MLP on dense features, pooled embeddings, an interaction, top MLP.

The interaction is DLRM's pairwise dots, or DCN-v2's low-rank cross network (:mod:`.dcn`: the
model torchrec calls DLRM_DCN, MLPerf DLRM v2's).

The MLPs are torchrec's own modules, the interaction computes torchrec's InteractionArch output
with a cheaper backward; the embeddings come from any EmbeddingBackend, so the model does not know
(or care) where the embedding rows live.

The dense path (bottom MLP, interaction, top MLP) runs in the configured precision (bf16 autocast,
weights stay fp32) and, with ``compile=True``, as one torch.compile'd function in training mode.
Embedding lookups stay outside both: fbgemm's kernels are not autocast ops, and pooled embeddings
come out in fp32 (fbgemm's CPU training kernels have no bf16 output: "split_embedding_cpu_forward_1
not implemented for 'BFloat16'" with fbgemm-gpu-cpu 1.8), to be cast where the interaction reads them.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torchrec.models.dlrm import DenseArch, OverArch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..config.choices import Pooling, Precision
from ..embedding.base import EmbeddingBackend
from .dcn import CrossShape, DcnInteraction, over_in_features


class DotInteraction(nn.Module):
    """torchrec's InteractionArch output: ``[dense, upper-triangle pairwise dots of (dense, sparse...)]``.

    Same batched matrix product, then the upper triangle taken as one ``index_select`` over the
    flattened ``[B, (F+1)^2]`` products instead of a two-index gather: the gather's backward is an
    accumulating ``index_put`` (a sort plus a serial kernel, ~1.4 ms of a 9 ms step on the H100
    profile of 2026-11-23), ``index_select``'s backward is a plain ``index_add``.  Values are
    bit-identical to torchrec's, forward and backward (tests/model/test_dlrm.py).
    """

    pair_index: torch.Tensor  # a buffer (registered in __init__)

    def __init__(self, num_sparse_features: int, device: torch.device | None = None) -> None:
        super().__init__()
        n = num_sparse_features + 1
        rows, cols = torch.triu_indices(n, n, offset=1, device=device)
        # with the activations (and DDP broadcasts buffers over NCCL); not state: rebuilt from F
        self.register_buffer("pair_index", rows * n + cols, persistent=False)

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        # sparse rows come in fp32 from fbgemm: join the dense part's dtype (bf16 under autocast)
        combined = torch.cat(
            (dense_features.unsqueeze(1), sparse_features.to(dense_features.dtype)), dim=1
        )
        products = torch.bmm(combined, combined.transpose(1, 2))
        return torch.cat(
            (dense_features, products.flatten(1).index_select(1, self.pair_index)), dim=1
        )


class DLRM(nn.Module):
    def __init__(
        self,
        embeddings: EmbeddingBackend,
        num_dense: int,
        embedding_dim: int,
        bottom_mlp: list[int],
        top_mlp: list[int],
        device: torch.device | None = None,
        precision: Precision = Precision.fp32,
        compile: bool = False,
        cross: CrossShape | None = None,
        pooling: Pooling = Pooling.sum,
    ) -> None:
        """``cross``: DCN-v2's interaction of that shape (:func:`.dcn.cross_shape`), None: dots;
        ``pooling``: how a sample's ids of a feature are pooled (:meth:`EmbeddingBackend.pool`)."""
        super().__init__()
        self.pooling = Pooling(pooling)
        num_sparse = len(embeddings.feature_names)
        self.embeddings = embeddings
        self.num_sparse = num_sparse
        self.embedding_dim = embedding_dim
        parts = dense_parts(
            num_dense, num_sparse, embedding_dim, bottom_mlp, top_mlp, device, cross
        )
        self.dense_arch, self.inter_arch, self.over_arch = (parts[p] for p in DENSE_PARTS)
        self.precision = precision
        # Training batches have one shape (drop_last), so the graph is specialised to it
        # (dynamic=False); evaluation batches vary in size and run eagerly rather than recompile.
        self._compiled = torch.compile(self._dense_path, dynamic=False) if compile else None

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        return self.dense_forward(dense, self.pooled(sparse))

    def pooled(self, sparse: KeyedJaggedTensor) -> torch.Tensor:
        """The pooled embeddings ``[B, F*D]`` of ``sparse`` by the model's pooling (the lookups,
        outside the compiled and autocast dense path)."""
        return self.embeddings.pool(sparse, self.pooling).values()

    def dense_forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Logits (fp32, ``[B]``) from dense features and pooled embeddings ``[B, F*D]`` (features
        in order): everything of the step but the embedding lookups, compiled when training."""
        if self._compiled is not None and self.training:
            return self._compiled(dense, pooled)
        return self._dense_path(dense, pooled)

    def _dense_path(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        with torch.autocast(
            dense.device.type, dtype=torch.bfloat16, enabled=self.precision is Precision.bf16
        ):
            embedded_dense = self.dense_arch(dense)
            embedded_sparse = pooled.view(pooled.shape[0], self.num_sparse, self.embedding_dim)
            logits = self.over_arch(self.inter_arch(embedded_dense, embedded_sparse)).squeeze(-1)
        return logits.float()

    def dense_parameters(self) -> Iterator[nn.Parameter]:
        """Everything the dense optimizer owns (embedding rows are updated inside fbgemm)."""
        return self.parameters()

    def dense_state_dict(self) -> dict[str, torch.Tensor]:
        """The MLPs only: embedding tables are checkpointed per owner (see train/checkpoint.py)."""
        return {
            f"{part}.{k}": v
            for part in DENSE_PARTS
            for k, v in getattr(self, part).state_dict().items()
        }

    def load_dense_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """``state`` as :meth:`dense_state_dict` gives it (a checkpoint's is checked against its
        config when it is opened: :func:`dense_state_problem`)."""
        for part in DENSE_PARTS:
            prefix = part + "."
            getattr(self, part).load_state_dict(
                {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            )


# the dense part's modules, in the order of its state dict (``<part>.<the module's key>``)
DENSE_PARTS = ("dense_arch", "inter_arch", "over_arch")


def dense_parts(
    num_dense: int,
    num_sparse: int,
    embedding_dim: int,
    bottom_mlp: list[int],
    top_mlp: list[int],
    device: torch.device | None = None,
    cross: CrossShape | None = None,
) -> dict[str, nn.Module]:
    """The dense part of a DLRM, by :data:`DENSE_PARTS` name (on the ``meta`` device: shapes only,
    nothing allocated, whatever the sizes); ``cross``: a DCN-v2 interaction, None: dots."""
    check_model_shape(embedding_dim, bottom_mlp, top_mlp)
    inter: nn.Module
    if cross is None:
        inter = DotInteraction(num_sparse, device=device)
        over_in = embedding_dim + (num_sparse + 1) * num_sparse // 2
    else:
        inter = DcnInteraction(num_sparse, embedding_dim, cross, device=device)
        over_in = over_in_features(num_sparse, embedding_dim)
    return {
        # The bottom MLP must end in the embedding dim: its output joins the interaction.
        "dense_arch": DenseArch(num_dense, list(bottom_mlp) + [embedding_dim], device=device),
        "inter_arch": inter,
        "over_arch": OverArch(over_in, list(top_mlp) + [1], device=device),
    }


def dense_shapes(
    num_dense: int,
    num_sparse: int,
    embedding_dim: int,
    bottom_mlp: list[int],
    top_mlp: list[int],
    cross: CrossShape | None = None,
) -> dict[str, tuple[int, ...]]:
    """:meth:`DLRM.dense_state_dict`'s entries and shapes for such a model, allocating nothing."""
    parts = dense_parts(
        num_dense, num_sparse, embedding_dim, bottom_mlp, top_mlp, torch.device("meta"), cross
    )
    return {
        f"{name}.{k}": tuple(v.shape)
        for name, part in parts.items()
        for k, v in part.state_dict().items()
    }


def dense_state_problem(state: object, shapes: dict[str, tuple[int, ...]]) -> str | None:
    """What keeps ``state`` from loading into a dense part of ``shapes`` (:func:`dense_shapes`):
    a missing, extra or non-float32 entry, or one of another shape; None if it loads."""
    if not isinstance(state, dict):
        return f"a {type(state).__name__}, not the model's state"
    for k, shape in shapes.items():
        v = state.get(k)
        if not isinstance(v, torch.Tensor):
            return f"no tensor {k}"
        if tuple(v.shape) != shape or v.dtype != torch.float32:
            dtype = str(v.dtype).removeprefix("torch.")
            return f"{k} is {dtype} {list(v.shape)}, the model's is float32 {list(shape)}"
    extra = sorted(set(state) - set(shapes))
    return f"{extra[0]} is no entry of the model" if extra else None


def check_model_shape(embedding_dim: int, bottom_mlp: list[int], top_mlp: list[int]) -> None:
    if embedding_dim <= 0:
        raise ValueError(f"model.embedding_dim={embedding_dim}: must be positive")
    for key, layers in (("model.bottom_mlp", bottom_mlp), ("model.top_mlp", top_mlp)):
        if any(int(x) <= 0 for x in layers):
            raise ValueError(f"{key}={list(layers)}: layer sizes must be positive")
