"""The one path from shards to the step: read, analyse, copy to the device, keep the look-ahead window.

Threads, from the disk to the step:

* the stream's shard readers (``ShardStream.batches``): parquet decoding and the per-shard shuffle;
* one loader thread (:class:`Prefetcher`) slicing batches (into pinned memory for a GPU);
* the training thread (this iterator): the asynchronous device copy, ``prefetch`` of batch
  ``t + lookahead`` (the backend moves that batch's rows while batch ``t`` trains), then batch ``t``.

Streams (see dlrm_cache/concurrency/streams.py): a batch is copied on the device's *input* stream, never on the
compute stream, so the cache's planning of that batch (which waits for the copy) never waits for
the step in flight; the compute stream waits for the copy's event only when the batch is handed to
the step, and all of the batch's tensors (the KJT's lengths and offsets too) are
``record_stream``-ed there.

Prefetch identity is positional (FIFO, see ``EmbeddingBackend``): the batch handed to the step is the
oldest one prefetched, and the backend is prefetched with the very device batch the step forwards.
Evaluation batches (``train=False``, iterated under ``torch.no_grad()``) are prefetched too; they
queue behind the training window and leaving the loop forgets only them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..concurrency.streams import streams_for
from ..concurrency.threads import Prefetcher
from ..data.batch import Batch
from ..embedding.base import EmbeddingBackend


def _kjt_tensors(kjt: KeyedJaggedTensor) -> list[torch.Tensor]:
    """The tensors ``kjt`` holds: its values, and its lengths, offsets and weights where it has
    them (the ``_or_none`` accessors compute nothing)."""
    held = (kjt.values(), kjt.lengths_or_none(), kjt.offsets_or_none(), kjt.weights_or_none())
    return [t for t in held if t is not None]


class Pipeline:
    """Device batches ready for the step, with ``backend.lookahead`` later batches already prefetched.

    Use as a context manager (or call :meth:`close`): leaving early stops the loader threads and
    makes the backend forget batches it prefetched that will never be forwarded.
    """

    def __init__(
        self,
        batches: Iterator[Batch],
        device: torch.device,
        backend: EmbeddingBackend | None = None,
        depth: int = 4,
        train: bool = True,
    ) -> None:
        self.lookahead = backend.lookahead if backend is not None else 0
        self.backend = backend
        self.train = train
        self.device = device
        self.streams = streams_for(device)
        self._reader = Prefetcher(batches, depth)

    def _to_device(self, batch: Batch) -> tuple[Batch, Any]:
        """``batch`` on the device, copied on the input stream, and the copy's event."""
        st = self.streams
        if not st.asynchronous:  # already where the step runs
            return batch, None
        with st.use(st.input):
            batch = batch.to(self.device, copy=True)
        return batch, st.record_event(st.input)

    def __iter__(self) -> Iterator[Batch]:
        window: deque[tuple[Batch, Any]] = deque()
        for host in self._reader:
            batch, ready = self._to_device(host)
            if self.backend is not None:  # lookahead 0: prefetched just before its step
                self.backend.prefetch(batch.sparse, ready)
            window.append((batch, ready))
            if len(window) > self.lookahead:
                yield self._hand_over(*window.popleft())
                self._step_done()
        while window:
            yield self._hand_over(*window.popleft())
            self._step_done()

    def _hand_over(self, batch: Batch, ready: Any) -> Batch:
        """The step's stream waits for the batch's copy; the batch's memory outlives its use there:
        every tensor copied on the input stream is ``record_stream``-ed for the step's stream (the
        KJT's lengths and offsets too: with sharded tables they are copied for every batch)."""
        st = self.streams
        if ready is not None:
            step = st.current_stream()
            st.wait_event(step, ready)
            for t in (batch.dense, batch.labels, *_kjt_tensors(batch.sparse)):
                st.record_stream(t, step)
        st.handed_to_step()
        return batch

    def _step_done(self) -> None:
        # the consumer asks for the next batch: the previous one's backward has been issued
        if self.backend is not None:
            self.backend.step_done()

    def close(self) -> None:
        self._reader.close()
        if self.backend is not None:
            # batches fetched past the last step are never forwarded (this loop's only: an
            # evaluation between training steps leaves the training window alone)
            self.backend.cancel_prefetch(grad=self.train)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
