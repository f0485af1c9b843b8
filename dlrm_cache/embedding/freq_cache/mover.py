"""Row movement between the host store and the device slot buffer (weights + optimizer state).

Callers pass deduplicated slot/row ids, so every distinct row moves once.

CPU (tests, machines without a GPU): plain synchronous ``index_select``/``index_copy_``.

CUDA: every copy runs on one side stream.  ``begin()`` makes the side stream wait for the compute
stream's work enqueued so far (the backward passes of retired batches, which may still update the
slots about to be evicted); loads go host(pinned staging) -> device -> ``index_copy_`` into the slot
buffer, and ``mark_ready()`` records an event the compute stream waits on before the batch's
lookup.  Write-backs go slot buffer -> pinned staging asynchronously; they are scattered into the
host store lazily by ``complete()``, which the cache calls before it next reads rows from the host
store (one prefetch later, by when the copy has normally finished), so the CPU never waits for the
GPU step in flight.  No device-wide synchronize anywhere in the step.
"""

from __future__ import annotations

import time

import numpy as np
import torch

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
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._pending: list[tuple[torch.cuda.Event, torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        self._older = 0  # pending write-backs issued before the current prefetch began
        self.wait_s = 0.0  # CPU seconds blocked on finishing write-backs

    # -- helpers ---------------------------------------------------------------------------------
    def _index(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
        if not self.cuda:
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def to_device(self, a: np.ndarray) -> torch.Tensor:
        """An int64 index array on the device (on the side stream under CUDA; see mark_ready)."""
        if not self.cuda:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
        with torch.cuda.stream(self.stream):
            return self._index(a)

    # -- step protocol ---------------------------------------------------------------------------
    def begin(self) -> None:
        """Start one prefetch: copies issued from here on wait for the compute stream's work so far."""
        if self.cuda:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        # Write-backs issued by earlier prefetches: the rows this one loads may be among them.
        self._older = len(self._pending)

    def mark_ready(self):
        """An event after every copy issued so far (None on CPU)."""
        if not self.cuda:
            return None
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return ev

    def wait_ready(self, event, *tensors: torch.Tensor) -> None:
        """Make the compute stream wait for ``event``; ``tensors`` made on the side stream are used there."""
        if event is None:
            return
        cur = torch.cuda.current_stream(self.device)
        cur.wait_event(event)
        for t in tensors:
            if t is not None and t.is_cuda:
                t.record_stream(cur)

    # -- moves -----------------------------------------------------------------------------------
    def load(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Host rows -> device slots (``rows`` are not resident, so the host copy is current)."""
        if slots.size == 0:
            return
        rows_t = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
        if not self.cuda:
            slots_t = torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64))
            self.cache_w.index_copy_(0, slots_t, self.store.weight.index_select(0, rows_t))
            if self.cache_m is not None:
                self.cache_m.index_copy_(0, slots_t, self.store.momentum.index_select(0, rows_t))
            return
        # A row evicted by an earlier prefetch may come straight back: land those write-backs
        # (not this prefetch's own: its victims were resident, so they are not among ``rows``).
        self.complete(self._older)
        self._older = 0
        host_w = self._gather_pinned(self.store.weight, rows_t)
        host_m = None if self.cache_m is None else self._gather_pinned(self.store.momentum, rows_t)
        with torch.cuda.stream(self.stream):
            slots_t = self._index(slots)
            self.cache_w.index_copy_(0, slots_t, host_w.to(self.device, non_blocking=True))
            if host_m is not None:
                self.cache_m.index_copy_(0, slots_t, host_m.to(self.device, non_blocking=True))

    def write_back(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Device slots -> host rows (after this, the slots may be reloaded)."""
        if slots.size == 0:
            return
        rows_t = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
        if not self.cuda:
            slots_t = torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64))
            self.store.weight.index_copy_(0, rows_t, self.cache_w.index_select(0, slots_t))
            if self.cache_m is not None:
                self.store.momentum.index_copy_(0, rows_t, self.cache_m.index_select(0, slots_t))
            return
        with torch.cuda.stream(self.stream):
            slots_t = self._index(slots)
            host_w = self._d2h(self.cache_w.index_select(0, slots_t))
            host_m = None if self.cache_m is None else self._d2h(self.cache_m.index_select(0, slots_t))
            ev = torch.cuda.Event()
            ev.record(self.stream)
        self._pending.append((ev, rows_t, host_w, host_m))

    def complete(self, n: int | None = None) -> None:
        """Scatter the oldest ``n`` (default: all) write-backs into the host store, waiting if needed."""
        n = len(self._pending) if n is None else min(n, len(self._pending))
        if n == 0:
            return
        t0 = time.perf_counter()
        for ev, rows_t, host_w, host_m in self._pending[:n]:
            ev.synchronize()
            self.store.weight.index_copy_(0, rows_t, host_w)
            if host_m is not None:
                self.store.momentum.index_copy_(0, rows_t, host_m)
        del self._pending[:n]
        self._older = max(0, self._older - n)
        self.wait_s += time.perf_counter() - t0

    # -- synchronous whole-buffer operations (flush, import, overflow) ----------------------------
    def read_slots(self, slots: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Slot contents as CPU tensors, synchronously (after everything issued so far)."""
        self.sync()
        idx = torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64)).to(self.device)
        w = self.cache_w.index_select(0, idx).cpu()
        m = None if self.cache_m is None else self.cache_m.index_select(0, idx).cpu()
        return w, m

    def write_slots(self, slots: np.ndarray, w: torch.Tensor, m: torch.Tensor | None) -> None:
        """Overwrite slots on the compute stream (ordered after everything issued so far)."""
        self.sync()
        idx = torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64)).to(self.device)
        self.cache_w.index_copy_(0, idx, w.to(self.device))
        if m is not None and self.cache_m is not None:
            self.cache_m.index_copy_(0, idx, m.to(self.device))

    def sync(self) -> None:
        """Order the compute stream after the side stream and land pending write-backs."""
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
        self.complete()

    # -- CUDA staging ------------------------------------------------------------------------------
    @staticmethod
    def _gather_pinned(src: torch.Tensor, rows_t: torch.Tensor) -> torch.Tensor:
        # The caching host allocator keeps a pinned block alive until the async copy reading it ends.
        buf = torch.empty((rows_t.numel(),) + tuple(src.shape[1:]), dtype=src.dtype, pin_memory=True)
        torch.index_select(src, 0, rows_t, out=buf)
        return buf

    @staticmethod
    def _d2h(t: torch.Tensor) -> torch.Tensor:
        buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        buf.copy_(t, non_blocking=True)
        return buf
