"""DLRM: bottom MLP on dense features, pooled embeddings, pairwise dot interaction, top MLP.

The dense parts are torchrec's own modules; the embeddings come from any EmbeddingBackend, so the
model does not know (or care) where the embedding rows live.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torchrec.models.dlrm import DenseArch, InteractionArch, OverArch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..embedding.base import EmbeddingBackend


class DLRM(nn.Module):
    def __init__(
        self,
        embeddings: EmbeddingBackend,
        num_dense: int,
        embedding_dim: int,
        bottom_mlp: list[int],
        top_mlp: list[int],
        device: torch.device | None = None,
    ) -> None:
        super().__init__()
        check_model_shape(embedding_dim, bottom_mlp, top_mlp)
        num_sparse = len(embeddings.feature_names)
        self.embeddings = embeddings
        self.num_sparse = num_sparse
        self.embedding_dim = embedding_dim
        # The bottom MLP must end in the embedding dim: its output joins the dot interaction.
        self.dense_arch = DenseArch(num_dense, list(bottom_mlp) + [embedding_dim], device=device)
        # its index buffer must live with the activations (and DDP broadcasts buffers over NCCL)
        self.inter_arch = InteractionArch(num_sparse_features=num_sparse).to(device)
        over_in = embedding_dim + (num_sparse + 1) * num_sparse // 2
        self.over_arch = OverArch(over_in, list(top_mlp) + [1], device=device)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        embedded_dense = self.dense_arch(dense)
        pooled = self.embeddings(sparse).values()  # [B, F*D], features in order
        embedded_sparse = pooled.view(pooled.shape[0], self.num_sparse, self.embedding_dim)
        return self.over_arch(self.inter_arch(embedded_dense, embedded_sparse)).squeeze(-1)

    def dense_parameters(self) -> Iterator[nn.Parameter]:
        """Everything the dense optimizer owns (embedding rows are updated inside fbgemm)."""
        return self.parameters()

    DENSE_PARTS = ("dense_arch", "inter_arch", "over_arch")

    def dense_state_dict(self) -> dict[str, torch.Tensor]:
        """The MLPs only: embedding tables are checkpointed per owner (see train/checkpoint.py)."""
        return {
            f"{part}.{k}": v for part in self.DENSE_PARTS for k, v in getattr(self, part).state_dict().items()
        }

    def load_dense_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for part in self.DENSE_PARTS:
            prefix = part + "."
            getattr(self, part).load_state_dict(
                {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            )


def check_model_shape(embedding_dim: int, bottom_mlp: list[int], top_mlp: list[int]) -> None:
    if embedding_dim <= 0:
        raise ValueError(f"model.embedding_dim={embedding_dim}: must be positive")
    for key, layers in (("model.bottom_mlp", bottom_mlp), ("model.top_mlp", top_mlp)):
        if any(int(x) <= 0 for x in layers):
            raise ValueError(f"{key}={list(layers)}: layer sizes must be positive")
