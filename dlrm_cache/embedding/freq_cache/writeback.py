"""Write-backs on their way from the device to the host store, landed by a thread of their own.

A round's victims are gathered on the device and copied into a pinned buffer on the copy stream
(transfer.py).  Scattering that buffer into the host store is host work that can only start once
the copy has landed: a thread of its own does it (the *applier*, inline on a CPU device), so the
planner neither waits for the copy nor spends its time on the scatter.  An entry goes to the
applier as soon as it is added.

Before the planner gathers a round's missed rows from the host store it lets every earlier entry
land (``settle(keep=0)``): a row evicted by one round and missed by the next is then read as it was
written back, with no per-row bookkeeping of rows in transit.  The wait is for copies issued a
round earlier, which wait on the device only for backward passes issued before the last batch was
handed to the step.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import torch

from ...concurrency.streams import Streams
from .planner import Planner
from .store import HostStore


@dataclasses.dataclass(eq=False)
class WriteBack:
    rows: np.ndarray  # global rows (host memory), distinct but for the scratch row
    records: torch.Tensor  # their records, in a staging buffer filled by a device-to-host copy
    event: Any  # recorded after that copy
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    known: Any = None  # the applier's host knowledge once it landed
    error: BaseException | None = None  # why it did not land


class WriteBacks:
    def __init__(self, store: HostStore, streams: Streams) -> None:
        self.store = store
        self.streams = streams
        self._entries: deque[WriteBack] = deque()  # in order
        self._failed: BaseException | None = None  # an entry that did not land
        self._applier = Planner(streams, streams.device, name="freq_cache-writeback")
        self.land_s = 0.0  # the applier's time: waits and scatters
        self.scatter_s = 0.0  # of which scattering rows into the host store

    def add(self, rows: np.ndarray, records: torch.Tensor, event: Any) -> None:
        """Rows whose records are being copied into ``records`` (after ``event``)."""
        wb = WriteBack(rows, records, event)
        self._entries.append(wb)
        self._applier.post(self._land, wb)

    def settle(self, keep: int = 0) -> None:
        """Consume the landed entries, waiting for all but the ``keep`` newest (0: everything is
        in the host store on return)."""
        if self._failed is not None:  # rows were lost: the host store stays unusable
            raise self._failed
        while self._entries and (len(self._entries) > keep or self._entries[0].done.is_set()):
            wb = self._entries.popleft()
            self._applier.wait(wb.done)
            if wb.error is not None:  # its rows are lost: nothing may read the store as if not
                self._failed = RuntimeError(
                    "freq_cache: rows written back from the device did not reach the host store"
                )
                self._failed.__cause__ = wb.error
                raise self._failed
            self.streams.learn(wb.known)

    @property
    def inline(self) -> bool:
        """Whether entries land on the posting thread (a CPU device), not the applier's own."""
        return not self._applier.threaded

    def close(self) -> None:
        self._applier.close()

    def _land(self, wb: WriteBack) -> None:
        """The applier: wait for the entry's copy, scatter it into the host store.  The entry is
        done whatever happens (``settle`` raises its error): nobody waits for it forever."""
        t0 = time.perf_counter()
        try:
            self.streams.host_wait(wb.event)
            t1 = time.perf_counter()
            with self.streams.on_host():
                self.store.scatter(wb.rows, wb.records)
            self.scatter_s += time.perf_counter() - t1
            wb.known = self.streams.host_knowledge()
        except BaseException as e:
            wb.error = e
        finally:
            self.land_s += time.perf_counter() - t0
            wb.done.set()
