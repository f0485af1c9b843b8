"""FreqCacheBackend: full tables in host memory, a frequency-aware row cache on the device.

Layout
    One fbgemm TBE on the device with a single table of ``num_slots`` rows that every feature maps
    onto (``feature_table_map = [0] * T``): a *global* slot pool.  Its size is the sum over tables of
    ``max(1, ceil(cache_ratio * rows_t))`` -- the same memory as per-table caches -- plus the slots
    ``cache_layout`` (layout.py) adds when the look-ahead window needs more; capacity goes where the
    accesses are.  Lookups and the fused optimizer (backward) run on slot ids, so a row's optimizer
    state lives next to its weight in the slot and travels with it.

    Static region: the ``static_fraction`` share of the slots holding the globally hottest rows.
    With dataset counts, that is the top rows by count over all tables; since rows are frequency
    ranks, each table's share is a prefix ``rank < static_rows[t]``, placed at slot
    ``static_offsets[t] + rank`` -- no lookup, never evicted.  Without counts (lfu/lru) each table
    gets ``static_fraction`` of its own share.  ``static_fraction=0`` gives a pure lfu/lru cache.

Where the work runs
    The input pipeline holds each batch in host memory before the device does, so the cache plans
    on the host (placement.py) against host bookkeeping (slots.py, policy.py), on its planner
    thread (planner.py; inline on a CPU device), and sends the device per batch one staging copy
    in, one scatter of the missing rows into their slots, one gather and copy out of the dirty
    victims, and the batch's lookup indices (transfer.py), on the copy stream.  The training
    thread only posts tasks and waits, on the GPU, for its batch's "rows ready" event.  The
    cache-independent part of the planning (global rows, static slots) runs on the loader thread
    where the device has streams (``analyze``); on a CPU device the planner does it inline.

Step protocol (what the trainer does)
    ``prefetch(kjt)`` for each future batch (FIFO), then ``forward(kjt)`` for the oldest one, then
    its backward.  A prefetch (on the planner) finds the batch's misses, evicts victims by policy
    (dirty ones written back after the event recorded on the compute stream when the batches that
    last used them retired), loads the misses and keeps the batch's slot ids.  Every slot a
    prefetched batch uses is pinned (once per id) until that batch is *retired*, at the next call
    of ``prefetch``, ``forward``, ``step_done``, ``flush``, ``export_tables`` or
    ``import_tables`` -- i.e. its backward must have been issued by then, which is what every
    training loop does.  ``forward`` waits until its batch is placed (normally long done); a batch
    without a prior prefetch (an ad-hoc batch) is placed then.

    ``forward`` consumes a prefetched batch by the FIFO protocol of ``EmbeddingBackend``: under grad
    the oldest, under no_grad the oldest prefetched under no_grad (evaluation batches queue behind
    the training window).  A deferred batch that is forwarded next takes the window's space back
    (the later batches are placed again afterwards).

Overflow
    A batch whose rows do not fit next to the pinned window is *deferred* (the window shrinks; later
    prefetches queue up behind it) and prepared when earlier batches retire.  A batch that does not
    fit even in an empty dynamic region runs through a temporary TBE holding exactly its rows
    (overflow.py): slower, but correct.  Both are counted in ``stats()``.

Dirty tracking
    A batch prefetched or forwarded with autograd enabled marks its slots dirty; only dirty rows are
    written back on eviction and by ``flush()``.  ``torch.no_grad()`` batches (evaluation) mark
    nothing dirty.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections import deque
from typing import Any

import numpy as np
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
)
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from ..base import (
    DeviceUnavailable,
    EmbeddingBackend,
    SparseOptim,
    TableSpec,
    pooled,
    pop_prefetched,
    shared_dim,
)
from ..tbe import make_tbe, momentum_view, weights_view
from .batch import Analysis, WindowBatch
from .layout import cache_layout
from .overflow import OverflowPath
from .placement import Placer
from .planner import Planner
from .policy import EvictionPolicy
from .settings import check_settings, flatten_counts
from .slots import SlotTable
from .store import HostStore
from .threads import HostThreads
from .transfer import Transfers
from .window import Window

log = logging.getLogger(__name__)


def observes_counts(policy: str, refresh_counts: bool) -> bool:
    """Whether the cache counts rows' accesses itself (the host store's ``observed`` array)."""
    return policy == "lfu" or (policy == "freq" and refresh_counts)


def resolve_planner_threads(threads: int, device: torch.device) -> int:
    """``embedding.planner_threads``; 0: 1 on a CPU device (its step already uses every core),
    else up to 4 (the host passes worth splitting are memory-bound)."""
    if threads:
        return int(threads)
    return 1 if device.type != "cuda" else max(1, min(4, (os.cpu_count() or 2) // 2))


class FreqCacheBackend(EmbeddingBackend):
    tbe: SplitTableBatchedEmbeddingBagsCodegen  # set in __init__, outside the module's registry
    uses_counts = True

    def __init__(
        self,
        tables: list[TableSpec],
        optim: SparseOptim,
        device: torch.device | str = "cuda",
        cache_ratio: float = 0.015,
        policy: str = "freq",
        refresh_counts: bool = False,
        lookahead: int = 2,
        static_fraction: float = 0.5,
        counts: dict[str, Any] | None = None,
        batch_size: int = 0,
        planner_threads: int = 0,
        counted_samples: int = 0,
    ) -> None:
        """``counts``: each table's per-row access counts (stats/), ``counted_samples``: the
        samples they were counted in, so that the window is sized for each table's ids per sample
        (0: one id per sample and table)."""
        super().__init__(tables, optim)
        # ---- validation: everything before a byte is allocated
        self.dim = shared_dim(tables, "freq_cache")
        check_settings(
            cache_ratio, policy, static_fraction, lookahead, batch_size, planner_threads, counts
        )
        flat_counts = None if counts is None else flatten_counts(tables, counts)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise DeviceUnavailable(
                f"embedding=freq_cache on device={self.device} but CUDA is not available; "
                "use device=cpu (the cache logic is the same) or embedding=host"
            )

        self.cache_ratio = float(cache_ratio)
        self.lookahead = int(lookahead)
        self.policy_name = policy
        rows = np.array([t.num_rows for t in tables], dtype=np.int64)
        self.layout = self._layout(
            rows, static_fraction, flat_counts, policy, batch_size, counted_samples
        )
        self.slot_bytes = optim.row_bytes(self.dim)  # a slot's device bytes: row + optimizer state
        self.cache_bytes = self.layout.num_slots * self.slot_bytes
        self._check_device_memory()

        # ---- allocation
        if self.device.type == "cuda" and self.device.index is None:  # the threads' device
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.planner_threads = resolve_planner_threads(planner_threads, self.device)
        host = HostThreads(self.planner_threads)
        observed = observes_counts(policy, refresh_counts)
        self.store = HostStore(
            self.tables,
            optim,
            self.dim,
            host,
            counts=flat_counts if policy == "freq" else None,
            observed=observed,
        )
        num_slots, num_static = self.layout.num_slots, self.layout.num_static
        self.slots = SlotTable(num_slots, num_static, self.store.num_rows)
        self.policy = EvictionPolicy(policy, self.slots, self.store.counts, self.store.observed)
        self._lr = optim.lr
        tbe = make_tbe(
            [num_slots], self.dim, optim, self.device, feature_table_map=[0] * len(tables)
        )
        object.__setattr__(self, "tbe", tbe)
        self.transfers = Transfers(
            self.store,
            self.slots,
            weights_view(tbe, self.dim),
            momentum_view(tbe, optim, self.dim),
            self.device,
        )
        self.streams = self.transfers.streams
        self.placer = Placer(
            self.feature_names,
            rows,
            self.layout,
            self.slots,
            self.policy,
            self.store,
            self.transfers,
        )
        self._overflow = OverflowPath(self.placer, optim, self.dim, self.device)
        # Static region: table t's rows [0, static_rows[t]) at slots static_offsets[t] + rank.
        st_rows = np.concatenate(
            [off + np.arange(n) for off, n in zip(self.store.row_offsets, self.layout.static_rows)]
        ).astype(np.int64)
        st_slots = np.arange(num_static, dtype=np.int64)
        self.slots.assign(st_slots, st_rows)
        self.transfers.upload(st_slots, st_rows)

        self._fifo: deque[WindowBatch] = deque()  # training thread: prefetched, not forwarded
        self._window = Window(self.placer, self._overflow, self.slot_bytes)
        self._unretired = True  # a batch was forwarded since the last retirement (as if)
        self._planner = Planner(self.streams, self.device)
        weakref.finalize(self, self._planner.close)
        weakref.finalize(self, host.close)
        weakref.finalize(self, self.transfers.write_backs.close)

    def _layout(self, rows, static_fraction, flat_counts, policy, batch_size, samples):
        row_off = np.concatenate([[0], np.cumsum(rows)])
        table_counts = (
            None
            if flat_counts is None
            else [flat_counts[a:b] for a, b in zip(row_off[:-1], row_off[1:])]
        )
        layout = cache_layout(
            rows,
            self.cache_ratio,
            static_fraction,
            table_counts,
            global_static=policy == "freq",
            lookahead=self.lookahead,
            batch_size=batch_size,
            samples=samples,
        )
        if layout.added_rows > 0:
            log.info(
                "freq_cache: cache_ratio=%g gives %s window slots, but %d look-ahead batches of %d "
                "samples need ~%s distinct rows at once: window region sized to %s rows (+%s "
                "slots, +%.1f MiB)",
                self.cache_ratio,
                f"{int(layout.ratio_rows.sum()) - layout.num_static:,}",
                self.lookahead + 1,
                batch_size,
                f"{layout.window_needed:,}",
                f"{layout.window_rows:,}",
                f"{layout.added_rows:,}",
                layout.added_rows * self.optim.row_bytes(self.dim) / 2**20,
            )
        return layout

    def _check_device_memory(self) -> None:
        if self.device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(self.device)
            if self.cache_bytes > free:
                raise ValueError(
                    f"embedding.cache_ratio={self.cache_ratio}: the cache needs "
                    f"{self.cache_bytes / 2**30:.2f} GiB of GPU memory but {free / 2**30:.2f} GiB "
                    "are free; lower embedding.cache_ratio"
                )

    @classmethod
    def host_bytes_per_row(cls, device: torch.device, settings: dict[str, Any]) -> int:
        """The host store's counts (float64 dataset counts for ``freq``; int64 observed ones for
        ``lfu`` or ``refresh_counts``), the row map and the dedup scratch (two int32): what
        HostStore and SlotTable allocate per row."""
        policy = settings.get("policy", "freq")
        n = 8 + (8 if policy == "freq" else 0)
        if observes_counts(policy, settings.get("refresh_counts", False)):
            n += 8
        return n

    # ------------------------------------------------------------------------------ public API
    def analyze(self, features: KeyedJaggedTensor) -> Analysis | None:
        """The cache-independent part of a placement (global rows, range check, static slots) of
        a host batch, for the loader thread, where the device has streams; on a CPU device the
        inline planner does it (a hand-over to another thread costs more on a busy CPU than the
        work, measured: docs/benchmarks.md)."""
        if not self.streams.asynchronous or features.values().device.type != "cpu":
            return None
        return self.placer.analyze(features, features.values().numpy())

    # The training thread's side: post to the planner (which, inline on a CPU, runs the task) ---
    def prefetch(self, features: KeyedJaggedTensor, analysis: object | None = None) -> None:
        # ``analysis``: what ``analyze`` returned (an Analysis or None), as the base declares it
        self._retire()
        b = WindowBatch(features, torch.is_grad_enabled())
        ordered = None if isinstance(analysis, Analysis) else self._ordered(features)
        self._planner.post(self._window.prefetch, b, analysis, False, ordered)
        self._fifo.append(b)

    def step_done(self) -> None:
        """The last forwarded batch's backward has been issued (optional: any later call implies it)."""
        self._retire()

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        self._retire()
        train = torch.is_grad_enabled()
        b = pop_prefetched(self._fifo, features, lambda b: b.kjt, lambda b: b.train)
        t0 = time.perf_counter()  # an inline planner places the batch within the posts below
        if b is None:  # ad hoc: placed now
            b = WindowBatch(features, train)
            self._planner.post(self._window.prefetch, b, None, True, self._ordered(features))
        self._planner.post(self._window.demand, b, train)
        b.wait(self.streams, self._planner)
        stall = time.perf_counter() - t0
        self._unretired = True  # from here on, the batch is in flight (or failed)
        if b.error is not None:
            raise b.error
        if b.needs_overflow:
            self._planner.call(self._window.add_stall, stall)  # the planner is idle from here on
            out = self._overflow.forward(b, features, self._lr)
            self._planner.call(self._window.inflight.append, b)
            return pooled(features, out, self.dim)
        assert b.indices is not None  # placed: prepare set them, _p_forwarded clears them later
        indices = b.indices
        self.transfers.wait_ready(b.event, indices)
        offsets = features.offsets().to(self.device, dtype=indices.dtype, non_blocking=True)
        out = self.tbe(indices, offsets)
        self._planner.post(self._window.forwarded, b, stall)
        return pooled(features, out, self.dim)

    def _ordered(self, features: KeyedJaggedTensor) -> Any:
        """For a batch not on the host: an event after the compute stream's work so far, which
        reading it back waits for (whoever made it); None for a host batch."""
        if features.values().device.type == "cpu":
            return None
        self.transfers.track_compute()
        return self.transfers.compute_event()

    def _retire(self) -> None:
        """Every call into the cache retires the forwarded batches: their backward is issued.

        The event recorded now on the compute stream orders later row transfers after it (the
        backward passes of retired batches, a checkpoint's reads of the slots), without the host
        ever waiting for it.  Without streams, where that order is the order of the calls, a
        call with no batch forwarded since the last retirement has nothing to do."""
        if not self._unretired and not self.streams.asynchronous:
            return
        self.transfers.track_compute()
        self._planner.post(self._window.retire, self.transfers.compute_event())
        self._unretired = False

    def set_learning_rate(self, lr: float) -> None:
        self._lr = float(lr)
        self.tbe.set_learning_rate(lr)

    def flush(self) -> None:
        self._retire()
        self._planner.call(self._window.flush)

    def export_tables(self) -> dict[str, torch.Tensor]:
        self.flush()
        with self.streams.on_host():  # host memory, read by the host
            return self.store.export()

    def import_tables(self, state: dict[str, torch.Tensor]) -> None:
        self._retire()
        self._planner.call(self._window.import_tables, state)

    def stats(self) -> dict[str, float]:
        """Counters since the last ``reset_stats`` (host numbers; nothing changes)."""
        out = self._planner.call(self._window.stats)
        out.update(self.layout_stats())
        out["transfer_wait_s"] = self.transfers.transfer_wait_s()  # the training thread's waits
        return out

    def reset_stats(self) -> None:
        self._planner.call(self._window.reset_stats)
        self.transfers.reset_transfer_wait()

    def settle(self) -> None:
        """Wait until the planner has run every task posted so far (its state is then current)."""
        self._planner.call(lambda: None)

    def cancel_prefetch(self, grad: bool | None = None) -> None:
        """Forget prefetched batches that will not be forwarded (e.g. a loop left early)."""
        gone = [b for b in self._fifo if grad is None or b.train == grad]
        for b in gone:
            self._fifo.remove(b)
        self._planner.call(self._window.cancel, gone)

    def layout_stats(self) -> dict[str, float]:
        """The cache's regions: rows and device bytes (see ``cache_layout``)."""
        static, window = self.slots.num_static, self.slots.num_dynamic
        return {
            "cache_bytes": float(self.cache_bytes),
            "cache_rows": float(self.slots.num_slots),
            "static_rows": float(static),
            "static_bytes": float(static * self.slot_bytes),
            "window_rows": float(window),
            "window_bytes": float(window * self.slot_bytes),
            "window_needed_rows": float(self.layout.window_needed),
        }
