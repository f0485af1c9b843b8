"""Evaluation: a model's metrics over one pass of a split."""

from __future__ import annotations

import torch

from ..data.loader import ShardStream
from ..embedding.base import EmbeddingBackend
from .metrics import EvalMetrics
from .pipeline import Pipeline


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    stream: ShardStream,
    device: torch.device,
    max_batches: int = -1,
    depth: int = 4,
    embeddings: EmbeddingBackend | None = None,
) -> dict[str, float]:
    """Metrics over one pass of ``stream`` (training's pipeline; ``embeddings``' look-ahead too)."""
    model.eval()
    metrics = EvalMetrics(device)
    with Pipeline(stream.batches(), device, embeddings, depth=depth, train=False) as batches:
        for i, batch in enumerate(batches):
            if 0 <= max_batches <= i:
                break
            metrics.update(model(batch.dense, batch.sparse), batch.labels)
    model.train()
    return metrics.compute()
