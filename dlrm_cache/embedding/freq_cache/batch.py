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


def id_tables(lpk: np.ndarray) -> np.ndarray:
    """The table of every id of a batch (KJT values are feature-major)."""
    return np.repeat(np.arange(len(lpk)), lpk)


@dataclasses.dataclass(eq=False)
class Analysis:
    """What a batch needs that does not depend on the cache's state (``analyze``), on the host.

    ``lookup`` holds each id's slot where its row is in the static region (its slot follows from
    its rank) and -1 where it is not: those ids, at positions ``dynamic`` (global rows ``rows``),
    are looked up in the row map when the batch is placed.  ``lookup`` has the ids' dtype (that of
    the batch's offsets: fbgemm wants indices and offsets of one dtype) and lives in a staging
    buffer (``staged``), so the placement fills in the dynamic ids and the copy reads it as is.  A ``bad`` batch (an id
    outside its table) is refused at its prefetch, and has nothing else."""

    kjt: KeyedJaggedTensor
    values: np.ndarray  # the ids (host)
    table_accesses: np.ndarray  # accesses per table
    rows: np.ndarray  # global row of each id outside the static region (int64)
    lookup: np.ndarray  # slot of every static id, -1 elsewhere
    dynamic: np.ndarray  # positions of the ids outside the static region
    bad: bool  # an id out of its table's range
    distinct: int  # distinct rows of the batch
    staged: torch.Tensor | None  # the staging buffer ``lookup`` is a view of
    sent: bool = False  # its copy to the device was issued


@dataclasses.dataclass(eq=False)
class WindowBatch:
    """One batch between its prefetch and its retirement.

    Made by the training thread (``kjt``, ``train``); everything else is written by the planner
    thread, and read by the training thread only after ``ready`` is set."""

    kjt: KeyedJaggedTensor
    train: bool  # its slots are marked dirty (a training batch)
    analysis: Analysis | None = None
    ready: threading.Event = dataclasses.field(default_factory=threading.Event)
    known: Any = None  # the planner's host knowledge when it set ``ready`` (Streams.host_knowledge)
    error: BaseException | None = None  # raised by the forward of this batch
    needs_overflow: bool = False  # does not fit even in the empty window: a temporary TBE
    prepared: bool = False
    deferred: bool = False
    # what was resident at its first placement, counted when it is forwarded: hits per table
    # (accesses), distinct rows, distinct rows hit
    first_hits: tuple[np.ndarray, int, int] | None = None
    pinned: np.ndarray | None = None  # the dynamic slot of each of its dynamic ids
    indices: torch.Tensor | None = None  # slot ids for the lookup (device)
    event: Any = None  # its rows and indices are on the device
    overflow: Any = None  # the overflow path's state while it is in flight

    def signal(self, streams: Any) -> None:
        """Planner: the batch is placed (or failed)."""
        self.known = streams.host_knowledge()
        self.ready.set()

    def wait(self, streams: Any, planner: Any) -> None:
        """Training thread: until the batch is placed (or failed)."""
        planner.wait(self.ready)
        streams.learn(self.known)
