"""A batch on its way through the cache, and the round that places it.

A *round* places one or two consecutive prefetched batches together (window.py): one plan, one
staging buffer, one set of copies, one "rows ready" event, and one set of pins, released when all
of its batches have retired (or were forgotten).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


@dataclasses.dataclass(eq=False)
class WindowBatch:
    """One batch between its prefetch and its retirement.

    Made by the training thread (``kjt``, ``train``, ``copied``); everything else is written by
    the planner thread, and read by the training thread only after ``ready`` is set."""

    kjt: KeyedJaggedTensor
    train: bool  # a training batch (its rows will be updated)
    copied: Any = None  # event after which ``kjt``'s ids are on the device (None: they are)
    ready: threading.Event = dataclasses.field(default_factory=threading.Event)
    known: Any = None  # the planner's host knowledge when it set ``ready`` (Streams.host_knowledge)
    error: BaseException | None = None  # raised by the forward of this batch
    needs_overflow: bool = False  # does not fit even with nothing else placed: a temporary TBE
    round: Round | None = None  # the round that placed it
    lookup: torch.Tensor | None = None  # its ids' slots (device), once placed
    demanded: bool = False  # its forward waits for it: placed now, alone if need be
    deferred: bool = False  # did not fit when first tried (counted once)
    forwarded: bool = False
    finished: bool = False  # retired, or forgotten before its forward
    overflow: Any = None  # the overflow path's state while it is in flight

    def signal(self, streams: Any) -> None:
        """Planner: the batch is placed (or failed)."""
        self.known = streams.host_knowledge()
        self.ready.set()

    def wait(self, streams: Any, planner: Any) -> None:
        """Training thread: until the batch is placed (or failed)."""
        planner.wait(self.ready)
        streams.learn(self.known)


@dataclasses.dataclass(eq=False)
class Round:
    """Batches placed together: their pins (``slots``, one per distinct key), the event after
    which their rows and lookups are on the device, and what they are counted as once released."""

    batches: list[WindowBatch]
    seq: int
    slots: torch.Tensor
    event: Any
    hits: torch.Tensor  # [R, T] on the device: each batch's ids served from the cache per table
    distinct: int  # distinct rows outside the static region
    distinct_hits: int  # of which resident before the round

    def done(self) -> bool:
        return all(b.finished for b in self.batches)

    def in_flight(self) -> bool:
        """A batch of it was forwarded and has not retired: its pins must stay."""
        return any(b.forwarded and not b.finished for b in self.batches)
