"""Evaluation: a model's metrics over one pass of a split."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..console.say import Progress
from ..data.loader import ShardStream
from ..embedding.base import EmbeddingBackend
from ..files.outputs import Stopped
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
    stop: Callable[[], int | None] | None = None,
    *,
    progress: Progress | None = None,
) -> dict[str, float]:
    """Metrics over one pass of ``stream`` (training's pipeline; ``embeddings``' look-ahead too).

    ``stop``: asked after every batch (every rank asks as often: each takes its share of every
    global batch); a signal number it answers ends the pass with :class:`Stopped`.  ``progress``
    is told of every batch (and closed at the end)."""
    model.eval()
    metrics = EvalMetrics(device)
    try:
        with Pipeline(stream.batches(), device, embeddings, depth=depth, train=False) as batches:
            for i, batch in enumerate(batches):
                if 0 <= max_batches <= i:
                    break
                metrics.update(model(batch.dense, batch.sparse), batch.labels)
                if progress is not None:
                    progress.update()
                signum = stop() if stop is not None else None
                if signum:
                    raise Stopped(signum)
    finally:
        if progress is not None:
            progress.close()
    model.train()
    return metrics.compute()


def eval_batches(stream: ShardStream, max_batches: int) -> int:
    """The batches one evaluation pass reads (``max_batches`` < 0: the whole split)."""
    return len(stream) if max_batches < 0 else min(len(stream), max_batches)
