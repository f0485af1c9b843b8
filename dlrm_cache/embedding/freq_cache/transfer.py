"""Rows between the host store and the device slots: staging buffers, copies and one scatter/gather.

The planner decides everything on the host (placement.py); what reaches the device per placed
batch is, on the *copy* stream (dlrm_cache/streams.py):

1. one host-to-device copy of one pinned staging buffer holding the victims' slot ids, the
   write-back slots and the missing rows' records (weights and optimizer state, gathered from the
   host store by the planner's host threads), and one of the batch's lookup indices (slot per id,
   written into their own staging buffer by the analysis and the placement);
2. a wait for the event recorded on the compute stream when batches were last retired (the
   backward that last updated a victim slot, and the steps of the batches it held, come first);
3. the write-backs: one gather of the dirty victims' slots into a device buffer (per fbgemm
   buffer: weights, optimizer state) and one device-to-host copy into a pinned buffer, which the
   write-back thread scatters into the host store once the copy has landed (writeback.py).  A row
   needed again before that is loaded from the write-back's device buffer (a device copy on the
   same stream), never waited for;
4. one scatter of the loaded records into the victim slots (per fbgemm buffer), then the batch's
   "rows ready" event, which the compute stream waits for before the batch's lookup.

So every row crosses PCIe in a contiguous copy issued on the copy stream (the copy engines, not
the SMs), no kernel touches host memory, and the device work per batch is a fixed handful of
operations whatever the cache's size.  On a CPU device the same code runs with plain buffers and
no streams (every operation in order as issued).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from ...streams import streams_for
from .slots import SlotTable
from .store import HostStore
from .writeback import WriteBacks

# rows per staging buffer when whole regions move (import, flush): bounds the pinned memory
CHUNK_ROWS = 1 << 16


class Transfers:
    def __init__(
        self,
        store: HostStore,
        slots: SlotTable,
        cache_w: torch.Tensor,
        cache_m: torch.Tensor | None,
        device: torch.device,
    ) -> None:
        self.store = store
        self.slots = slots
        self.cache_w = cache_w  # [num_slots, dim] view of the TBE's weights
        self.cache_m = cache_m  # [num_slots] or [num_slots, dim]; None for SGD
        self.dim = cache_w.shape[1]
        self.device = device
        self.streams = streams_for(device)
        self.compute = self.streams.compute
        self.streams.host_resident(store.data)
        self.write_backs = WriteBacks(store, slots, self.streams)
        self.issue_s = 0.0  # time spent issuing device work (the CPU device: doing it)
        self.gather_s = 0.0  # time spent filling staging buffers (the missing rows' gather)
        self._waits: list = []  # timing tokens around the compute stream's waits
        self._wait_folded = 0.0
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
        """The compute stream waits for a batch's ``event`` before its lookup reads ``indices``
        (made on the copy stream).  Timing tokens around the wait measure how long the GPU really
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
        """Seconds the compute stream waited for batches' rows since ``reset_transfer_wait`` (0 on
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

    def place(
        self,
        victims: np.ndarray,
        rows: np.ndarray,
        sources: np.ndarray,
        wb_slots: np.ndarray,
        wb_rows: np.ndarray,
        lookup: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, Any]:
        """A placed batch's copies: ``rows`` into ``victims`` after the dirty ``wb_slots`` were
        written back (to ``wb_rows``, which the slot table no longer maps); the batch's ``lookup``
        indices (a staging buffer) on the device.  ``sources``: each row's ``row_slot`` before it was placed, -1 (in
        the host store) or, after all of those, a pending code (in a write-back not applied yet).
        Returns the device indices and the event after which they and the rows are there."""
        st = self.streams
        k, w = len(rows), len(wb_slots)
        stored = int(np.count_nonzero(sources >= -1))
        pending = np.arange(stored, k)
        t_host = time.perf_counter()
        staging, parts = self._staging(k, w, len(pending))
        with st.on_host():
            parts["victims"].numpy()[:] = victims
            parts["wb_slots"].numpy()[:] = wb_slots
            self.store.gather(rows[:stored], parts["records"].numpy()[:stored])
            if len(pending):
                src, dst = parts["pending_src"].numpy(), parts["pending_dst"].numpy()
                sourced = self.write_backs.sources(sources[stored:], pending, src, dst)
        t0, written = time.perf_counter(), None
        self.gather_s += t0 - t_host
        with st.use(st.copy):
            dev = self._to_device(staging)
            indices = None if lookup is None else self._to_device(lookup)
            d = _views(dev, k, w, len(pending), self.store.record_cols)
            if len(pending):
                for wb, a, b in sourced:  # rows re-missed before their write-back landed
                    rec = wb.device.index_select(0, d["pending_src"][a:b])
                    d["records"].index_copy_(0, d["pending_dst"][a:b], rec)
            st.wait_event(st.copy, self._retire_event)
            if w:
                written = self._write_back(d["wb_slots"])
            if k:
                self._scatter(d["victims"], d["records"])
            ready = st.record_event(st.copy)
        self.issue_s += time.perf_counter() - t0
        if written is not None:
            self.write_backs.add(wb_rows, *written, evicted=True)
        return indices, ready

    def upload(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Fill ``slots`` with ``rows`` from the host store (a whole region: start-up, import),
        in chunks, ordered after the last retirement; the device is synchronized on return."""
        for a in range(0, len(slots), CHUNK_ROWS):
            s, r = slots[a : a + CHUNK_ROWS], rows[a : a + CHUNK_ROWS]
            self.place(s, r, np.full(len(r), -1), _NONE, _NONE, None)
        self.sync()

    def write_back_now(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Write ``slots`` back to the host store's ``rows`` and wait for it (flush)."""
        st = self.streams
        for a in range(0, len(slots), CHUNK_ROWS):
            s, r = slots[a : a + CHUNK_ROWS], rows[a : a + CHUNK_ROWS]
            staging, parts = self._staging(0, len(s), 0)
            with st.on_host():
                parts["wb_slots"].numpy()[:] = s
            with st.use(st.copy):
                dev = self._to_device(staging)
                st.wait_event(st.copy, self._retire_event)
                written = self._write_back(_views(dev, 0, len(s), 0, 0)["wb_slots"])
            self.write_backs.add(r, *written, evicted=False)
        self.write_backs.settle(keep=0)

    def sync(self) -> None:
        """Everything issued so far has finished (flush, import, overflow: not on the step path)."""
        self.streams.synchronize()

    # -- whole records on the current stream, synchronously (the overflow path) ---------------
    def host_records(self, rows: np.ndarray) -> torch.Tensor:
        """The host store's records of ``rows``, on the device."""
        st = self.streams
        with st.on_host():
            staging = st.pinned((len(rows), self.store.record_cols), torch.float32)
            self.store.gather(rows, staging.numpy())
        return self._to_device(staging)

    def slot_records(self, slots: np.ndarray) -> torch.Tensor:
        """The records held in ``slots``, gathered on the device."""
        return self._gather(self.index(slots))

    def to_slots(self, slots: np.ndarray, records: torch.Tensor) -> None:
        self._scatter(self.index(slots), records)

    def to_host(self, rows: np.ndarray, records: torch.Tensor) -> None:
        """``records`` (device) into the host store's ``rows``, waited for."""
        st = self.streams
        with st.on_host():
            host = st.pinned(tuple(records.shape), torch.float32)
        host.copy_(records, non_blocking=True)
        st.host_wait(st.record_event(st.current_stream()))
        with st.on_host():
            self.store.scatter(rows, host.numpy())

    def index(self, ids: np.ndarray) -> torch.Tensor:
        """Host int ids as an int64 device tensor (through a staging buffer)."""
        st = self.streams
        with st.on_host():
            staging = st.pinned((len(ids),), torch.int64)
            staging.numpy()[:] = ids
        return self._to_device(staging)

    # -- internals ---------------------------------------------------------------------------
    def _staging(self, k: int, w: int, m: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One pinned buffer for a placement's host-to-device copy, and its parts."""
        nbytes = _layout(k, w, m, self.store.record_cols)[-1]
        with self.streams.on_host():
            staging = self.streams.pinned((nbytes,), torch.uint8)
        return staging, _views(staging, k, w, m, self.store.record_cols)

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

    def _gather(self, slots: torch.Tensor) -> torch.Tensor:
        """The records held in ``slots`` (device ids) in one device buffer: one ``index_select``
        per fbgemm buffer, each into its columns."""
        records = torch.empty((slots.numel(), self.store.record_cols), device=self.device)
        torch.index_select(self.cache_w, 0, slots, out=records[:, : self.dim])
        if self.cache_m is not None:
            out = records[:, self.dim] if self.cache_m.dim() == 1 else records[:, self.dim :]
            torch.index_select(self.cache_m, 0, slots, out=out)
        return records

    def _write_back(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Gather ``slots`` (device ids) into one device record buffer and copy it into a pinned
        one, on the copy stream: both buffers and the copy's event, for ``WriteBacks.add`` (the
        applier scatters the pinned one into the host store once the copy has landed)."""
        st = self.streams
        records = self._gather(slots)
        with st.on_host():
            host = st.pinned(tuple(records.shape), torch.float32)
        host.copy_(records, non_blocking=True)
        return records, host, st.record_event(st.copy)


_NONE = np.zeros(0, dtype=np.int64)


_ALIGN = 64  # bytes: every part of a staging buffer starts at a multiple (kernels' vector loads)
_PARTS = ("victims", "wb_slots", "pending_src", "pending_dst", "records")


def _sizes(k: int, w: int, m: int, cols: int) -> list[int]:
    """Bytes of a staging buffer's ``_PARTS``: the victims' slots, the write-back slots, the
    pending write-backs' records to load and where (int64), the records (float32 [k, cols])."""
    return [8 * k, 8 * w, 8 * m, 8 * m, 4 * k * cols]


def _layout(k: int, w: int, m: int, cols: int) -> list[int]:
    """Byte offsets of the parts (``_sizes``), each 64-byte aligned; the last entry is the size."""
    sizes = _sizes(k, w, m, cols)
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + -(-size // _ALIGN) * _ALIGN)
    return offsets


def _views(buf: torch.Tensor, k: int, w: int, m: int, cols: int) -> dict:
    o = _layout(k, w, m, cols)
    dtypes = [torch.int64] * 4 + [torch.float32]
    sizes = _sizes(k, w, m, cols)
    out = {
        name: buf[o[i] : o[i] + sizes[i]].view(dt)
        for i, (name, dt) in enumerate(zip(_PARTS, dtypes))
    }
    out["records"] = out["records"].view(k, cols)
    return out
