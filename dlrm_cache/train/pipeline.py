"""The one path from shards to the step: read, analyse, copy to the device, keep the look-ahead window.

Threads, from the disk to the step:

* the stream's shard readers (``ShardStream.batches``): parquet decoding and the per-shard shuffle;
* one loader thread (:class:`Prefetcher`) slicing batches (into pinned memory for a GPU) and running
  the backend's ``analyze`` on ``analysis_threads`` workers;
* the training thread (this iterator): the asynchronous device copy, ``prefetch`` of batch
  ``t + lookahead`` (the backend moves that batch's rows while batch ``t`` trains), then batch ``t``.

Prefetch identity is positional (FIFO, see ``EmbeddingBackend``): the batch handed to the step is the
oldest one prefetched, and the backend is prefetched with the very device batch the step forwards.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import torch

from ..data.loader import Batch, OneIdPerSample
from ..threads import Prefetcher
from ..embedding.base import EmbeddingBackend


class Pipeline:
    """Device batches ready for the step, with ``backend.lookahead`` later batches already prefetched.

    Use as a context manager (or call :meth:`close`): leaving early stops the loader threads and
    makes the backend forget batches it prefetched that will never be forwarded.
    """

    def __init__(
        self,
        batches: Iterator[Batch],
        layout: OneIdPerSample,
        device: torch.device,
        backend: EmbeddingBackend | None = None,
        depth: int = 4,
        analysis_threads: int = 1,
        train: bool = True,
    ) -> None:
        # evaluation forwards are ad hoc (FIFO matches training batches only): no look-ahead
        self.lookahead = backend.lookahead if backend is not None and train else 0
        self.backend = backend
        self.layout = layout
        self.device = device
        analyze = self._analyze if self.lookahead else None
        self._reader = Prefetcher(batches, depth, transform=analyze, workers=analysis_threads)

    def _analyze(self, batch: Batch) -> Batch:
        """Loader thread: the backend's cache-independent work on a future batch."""
        batch.analysis = self.backend.analyze(batch.sparse)
        return batch

    def _to_device(self, batch: Batch) -> Batch:
        if self.device.type == "cpu":  # the same object: an analysis stays attached to its batch
            return batch
        return self.layout.to(batch, self.device)

    def __iter__(self) -> Iterator[Batch]:
        window: deque[Batch] = deque()
        for host in self._reader:
            batch = self._to_device(host)
            if self.lookahead:
                self.backend.prefetch(batch.sparse, host.analysis)
            window.append(batch)
            if len(window) > self.lookahead:
                yield window.popleft()
                self._step_done()
        while window:
            yield window.popleft()
            self._step_done()

    def _step_done(self) -> None:
        # the consumer asks for the next batch: the previous one's backward has been issued
        if self.backend is not None:
            self.backend.step_done()

    def close(self) -> None:
        self._reader.close()
        if self.lookahead:
            self.backend.cancel_prefetch()  # batches fetched past the last step are never trained

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
