"""A batch on its way through the cache: its analysis, then its placement, then its retirement."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


def uniform_length(lpk: np.ndarray) -> int:
    """The number of ids of every table where all tables have the same (Criteo: one id per
    sample and table), else 0."""
    per = int(lpk[0]) if len(lpk) else 0
    return per if per and bool((lpk == per).all()) else 0


def id_tables(lpk: np.ndarray) -> torch.Tensor:
    """The table of every id of a batch (host tensor; KJT values are feature-major)."""
    return torch.from_numpy(np.repeat(np.arange(len(lpk)), lpk))


@dataclasses.dataclass(eq=False)
class Analysis:
    """What a batch needs that does not depend on the cache's state (``analyze``); on the cache's
    device.  From a sort (a device with streams, or the sorted map), ``uniq``/``counts`` have room
    for every id (fixed capacity: deduplication without reading a size) until the batch's first
    placement reads ``n_uniq`` and trims them.  Analysed per id (a CPU cache with the dense map,
    by_id.py), the batch has ``first`` instead, ``n_uniq`` is an int from the start, and
    ``uniq``/``inverse``/``counts`` stay None unless the overflow path deduplicates it."""

    kjt: KeyedJaggedTensor
    num_ids: int
    grow: torch.Tensor  # global row of every id (out-of-range ids replaced by row 0)
    table_accesses: np.ndarray  # accesses per table (host)
    uniq: torch.Tensor | None  # distinct global rows (sorted, then the scratch id as padding)
    inverse: torch.Tensor | None  # position in uniq of every id
    counts: torch.Tensor | None  # accesses of each uniq row in this batch
    n_uniq: torch.Tensor | int  # device scalar until read, then the host int
    bad: torch.Tensor | bool  # an id out of its table's range (device bool until read)
    # analysed per id: per id, the position of its row's first occurrence in the batch
    first: torch.Tensor | None = None


@dataclasses.dataclass(eq=False)
class WindowBatch(Analysis):
    """One batch between its prefetch and its retirement.

    Made by the training thread (``kjt``, ``train``); everything else is written by the planner
    thread, and read by the training thread only after ``ready`` is set."""

    ready: threading.Event = dataclasses.field(default_factory=threading.Event)
    known: Any = None  # the planner's host knowledge when it set ``ready`` (Streams.host_knowledge)
    error: BaseException | None = None  # raised by the forward of this batch
    needs_overflow: bool = (
        False  # does not fit even in the empty window: forwarded by a temporary TBE
    )
    prepared: bool = False
    deferred: bool = False
    # what was resident at its first placement, counted when it is forwarded: hits per table
    # (accesses), distinct rows hit
    first_hits: tuple[torch.Tensor, torch.Tensor | int] | None = None
    train: bool = False  # its slots are marked dirty (a training batch)
    pinned: torch.Tensor | None = None  # slots pinned by this batch (its uniq rows', or its ids')
    indices: torch.Tensor | None = None  # slot ids for the lookup
    event: Any = None  # CUDA event: its rows are in place
    overflow: dict | None = None

    @classmethod
    def new(cls, kjt: KeyedJaggedTensor, train: bool) -> WindowBatch:
        return cls(kjt, 0, None, None, None, None, None, None, None, train=train)  # type: ignore[arg-type]

    def signal(self, streams: Any) -> None:
        """Planner: the batch is placed (or failed)."""
        self.known = streams.host_knowledge()
        self.ready.set()

    def wait(self, streams: Any) -> None:
        """Training thread: until the batch is placed (or failed)."""
        self.ready.wait()
        streams.learn(self.known)

    def adopt(self, a: Analysis) -> None:
        for f in dataclasses.fields(Analysis):
            if f.name != "kjt":
                setattr(self, f.name, getattr(a, f.name))
