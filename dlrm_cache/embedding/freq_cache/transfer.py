"""Rows between the host store and the device slots: the host's whole part in a round.

The plan (plan.py) decides on the device; the host then only moves rows:

1. ``stage``: the round's missed rows gathered from the host store into one pinned staging buffer
   (records: weights and optimizer state, one piece each), on the planner's host threads;
2. ``copy_round``, on the *copy* stream, after the plan's commit: one host-to-device copy of the
   staging buffer; a wait for the event recorded on the compute stream when batches were last
   retired (the backward that last updated a victim slot comes first); the victims' records
   gathered into a device buffer and copied into a pinned one (one gather per fbgemm buffer:
   weights, optimizer state), which the write-back thread scatters into the host store once the
   copy has landed (writeback.py); one scatter of the staged records into the victim slots (per
   fbgemm buffer); then the round's "rows ready" event.

So every row crosses PCIe in a contiguous copy issued on the copy stream (the copy engines, not the
SMs), no kernel touches host memory, and the copy stream's work per round is six operations
whatever the cache's size.  On a CPU device the same code runs with plain buffers and no streams.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from ...concurrency.streams import streams_for
from .store import HostStore
from .writeback import WriteBacks

# rows per staging buffer when whole regions move (start-up, import, flush): bounds pinned memory
CHUNK_ROWS = 1 << 16


class Transfers:
    def __init__(
        self,
        store: HostStore,
        cache_w: torch.Tensor,
        cache_m: torch.Tensor | None,
        device: torch.device,
    ) -> None:
        self.store = store
        self.cache_w = cache_w  # [num_slots, dim] view of the TBE's weights
        self.cache_m = cache_m  # [num_slots] or [num_slots, dim]; None for SGD
        self.dim = cache_w.shape[1]
        self.cols = store.record_cols
        self.device = device
        self.streams = streams_for(device)
        self.compute = self.streams.compute
        self.streams.host_resident(store.data)
        self.write_backs = WriteBacks(store, self.streams)
        self.stage_s = 0.0  # the host gathers into staging buffers
        self.issue_s = 0.0  # issuing the copy stream's work (a CPU device: doing it)
        self._waits: list = []  # timing tokens around the compute stream's waits
        self._wait_folded = 0.0
        self._buffers: dict[str, torch.Tensor] = {}  # the copy stream's own device buffers
        # the compute stream's work the copy stream must wait for before evicting (see retired)
        self._retire_event = self.streams.record_event(self.compute)

    # -- the training thread's side --------------------------------------------------------
    def track_compute(self) -> None:
        """The caller's current stream is the compute stream."""
        self.compute = self.streams.current_stream()

    def compute_event(self) -> Any:
        """An event after the compute stream's work so far (recorded on the training thread)."""
        return self.streams.record_event(self.compute)

    def wait_ready(self, event: Any, indices: torch.Tensor) -> None:
        """The compute stream waits for a round's ``event`` before a lookup reads ``indices``
        (made on the plan stream).  Timing tokens around the wait measure how long the GPU really
        sat waiting for the rows (read lazily by ``transfer_wait_s``: no host synchronization)."""
        st = self.streams
        cur = st.current_stream()
        token = st.timed_wait(cur, event)
        if token is not None:
            self._waits.append(token)
            if len(self._waits) > 512:  # stats() not called for a long time: fold the old ones
                self._wait_folded += st.waited_seconds(self._waits[:256])
                del self._waits[:256]
        st.record_stream(indices, cur)

    def transfer_wait_s(self) -> float:
        """Seconds the compute stream waited for rounds' rows since ``reset_transfer_wait`` (0 on
        the CPU).  Reading waits for the timed waits so far (folded into one number)."""
        self._wait_folded += self.streams.waited_seconds(self._waits)
        self._waits.clear()
        return self._wait_folded

    def reset_transfer_wait(self) -> None:
        self._wait_folded = 0.0
        self._waits.clear()

    # -- the planner's side ----------------------------------------------------------------
    def retired(self, event: Any) -> None:
        """Batches were retired when ``event`` was recorded (``compute_event``): their backward
        passes come before any later write-back or load of their (now unpinned) slots."""
        self._retire_event = event

    def stage(self, rows: np.ndarray) -> torch.Tensor:
        """The host store's records of ``rows`` in a new staging buffer (the host's gather)."""
        t0 = time.perf_counter()
        with self.streams.on_host():
            staging = self.streams.pinned((len(rows), self.cols), torch.float32)
            self.store.gather(rows, staging)
        self.stage_s += time.perf_counter() - t0
        return staging

    def copy_round(
        self,
        slots: torch.Tensor,
        staging: torch.Tensor,
        evicted: np.ndarray | None,
        after: Any,
    ) -> Any:
        """The copy stream's part of a round (see the module docstring): ``staging``'s records into
        ``slots`` (device ids, made on the plan stream, which is ordered by ``after``), what the
        slots held written back to the host store's rows ``evicted`` (None: nothing to write
        back).  Returns the event after which the rows are in their slots."""
        st = self.streams
        t0 = time.perf_counter()
        with st.use(st.copy):
            st.wait_event(st.copy, after)
            st.record_stream(slots, st.copy)
            records = self._buffer("in", len(slots))
            records.copy_(staging, non_blocking=True)
            st.wait_event(st.copy, self._retire_event)
            written = None if evicted is None else self._write_back(slots)
            self._scatter(slots, records)
            ready = st.record_event(st.copy)
        self.issue_s += time.perf_counter() - t0
        if written is not None:
            assert evicted is not None
            self.write_backs.add(evicted, *written)
        return ready

    def after_copies(self, after: Any) -> Any:
        """An event after ``after`` and every copy issued so far (the copy stream runs in order):
        a round that loads nothing is ready once the rows earlier rounds load have landed."""
        st = self.streams
        with st.use(st.copy):
            st.wait_event(st.copy, after)
            return st.record_event(st.copy)

    def upload(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Fill ``slots`` with ``rows`` from the host store (a whole region: start-up, import),
        in chunks, ordered after the last retirement; the device is synchronized on return."""
        st = self.streams
        for a in range(0, len(slots), CHUNK_ROWS):
            staging = self.stage(rows[a : a + CHUNK_ROWS])
            with st.use(st.copy):
                index = self.index(slots[a : a + CHUNK_ROWS])
            self.copy_round(index, staging, None, None)
        self.sync()

    def write_back_now(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Write ``slots`` back to the host store's ``rows`` and wait for it (flush)."""
        st = self.streams
        for a in range(0, len(slots), CHUNK_ROWS):
            with st.use(st.copy):
                index = self.index(slots[a : a + CHUNK_ROWS])
                st.wait_event(st.copy, self._retire_event)
                written = self._write_back(index)
            self.write_backs.add(rows[a : a + CHUNK_ROWS], *written)
        self.write_backs.settle(keep=0)

    def sync(self) -> None:
        """Everything issued so far has finished (flush, import, overflow: not on the step path)."""
        self.streams.synchronize()

    # -- whole records on the current stream, synchronously (the overflow path) ---------------
    def host_records(self, rows: np.ndarray) -> torch.Tensor:
        """The host store's records of ``rows``, on the device."""
        return self._to_device(self.stage(rows))

    def slot_records(self, slots: torch.Tensor) -> torch.Tensor:
        """The records held in ``slots`` (device ids), gathered on the device."""
        records = torch.empty((slots.numel(), self.cols), device=self.device)
        self._gather(slots, records)
        return records

    def to_slots(self, slots: torch.Tensor, records: torch.Tensor) -> None:
        self._scatter(slots, records)

    def to_host(self, rows: np.ndarray, records: torch.Tensor) -> None:
        """``records`` (device) into the host store's ``rows``, waited for."""
        st = self.streams
        with st.on_host():
            host = st.pinned(tuple(records.shape), torch.float32)
        host.copy_(records, non_blocking=True)
        st.host_wait(st.record_event(st.current_stream()))
        with st.on_host():
            self.store.scatter(rows, host)

    def index(self, ids: np.ndarray) -> torch.Tensor:
        """Host int ids as an int64 device tensor (through a staging buffer)."""
        st = self.streams
        with st.on_host():
            staging = st.pinned((len(ids),), torch.int64)
            staging.numpy()[:] = ids
        return self._to_device(staging)

    # -- internals ---------------------------------------------------------------------------
    def _buffer(self, name: str, rows: int) -> torch.Tensor:
        """The copy stream's device buffer ``name`` (kept: only the copy stream uses it, in
        order), as ``[rows, cols]``."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape[0] < rows:
            size = max(rows, 1024, 0 if buf is None else 2 * buf.shape[0])
            buf = self._buffers[name] = torch.empty((size, self.cols), device=self.device)
        return buf[:rows]

    def _to_device(self, staging: torch.Tensor) -> torch.Tensor:
        dev = torch.empty(staging.shape, dtype=staging.dtype, device=self.device)
        dev.copy_(staging, non_blocking=True)
        return dev

    def _scatter(self, slots: torch.Tensor, records: torch.Tensor) -> None:
        """Records (device) into the slot buffers: one ``index_copy_`` per fbgemm buffer."""
        self.cache_w.index_copy_(0, slots, records[:, : self.dim])
        if self.cache_m is not None:
            state = records[:, self.dim :].reshape(-1, *self.cache_m.shape[1:])
            self.cache_m.index_copy_(0, slots, state)

    def _gather(self, slots: torch.Tensor, records: torch.Tensor) -> None:
        """The records held in ``slots`` into ``records``: one ``index_select`` per fbgemm buffer,
        each into its columns."""
        torch.index_select(self.cache_w, 0, slots, out=records[:, : self.dim])
        if self.cache_m is not None:
            out = records[:, self.dim] if self.cache_m.dim() == 1 else records[:, self.dim :]
            torch.index_select(self.cache_m, 0, slots, out=out)

    def _write_back(self, slots: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """On the copy stream: ``slots``' records gathered into the copy stream's buffer and copied
        into a pinned one; that buffer and the copy's event, for ``WriteBacks.add``."""
        st = self.streams
        records = self._buffer("out", len(slots))
        self._gather(slots, records)
        with st.on_host():
            host = st.pinned(tuple(records.shape), torch.float32)
        host.copy_(records, non_blocking=True)
        return host, st.record_event(st.copy)
