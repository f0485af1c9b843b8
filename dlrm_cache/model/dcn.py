"""DCN-v2's interaction (MLPerf DLRM v2): a low-rank cross network over ``[dense, sparse...]``.

The values and state keys are torchrec's ``InteractionDCNArch`` over a ``LowRankCrossNet``
(``crossnet.W_kernels.<l>``, ``crossnet.V_kernels.<l>``, ``crossnet.bias.<l>``), so a checkpoint's
dense part loads into torchrec's ``DLRM_DCN`` as it is (``export``).  The module is ours only to be
built on any device (``meta`` for shape checks; torchrec's allocates on the CPU) and to join the
dense part's dtype under bf16 autocast, as :class:`~dlrm_cache.model.dlrm.DotInteraction` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..config.choices import Interaction


@dataclass(frozen=True)
class CrossShape:
    """The cross network's settings (``model.dcn_num_layers``, ``model.dcn_low_rank_dim``)."""

    num_layers: int
    low_rank_dim: int


def cross_shape(model: Mapping[str, Any], prefix: str = "") -> CrossShape | None:
    """The cross network a model config asks for (``prefix``: ``"model."`` in a flattened config),
    None for the dot interaction (also where the config predates the ``interaction`` key).
    ValueError: an unknown interaction, or dcn without its shape."""
    if Interaction(str(model.get(prefix + "interaction", Interaction.dot))) is Interaction.dot:
        return None
    keys = (prefix + "dcn_num_layers", prefix + "dcn_low_rank_dim")
    missing = [k for k in keys if model.get(k) is None]
    if missing:  # ValueError, as for any other config that is no model's
        raise ValueError(f"{prefix}interaction=dcn without {missing[0]}")
    return CrossShape(*(int(model[k]) for k in keys))


class LowRankCrossNet(nn.Module):
    """``x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l``, ``W_l``: ``[N, r]``, ``V_l``: ``[r, N]``
    (torchrec's LowRankCrossNet: the same parameters, initialisation and arithmetic)."""

    def __init__(
        self, in_features: int, shape: CrossShape, device: torch.device | None = None
    ) -> None:
        super().__init__()
        n, r, layers = in_features, shape.low_rank_dim, range(shape.num_layers)

        def xavier(*size: int) -> nn.Parameter:
            return nn.Parameter(nn.init.xavier_normal_(torch.empty(*size, device=device)))

        self.W_kernels = nn.ParameterList([xavier(n, r) for _ in layers])
        self.V_kernels = nn.ParameterList([xavier(r, n) for _ in layers])
        self.bias = nn.ParameterList([nn.Parameter(torch.zeros(n, device=device)) for _ in layers])

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for w, v, b in zip(self.W_kernels, self.V_kernels, self.bias):
            x = x0 * (nn.functional.linear(nn.functional.linear(x, v), w) + b) + x
        return x


class DcnInteraction(nn.Module):
    """``[B, D]`` dense and ``[B, F, D]`` sparse features to ``[B, (F+1)*D]``: their
    concatenation through the cross network (torchrec's InteractionDCNArch)."""

    def __init__(
        self,
        num_sparse_features: int,
        embedding_dim: int,
        shape: CrossShape,
        device: torch.device | None = None,
    ) -> None:
        super().__init__()
        self.crossnet = LowRankCrossNet((num_sparse_features + 1) * embedding_dim, shape, device)

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        # sparse rows come in fp32 from fbgemm: join the dense part's dtype (bf16 under autocast)
        combined = torch.cat(
            (dense_features.unsqueeze(1), sparse_features.to(dense_features.dtype)), dim=1
        )
        return self.crossnet(combined.flatten(1))


def over_in_features(num_sparse: int, embedding_dim: int) -> int:
    """Width of the interaction's output, the top MLP's input."""
    return (num_sparse + 1) * embedding_dim
