"""Write-backs on their way from the device to the host store, and the rows they hold meanwhile.

A placement writes its dirty victims back with one gather into a device buffer and one copy into
a pinned buffer (transfer.py).  Scattering that buffer into the host store is host work that can
only start once the copy has landed: a thread of its own does it (the *applier*, inline on a CPU
device), so the planner neither waits for the copy nor spends its time on the scatter.  An entry
goes to the applier when the next one is added (or when everything must land: a flush, an import,
the overflow path), so the applier waits for copies issued at least one placement earlier, never
for the step just issued.

Until an entry has landed, its rows are marked in the row map with their *pending codes*
(slots.py): a batch that needs such a row again loads it from the entry's device buffer
(``sources``), on the copy stream, after the gather that filled it.  Entries are consumed in
order, so a row written back twice lands with its newer value.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import torch

from ...streams import Streams
from .planner import Planner
from .slots import PENDING_SPAN, SlotTable, pending_code, pending_position
from .store import HostStore


@dataclasses.dataclass(eq=False)
class WriteBack:
    rows: np.ndarray  # global rows, distinct
    codes: np.ndarray  # their row_slot codes while pending (evicted rows), else -1
    device: torch.Tensor  # [n, record_cols] the rows' records, gathered on the device
    records: torch.Tensor  # the same in a staging buffer, filled by a device-to-host copy
    event: Any  # recorded after that copy
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    known: Any = None  # the applier's host knowledge once it landed
    error: BaseException | None = None  # why it did not land


class WriteBacks:
    def __init__(self, store: HostStore, slots: SlotTable, streams: Streams) -> None:
        self.store = store
        self.slots = slots
        self.streams = streams
        self._entries: deque[WriteBack] = deque()  # in order; the newest not yet posted
        self._posted = 0  # entries handed to the applier (a prefix of _entries)
        self._next = 0  # the pending position of the next evicted row
        self._failed: BaseException | None = None  # an entry that did not land
        self._applier = Planner(streams, streams.device, name="freq_cache-writeback")
        self.land_s = 0.0  # the applier's time: waits and scatters

    def add(
        self,
        rows: np.ndarray,
        device: torch.Tensor,
        records: torch.Tensor,
        event: Any,
        evicted: bool,
    ) -> None:
        """Rows whose records are being copied into ``records`` (after ``event``); ``evicted``:
        they left the cache, and are pending in the row map until they land."""
        codes = np.full(len(rows), -1, dtype=np.int32)
        if evicted:
            codes = pending_code(self._next + np.arange(len(rows)))
            self._next = (self._next + len(rows)) % PENDING_SPAN
            self.slots.row_slot[rows] = codes
        self._entries.append(WriteBack(rows, codes, device, records, event))
        self._post(len(self._entries) - 1)  # all but this one

    def settle(self, keep: int) -> None:
        """Consume the landed entries, waiting for all but the ``keep`` newest (0: everything is
        in the host store on return)."""
        if self._failed is not None:  # rows were lost: the host store stays unusable
            raise self._failed
        if keep == 0:
            self._post(len(self._entries))
        while self._entries and (len(self._entries) > keep or self._entries[0].done.is_set()):
            wb = self._entries.popleft()
            self._posted -= 1
            self._applier.wait(wb.done)
            if wb.error is not None:  # its rows are lost: nothing may read the store as if not
                self._failed = RuntimeError(
                    "freq_cache: rows written back from the device did not reach the host store"
                )
                self._failed.__cause__ = wb.error
                raise self._failed
            self.streams.learn(wb.known)
            self.slots.written_back(wb.rows, wb.codes)

    def drop(self) -> None:
        """Land and forget every entry (the host store is about to be replaced: an import)."""
        self.settle(0)

    def sources(
        self, codes: np.ndarray, at: np.ndarray, src: np.ndarray, dst: np.ndarray
    ) -> list[tuple[WriteBack, int, int]]:
        """For loads at positions ``at`` whose rows are pending (``codes``): per entry, which of
        its records (``src``) go to which load (``dst``), written in place; the entries with
        their slices of ``src``/``dst``."""
        pos = pending_position(codes)
        out, n = [], 0
        for wb in self._entries:
            if not len(wb.rows) or wb.codes[0] >= -1:
                continue  # a flush's write-back: its rows stay resident
            j = (pos - pending_position(wb.codes[:1])[0]) % PENDING_SPAN
            mine = j < len(wb.rows)
            m = int(mine.sum())
            if m:
                src[n : n + m], dst[n : n + m] = j[mine], at[mine]
                out.append((wb, n, n + m))
                n += m
        assert n == len(codes), "a pending row without its write-back"
        return out

    @property
    def inline(self) -> bool:
        """Whether entries land on the posting thread (a CPU device), not the applier's own."""
        return not self._applier.threaded

    def close(self) -> None:
        self._applier.close()

    def _post(self, upto: int) -> None:
        """Hand the entries before ``upto`` to the applier (in order, each once)."""
        while self._posted < upto:
            self._applier.post(self._land, self._entries[self._posted])
            self._posted += 1

    def _land(self, wb: WriteBack) -> None:
        """The applier: wait for the entry's copy, scatter it into the host store.  The entry is
        done whatever happens (``settle`` raises its error): nobody waits for it forever."""
        t0 = time.perf_counter()
        try:
            self.streams.host_wait(wb.event)
            with self.streams.on_host():
                self.store.scatter(wb.rows, wb.records.numpy())
            wb.known = self.streams.host_knowledge()
        except BaseException as e:
            wb.error = e
        finally:
            self.land_s += time.perf_counter() - t0
            wb.done.set()
