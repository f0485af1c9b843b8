"""The look-ahead window, on the planner thread: each batch from its prefetch to its retirement.

The training thread posts the cache's tasks (backend.py); this object runs them, in the order
posted, on the planner (planner.py): a prefetched batch is analysed if the loader did not, queued
and placed while it fits (a batch that does not fit is *deferred*, and blocks the ones behind it
until space frees: FIFO); a demanded batch is placed whatever it takes (the queued batches give
their space back, or it takes the overflow path); a forwarded batch is counted and kept until its
retirement releases its pins; a flush, an import and the statistics run here too, so every piece
of the cache's host state has one owner.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from .batch import Analysis, WindowBatch
from .counters import Counters
from .overflow import OverflowPath
from .placement import Placer


class Window:
    def __init__(self, placer: Placer, overflow: OverflowPath, row_bytes: int) -> None:
        self.placer = placer
        self.overflow = overflow
        self.transfers = placer.transfers
        self.slots = placer.slots
        self.store = placer.store
        self.streams = placer.transfers.streams
        self.row_bytes = row_bytes
        self.queue: list[WindowBatch] = []  # prefetched, not yet forwarded (FIFO)
        self.inflight: list[WindowBatch] = []  # forwarded, backward not known to be done

    def broken(self) -> BaseException | None:
        """Once a placement failed part-way (its bookkeeping half changed), the error every later
        batch and call gets: training on must not use rows the host no longer tracks."""
        if self.placer.broken is None:
            return None
        e = RuntimeError(
            "freq_cache: a placement failed part-way, so the cache's bookkeeping no longer matches "
            "its slots; restart from the last checkpoint (the cause is chained below)"
        )
        e.__cause__ = self.placer.broken
        return e

    def _fail(self, b: WindowBatch, e: BaseException) -> None:
        b.error = e
        if b in self.queue:
            self.queue.remove(b)
        b.signal(self.streams)

    def prefetch(self, b: WindowBatch, analysis: object, adhoc: bool, ordered: Any) -> None:
        if (broken := self.broken()) is not None:
            self._fail(b, broken)
            return
        try:
            if not isinstance(analysis, Analysis):
                analysis = self.placer.analyze(b.kjt, self._host_values(b.kjt, ordered))
            b.analysis = analysis
            if analysis.bad:  # refused: the cache stays as it was, usable for other batches
                raise self.placer.bad_id_error(analysis)
        except BaseException as e:
            b.error = e
            b.signal(self.streams)
            return
        if not adhoc:
            self.queue.append(b)
            self._try_prepare()

    def _host_values(self, kjt: KeyedJaggedTensor, ordered: Any) -> np.ndarray:
        """A batch's ids on the host: its own memory, or (a device batch: ad hoc, or prefetched
        without the loader's analysis) read back on the input stream after ``ordered``."""
        values = kjt.values()
        if values.device.type == "cpu":
            return values.numpy()
        st = self.streams
        st.wait_event(st.input, ordered)
        with st.use(st.input):
            return values.cpu().numpy()

    def demand(self, b: WindowBatch, train: bool) -> None:
        """``b`` is forwarded next: placed now, whatever it takes."""
        if b.error is None:
            b.error = self.broken()
        if b.error is not None:
            self._fail(b, b.error)
            return
        if b in self.queue:
            self.queue.remove(b)
        if train and not b.train:  # prefetched under no_grad, trained on after all
            b.train = True
            if b.prepared:
                self.placer.mark_dirty(b)
        if not b.prepared:
            try:
                if not self.placer.prepare(b):
                    # Give the window's space back (those batches are placed again later), retry.
                    for q in self.queue:
                        self._unprepare(q)
                    b.needs_overflow = not self.placer.prepare(b)
            except BaseException as e:
                b.error = e
        b.signal(self.streams)

    def forwarded(self, b: WindowBatch, stall: float) -> None:
        self.placer.counters.add("stall_s", stall)
        self.placer.count_forwarded(b)  # only forwarded batches count (not cancelled ones)
        b.indices, b.event = None, None
        self.inflight.append(b)
        self._try_prepare()  # batches deferred for lack of space

    def add_stall(self, stall: float) -> None:
        self.placer.counters.add("stall_s", stall)

    def retire(self, event: Any) -> None:
        self.transfers.retired(event)
        for b in self.inflight:
            if b.overflow is not None:
                self.overflow.retire(b)
            else:
                self.placer.release(b)
        self.inflight.clear()
        self._try_prepare()

    def cancel(self, gone: list[WindowBatch]) -> None:
        for b in gone:
            if b in self.queue:
                self.queue.remove(b)
            self._unprepare(b)
        self._try_prepare()  # batches deferred behind the cancelled ones

    def flush(self) -> None:
        if (broken := self.broken()) is not None:
            raise broken
        tr, s = self.transfers, self.slots
        tr.sync()
        tr.write_backs.settle(keep=0)
        dirty = s.dirty_slots()
        if len(dirty):
            tr.write_back_now(dirty, s.slot_row[dirty])
            self.placer.counters.add("rows_written_back", len(dirty))
        s.clean()
        self._remark_queued()

    def _remark_queued(self) -> None:
        """Prefetched training batches were marked dirty when prepared; their steps are to come."""
        for b in self.queue:
            if b.prepared and b.train:
                self.placer.mark_dirty(b)

    def import_tables(self, state: dict[str, torch.Tensor]) -> None:
        if (broken := self.broken()) is not None:
            raise broken
        self.transfers.write_backs.drop()
        with self.streams.on_host():
            self.store.load(state)
        self.transfers.upload(*self.slots.resident())
        self.slots.clean()
        self._remark_queued()

    def stats(self) -> dict[str, float]:
        return self.placer.counters.report(self.row_bytes, self.placer.table_names)

    def reset_stats(self) -> None:
        self.placer.counters = Counters(len(self.placer.table_names))

    def _unprepare(self, b: WindowBatch) -> None:
        if b.prepared:
            b.ready.clear()
            self.placer.release(b)
            b.indices, b.event = None, None

    def _try_prepare(self) -> None:
        """Prepare queued batches in order while they fit (FIFO: a deferred one blocks later ones)."""
        if any(b.overflow is not None for b in self.inflight):
            return  # its rows are outside the cache until it retires
        for b in list(self.queue):
            if b.prepared:
                continue
            try:
                placed = self.placer.prepare(b)
            except BaseException as e:  # this batch's forward raises it, the later ones the rest
                self._fail(b, e)
                for q in list(self.queue):
                    self._fail(q, self.broken() or e)
                return
            if not placed:
                if not b.deferred:
                    b.deferred = True
                    self.placer.counters.add("deferred_batches", 1)
                return
            b.signal(self.streams)
