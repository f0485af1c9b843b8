"""Streams and row movement between the host store and the device slot buffer.

Callers pass deduplicated slot/row ids, so every distinct row moves once, weights and optimizer
state together (write-backs of clean victims all go to the store's scratch row, which nothing reads).

Every stream operation goes through the device's :class:`~dlrm_cache.streams.Streams` (no-ops on
the CPU, where every operation runs in order as issued; recorded by the tests' stream harness):
* *input*: the pipeline's copies of batches to the device (waits for nothing);
* *plan*: the cache's bookkeeping (dedup, lookups, victim choice, pins, dirty bits) on device
  tensors.  It waits for the input stream (the batch it plans), never for the compute stream, so
  the one host read of a placement (``read``) returns when the plan stream's own short kernels
  are done, whatever the step in flight;
* *copy*: write-backs (slots -> host-mapped store) and loads (store -> slots), as kernels that read
  and write host memory over PCIe.  It waits for the plan stream (indices) and for the event
  recorded on the compute stream when the last batch was retired (``retired``): the backward of
  every retired batch may still update the slots being evicted, and the slots a prefetched batch
  pins are never evicted before that batch retires;
* *compute*: the trainer's stream; a batch's lookup waits on the event recorded after its copies.
Tensors made on one stream and used on another are ``record_stream``-ed so the caching allocator
does not hand their memory out while a kernel on the other stream may still read it.
"""

from __future__ import annotations

import torch

from ...streams import streams_for
from .store import HostStore


class Mover:
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
        self.device = device
        self.streams = streams_for(device)
        self.compute = self.streams.compute
        self._waits: list = []  # timing tokens around the compute stream's waits
        self._wait_folded = 0.0
        # the compute stream's work the copy stream must wait for before evicting (see retired)
        self._retire_event = self.streams.record_event(self.compute)

    def track_compute(self) -> None:
        """The caller's current stream is the compute stream (called outside ``planning()``)."""
        self.compute = self.streams.current_stream()

    def plan_after_compute(self) -> None:
        """The plan stream waits for the compute stream's work so far (tensors it filled)."""
        self.streams.wait_stream(self.streams.plan, self.compute)

    def planning(self):
        """Context for bookkeeping work (the plan stream)."""
        return self.streams.use(self.streams.plan)

    def planning_input(self, t: torch.Tensor) -> None:
        """``t`` was copied on the input stream (a device batch): the plan stream waits for it."""
        self.streams.wait_stream(self.streams.plan, self.streams.input)
        self.streams.record_stream(t, self.streams.plan)

    def compute_event(self):
        """An event after the compute stream's work so far (recorded on the training thread)."""
        return self.streams.record_event(self.compute)

    def retired(self, event) -> None:
        """Batches were retired when ``event`` was recorded (``compute_event``): their backward
        passes come before any later write-back or load of their (now unpinned) slots."""
        self._retire_event = event

    def move(
        self, wb_slots: torch.Tensor, wb_rows: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor
    ) -> None:
        """Write ``wb_slots`` back to ``wb_rows``, then fill ``slots`` with (non-resident) ``rows``."""
        st = self.streams
        st.wait_event(st.copy, self._retire_event)
        st.wait_stream(st.copy, st.plan)
        with st.use(st.copy):
            self.move_now(wb_slots, wb_rows, slots, rows)
        for t in (wb_slots, wb_rows, slots, rows):
            st.record_stream(t, st.copy)

    @torch.no_grad()
    def move_now(self, wb_slots, wb_rows, slots, rows) -> None:
        """``move`` on the current stream, with no stream hand-offs (flush, import: after ``sync``).

        Each direction is one kernel over host memory: the store keeps a row's weights and state
        as one record (see store.py); only the gathers/scatters on the device's own slot buffers
        are per buffer (fbgemm keeps weights and state apart)."""
        st = self.store
        if wb_slots.numel():
            record = self.cache_w.index_select(0, wb_slots)
            if self.cache_m is not None:
                m = self.cache_m.index_select(0, wb_slots)
                record = torch.cat([record, m.reshape(m.shape[0], -1)], dim=1)
            st.data.index_copy_(0, wb_rows, record)
        if slots.numel():
            record = st.data.index_select(0, rows)
            dim = self.cache_w.shape[1]
            self.cache_w.index_copy_(0, slots, record[:, :dim])
            if self.cache_m is not None:
                self.cache_m.index_copy_(
                    0, slots, record[:, dim:].reshape((-1, *self.cache_m.shape[1:]))
                )

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """A small host tensor on the device without synchronizing: an asynchronous copy from
        pageable memory waits for the stream first, so it goes through pinned memory."""
        if self.device.type != "cuda":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def read(self, t: torch.Tensor) -> list:
        """The one host read of a prefetch (the plan stream's sizes)."""
        return self.streams.read(t)

    def ready(self):
        """An event after every copy and plan step issued so far."""
        st = self.streams
        st.wait_stream(st.copy, st.plan)
        return st.record_event(st.copy)

    def wait_ready(self, event, indices: torch.Tensor) -> None:
        """The compute stream waits for ``event`` before using ``indices`` (made on the plan stream).

        Timing tokens around the wait measure how long the GPU really sat waiting for the rows
        (read lazily by ``transfer_wait_s``, so no host synchronization here).
        """
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

    def use_on_compute(self, *tensors: torch.Tensor) -> None:
        """Plan-stream results the compute stream reads now: it waits for them, they outlive it."""
        st = self.streams
        cur = st.current_stream()
        st.wait_stream(cur, st.plan)
        for t in tensors:
            st.record_stream(t, cur)

    def sync(self) -> None:
        """Everything issued so far has finished (flush, import, overflow: not on the step path)."""
        self.streams.synchronize()
