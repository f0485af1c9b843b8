"""FreqCacheBackend: full tables in host memory, a frequency-aware row cache on the device.

Layout
    One fbgemm TBE on the device with a single table of ``num_slots`` rows that every feature maps
    onto (``feature_table_map = [0] * T``): a *global* slot pool.  Its size is the sum over tables of
    ``max(1, ceil(cache_ratio * rows_t))`` -- the same memory as per-table caches -- plus the slots
    ``cache_layout`` (layout.py) adds when the look-ahead window needs more; capacity goes where the
    accesses are: a 3-row table does not get 1 slot it must thrash through every batch while a
    10M-row table has spare ones.  Lookups and the fused optimizer (backward) run on slot
    ids, so a row's optimizer state lives next to its weight in the slot and travels with it.

    Static region: the ``static_fraction`` share of the slots holding the globally hottest rows.
    With dataset counts, that is the top rows by count over all tables; since rows are frequency
    ranks, each table's share is a prefix ``rank < static_rows[t]``, placed at slot
    ``static_offsets[t] + rank`` -- no lookup, never evicted.  Without counts (lfu/lru) each table
    gets ``static_fraction`` of its own share.  ``static_fraction=0`` gives a pure lfu/lru cache.

Where the work runs
    On the training thread: nothing but posting tasks and the lookup itself (on a CPU the
    planner runs the tasks inline there, see planner.py).  Every placement
    decision runs on the cache's planner thread (planner.py), in torch ops on the cache's device and
    its high-priority plan stream (see mover.py and dlrm_cache/streams.py): dedup of a batch's ids
    (one sort of int32 keys, where they fit, into buffers with room for every id), lookups (binary
    search in the dynamic region's sorted rows, or a dense map), victim choice (``topk`` over slot
    scores), pins, dirty bits, and the row copies themselves (kernels reading and writing the
    host-mapped store, on the copy stream).  The planner reads device values once per attempt to
    place a batch (once per batch unless it is deferred): its sizes (distinct rows, misses, free
    slots, an out-of-range flag) in one read of the plan stream, which never waits for the compute
    stream; every kernel after it is sized by what the host knows (``nonzero_static``, write-backs
    of clean victims to a scratch row).  Without CUDA the same code runs on CPU tensors, which is
    how the tests check it (the stream harness with a threaded planner); a CPU cache runs the
    planner's tasks inline (planner.py says why) and, with the dense row map, places a batch per
    id through the map (by_id.py: no sort, a few whole-batch passes, only the rows to load
    deduplicated): on a CPU, where the cache's work cannot hide behind the step, its cost per
    batch is what counts.

Step protocol (what the trainer does)
    ``prefetch(kjt)`` for each future batch (FIFO), then ``forward(kjt)`` for the oldest one, then
    its backward.  A prefetch (on the planner) dedupes the batch's ids, finds misses, evicts victims
    by policy (dirty ones written back, after the event recorded on the compute stream when the
    batches that last used them retired), loads the misses, and keeps the remapped slot ids for that
    batch.  Every slot a prefetched batch uses is pinned (refcount: once per distinct row, or once
    per id where the batch is placed per id, by_id.py) until that batch is *retired*.
    A batch is retired at the next call of ``prefetch``, ``forward``, ``step_done``, ``flush``,
    ``export_tables`` or ``import_tables`` -- i.e. its backward must have been issued by then, which
    is what every training loop does (forward, backward, optimizer step, next batch).  ``forward``
    waits until its batch is placed (normally long done); a batch without a prior prefetch
    (``lookahead=0``, an ad-hoc evaluation batch) is placed then.

    ``forward`` consumes a prefetched batch by the FIFO protocol of ``EmbeddingBackend``: under grad
    the oldest, under no_grad the oldest prefetched under no_grad (evaluation batches queue behind
    the training window).  A deferred batch that is forwarded next takes the window's space back
    (the later batches are placed again afterwards).

Overflow
    A batch whose rows do not fit next to the pinned window is *deferred* (the window shrinks; later
    prefetches queue up behind it) and prepared when earlier batches retire.  A batch that does not
    fit even in an empty dynamic region runs through a temporary TBE holding exactly its rows
    (copied from the slots or the host store, written back after its backward): slower, but correct.
    Both are counted in ``stats()``.

Dirty tracking
    A batch prefetched or forwarded with autograd enabled marks its slots dirty; only dirty rows are
    written back on eviction and by ``flush()`` (an evicted clean row is written to the store's
    scratch row, which nothing reads).  ``torch.no_grad()`` batches (evaluation) mark nothing
    dirty.
"""

from __future__ import annotations

import logging
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

from ...streams import streams_for
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
from .batch import Analysis, WindowBatch, id_tables
from .by_id import IdPath
from .counters import Counters
from .layout import cache_layout
from .mover import Mover
from .overflow import OverflowPath
from .planner import Planner
from .policy import EvictionPolicy
from .settings import check_settings, flatten_counts
from .slots import SlotTable, resolve_row_map
from .store import HostStore

log = logging.getLogger(__name__)


def observes_counts(policy: str, refresh_counts: bool) -> bool:
    """Whether the cache counts rows' accesses itself (the host store's ``observed`` array)."""
    return policy == "lfu" or (policy == "freq" and refresh_counts)


class FreqCacheBackend(IdPath, OverflowPath, EmbeddingBackend):
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
        row_map: str = "auto",
        batch_size: int = 0,
    ) -> None:
        super().__init__(tables, optim)
        # ---- validation: everything before a byte is allocated
        self.dim = shared_dim(tables, "freq_cache")
        check_settings(cache_ratio, policy, static_fraction, lookahead, batch_size, row_map, counts)
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
        row_off = np.concatenate([[0], np.cumsum(rows)])
        table_counts = (
            None
            if flat_counts is None
            else [flat_counts[a:b] for a, b in zip(row_off[:-1], row_off[1:])]
        )
        self.layout = cache_layout(
            rows,
            self.cache_ratio,
            static_fraction,
            table_counts,
            global_static=policy == "freq",
            lookahead=self.lookahead,
            batch_size=batch_size,
        )
        num_slots, num_static = self.layout.num_slots, self.layout.num_static
        # a slot's device bytes: its TBE row + optimizer state, and its bookkeeping (slot_row,
        # score: 8 B; pin: 4 B; dirty, map: 17 B)
        self.slot_bytes = optim.row_bytes(self.dim) + 37
        if self.layout.added_rows > 0:
            log.info(
                "freq_cache: cache_ratio=%g gives %s window slots, but %d look-ahead batches of %d samples "
                "need ~%s distinct rows at once: window region sized to %s rows (+%s slots, +%.1f MiB)",
                self.cache_ratio,
                f"{int(self.layout.ratio_rows.sum()) - num_static:,}",
                self.lookahead + 1,
                batch_size,
                f"{self.layout.window_needed:,}",
                f"{self.layout.window_rows:,}",
                f"{self.layout.added_rows:,}",
                self.layout.added_rows * self.slot_bytes / 2**20,
            )
        self.cache_bytes = num_slots * self.slot_bytes
        if self.device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(self.device)
            if self.cache_bytes > free:
                raise ValueError(
                    f"embedding.cache_ratio={cache_ratio}: the cache needs {self.cache_bytes / 2**30:.2f} GiB "
                    f"of GPU memory but {free / 2**30:.2f} GiB are free; lower embedding.cache_ratio"
                )

        # ---- allocation
        dev = self.device
        observed = observes_counts(policy, refresh_counts)
        self.store = HostStore(
            self.tables,
            optim,
            self.dim,
            dev,
            counts=flat_counts if policy == "freq" else None,
            observed=observed,
        )
        self.row_offsets = self.store.row_offsets
        # small per-table constants on the device, for the vectorized analysis
        self._t_rows = torch.from_numpy(rows).to(dev)
        self._t_row_off = torch.from_numpy(self.row_offsets).to(dev)
        self._t_static_rows = torch.from_numpy(self.layout.static_rows).to(dev)
        self._t_static_off = torch.from_numpy(self.layout.static_offsets).to(dev)
        self._t_index = torch.arange(len(tables), device=dev)
        self.slots = SlotTable(num_slots, num_static, dev, self.store.num_rows, row_map)
        # Without streams (a CPU cache) sizes cost nothing: with the dense map, a batch is placed
        # per id through it (by_id.py) instead of from a sort (see ``_analyze``).
        self._per_id = self.slots.row_map == "dense" and not streams_for(dev).asynchronous
        self.policy = EvictionPolicy(policy, self.slots, self.store)
        self._lr = optim.lr
        object.__setattr__(
            self,
            "tbe",
            make_tbe([num_slots], self.dim, optim, dev, feature_table_map=[0] * len(tables)),
        )
        cache_w = weights_view(self.tbe, self.dim)
        cache_m = momentum_view(self.tbe, optim, self.dim)
        self.mover = Mover(self.store, cache_w, cache_m, dev)
        # Static region: table t's rows [0, static_rows[t]) at slots static_offsets[t] + rank.
        self.mover.plan_after_compute()  # the bookkeeping above was filled on the compute stream
        with self.mover.planning():
            st_slots = torch.arange(num_static, device=dev)
            st_table = torch.repeat_interleave(
                self._t_index, self._t_static_rows, output_size=num_static
            )
            st_rows = self._t_row_off[st_table] + (st_slots - self._t_static_off[st_table])
            self.slots.assign(st_slots, st_rows)
            self.mover.move(st_slots[:0], st_rows[:0], st_slots, st_rows)
        self.mover.sync()

        self._fifo: deque[WindowBatch] = deque()  # training thread: prefetched, not yet forwarded
        self._queue: deque[WindowBatch] = deque()  # planner: prefetched, not yet forwarded (FIFO)
        self._inflight: list[
            WindowBatch
        ] = []  # planner: forwarded, backward not yet known to be done
        self._counters = self._zero_stats()
        self._unretired = True  # a batch was forwarded since the last retirement (as if)
        self._planner = Planner(self.mover.streams, self.device)
        weakref.finalize(self, self._planner.close)

    @classmethod
    def host_bytes_per_row(cls, device: torch.device, settings: dict[str, Any]) -> int:
        """The host store's counts (float64 dataset counts for ``freq``; int64 observed ones for
        ``lfu`` or ``refresh_counts``), and on a CPU the dense row map with its dedup scratch
        (two int32): what HostStore and SlotTable allocate per row."""
        policy = settings.get("policy", "freq")
        n = 8 if policy == "freq" else 0
        if observes_counts(policy, settings.get("refresh_counts", False)):
            n += 8
        if (
            device.type != "cuda"
            and resolve_row_map(settings.get("row_map", "auto"), device) == "dense"
        ):
            n += 8
        return n

    # ------------------------------------------------------------------------------ public API
    def analyze(self, features: KeyedJaggedTensor) -> Analysis | None:
        """The cache-independent part of a prefetch, for the loader thread: on a CPU cache only,
        where there are no streams and the row map is sorted (a GPU cache does it on the planner
        thread, on its plan stream, much faster than the host could; a CPU cache with the dense
        map does it inline, where its O(ids) passes cost less than a hand-over to another thread
        on a busy CPU, measured: docs/benchmarks.md)."""
        if self.mover.streams.asynchronous or self._per_id:
            return None  # the planner does it (the first-occurrence pass uses its scratch array)
        return self._analyze(features)

    # The training thread's side: post to the planner (which, inline on a CPU, runs the task) ---
    def prefetch(self, features: KeyedJaggedTensor, analysis: object | None = None) -> None:
        # ``analysis``: what ``analyze`` returned (an Analysis or None), as the base declares it
        self._retire()
        b = WindowBatch.new(features, torch.is_grad_enabled())
        self._planner.post(self._p_prefetch, b, analysis)  # raises a pending failure first
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
            b = WindowBatch.new(features, train)
            self._planner.post(self._p_prefetch, b, None, True)
        self._planner.post(self._p_demand, b, train)
        b.wait(self.mover.streams)
        stall = time.perf_counter() - t0
        self._unretired = True  # from here on, the batch is in flight (or failed)
        if b.error is not None:
            raise b.error
        if b.needs_overflow:
            self._planner.call(self._p_add_stall, stall)  # the planner is idle from here on
            out = self._forward_overflow(b, features)
            return pooled(features, out, self.dim)
        assert b.indices is not None  # placed: _prepare set them, _p_forwarded clears them later
        self.mover.wait_ready(b.event, b.indices)
        offsets = features.offsets().to(self.device, dtype=b.indices.dtype, non_blocking=True)
        out = self.tbe(b.indices, offsets)
        self._planner.post(self._p_forwarded, b, stall)
        return pooled(features, out, self.dim)

    def _retire(self) -> None:
        """Every call into the cache retires the forwarded batches: their backward is issued.

        The event recorded now on the compute stream orders later row transfers after it (the
        backward passes of retired batches, a checkpoint's reads of the store), without the host
        ever waiting for it.  Without streams, where that order is the order of the calls, a
        call with no batch forwarded since the last retirement has nothing to do (the calls of a
        step after the first then cost nothing)."""
        if not self._unretired and not self.mover.streams.asynchronous:
            return
        self.mover.track_compute()
        self._planner.post(self._p_retire, self.mover.compute_event())
        self._unretired = False

    def set_learning_rate(self, lr: float) -> None:
        self._lr = float(lr)
        self.tbe.set_learning_rate(lr)

    def flush(self) -> None:
        self._retire()
        self._planner.call(self._p_flush)

    def export_tables(self) -> dict[str, torch.Tensor]:
        self.flush()
        return self.store.export()

    def import_tables(self, state: dict[str, torch.Tensor]) -> None:
        self._retire()
        self._planner.call(self._p_import, state)

    def stats(self) -> dict[str, float]:
        """Counters since the last ``reset_stats`` (read on the plan stream; nothing changes)."""
        out = self._planner.call(self._p_stats)
        out["transfer_wait_s"] = self.mover.transfer_wait_s()  # the training thread's own waits
        return out

    def reset_stats(self) -> None:
        self._planner.call(self._p_reset_stats)
        self.mover.reset_transfer_wait()

    def settle(self) -> None:
        """Wait until the planner has run every task posted so far (its state is then current)."""
        self._planner.call(lambda: None)

    def cancel_prefetch(self, grad: bool | None = None) -> None:
        """Forget prefetched batches that will not be forwarded (e.g. a loop left early)."""
        gone = [b for b in self._fifo if grad is None or b.train == grad]
        for b in gone:
            self._fifo.remove(b)
        self._planner.call(self._p_cancel, gone)

    # The planner's side (tasks run on the planner thread, in order) -------------------------
    def _p_prefetch(self, b: WindowBatch, analysis: Analysis | None, adhoc: bool = False) -> None:
        try:
            if analysis is None or analysis.kjt is not b.kjt:
                analysis = self._analyze(b.kjt)
            b.adopt(analysis)
        except BaseException as e:
            b.error = e
            b.signal(self.mover.streams)
            return
        if not adhoc:
            self._queue.append(b)
            self._try_prepare()

    def _p_demand(self, b: WindowBatch, train: bool) -> None:
        """``b`` is forwarded next: placed now, whatever it takes."""
        if b.error is not None:
            return
        if b in self._queue:
            self._queue.remove(b)
        if train and not b.train:  # prefetched under no_grad, trained on after all
            b.train = True
            if b.prepared:
                self._mark_dirty(b)
        if not b.prepared:
            try:
                if not self._prepare(b):
                    # Give the window's space back (those batches are placed again later), retry.
                    for q in self._queue:
                        self._unprepare(q)
                    b.needs_overflow = not self._prepare(b)
            except BaseException as e:
                b.error = e
        b.signal(self.mover.streams)

    def _p_forwarded(self, b: WindowBatch, stall: float) -> None:
        self._counters.add("stall_s", stall)
        assert b.first_hits is not None  # set by its first placement
        self._count_forwarded(b, *b.first_hits)  # only forwarded batches count (not cancelled)
        b.indices, b.event = None, None
        self._inflight.append(b)
        self._try_prepare()  # batches deferred for lack of space

    def _p_add_stall(self, stall: float) -> None:
        self._counters.add("stall_s", stall)

    def _p_retire(self, event: Any) -> None:
        self.mover.retired(event)
        for b in self._inflight:
            if b.overflow is not None:
                self._retire_overflow(b)
            else:
                assert b.pinned is not None  # forwarded without overflow: prepared
                self.slots.pin_add(b.pinned, -1)
        self._inflight.clear()
        self._try_prepare()

    def _p_cancel(self, gone: list[WindowBatch]) -> None:
        for b in gone:
            if b in self._queue:
                self._queue.remove(b)
            self._unprepare(b)
        self._try_prepare()  # batches deferred behind the cancelled ones

    def _p_flush(self) -> None:
        self.mover.sync()
        s = self.slots
        slots = torch.nonzero(s.dirty).squeeze(1)
        if slots.numel():
            self.mover.move_now(slots, s.slot_row[slots], slots[:0], slots[:0])
            s.dirty[slots] = False
            self._counters.add("rows_written_back", slots.numel())
            self._remark_queued()
        self.mover.sync()

    def _remark_queued(self) -> None:
        """Prefetched training batches were marked dirty when prepared; their steps are to come."""
        for b in self._queue:
            if b.prepared and b.train:
                self._mark_dirty(b)

    def _p_import(self, state: dict[str, torch.Tensor]) -> None:
        self.mover.sync()
        self.store.load(state)
        slots, rows = self.slots.resident()
        self.mover.move_now(slots[:0], rows[:0], slots, rows)
        self.slots.dirty[:] = False
        self._remark_queued()
        self.mover.sync()

    def _p_stats(self) -> dict[str, float]:
        with (
            self.mover.planning()
        ):  # the counters live on the plan stream: read there, not after the step
            out = self._counters.report(
                self.mover.read, self.optim.row_bytes(self.dim), self.feature_names
            )
        out.update(self.layout_stats())
        return out

    def _p_reset_stats(self) -> None:
        self._counters = self._zero_stats()

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

    # ------------------------------------------------------------------------------ internals
    def _zero_stats(self) -> Counters:
        """Fresh counters, made on the plan stream (which updates them)."""
        with self.mover.planning():
            return Counters(len(self.tables), self.device)

    @torch.no_grad()
    def _analyze(self, kjt: KeyedJaggedTensor) -> Analysis:
        """Everything about a batch that does not depend on what is resident, on the cache's device,
        without a host synchronization.

        KJT values are feature-major, so the table of every id comes from ``length_per_key`` (host
        data) with one ``repeat_interleave`` of known size (numpy's on a CPU).  Deduplication, with
        streams or the sorted map, is one sort of the ids' global rows (int32 keys where they fit)
        into buffers with room for every id: the number of distinct rows is read later, with the
        other sizes of the prefetch, in one host read.  A CPU cache with the dense map analyses
        the batch per id instead (``_analyze_ids``, by_id.py), sizes known at once.
        """
        keys = kjt.keys()
        if list(keys) != self.feature_names:
            raise ValueError(
                f"freq_cache: batch features {list(keys)} != tables {self.feature_names}"
            )
        lpk = np.asarray(kjt.length_per_key(), dtype=np.int64)
        if self._per_id:
            return self._analyze_ids(kjt, lpk)
        n = int(lpk.sum())
        dev = self.device
        self.mover.planning_input(kjt.values())
        with self.mover.planning():
            v = kjt.values().to(dev, dtype=torch.int64, non_blocking=True)
            if (
                not self.mover.streams.asynchronous
            ):  # a CPU: numpy's repeat is several times cheaper
                table = id_tables(lpk)
            else:
                lpk_t = self.mover.to_device(torch.from_numpy(lpk))
                table = torch.repeat_interleave(self._t_index, lpk_t, output_size=n)
            bad_id = (v < 0) | (v >= self._t_rows.index_select(0, table))
            # raised at the size read
            grow = torch.where(bad_id, 0, v) + self._t_row_off.index_select(0, table)
            key, perm = torch.sort(grow.to(self.slots.key_dtype))
            first = torch.ones(n, dtype=torch.bool, device=dev)
            first[1:] = key[1:] != key[:-1]
            seg = torch.cumsum(first, 0) - 1  # position of each sorted id among the distinct rows
            inverse = torch.empty_like(seg).scatter_(0, perm, seg)
            uniq = torch.full((n,), self.slots.scratch_row, dtype=torch.int64, device=dev)
            uniq.scatter_(0, seg, key.long())
            counts = torch.zeros(n, dtype=torch.int64, device=dev).index_add_(
                0, seg, torch.ones_like(seg)
            )
            n_uniq, bad = first.sum(), bad_id.any()
        return Analysis(kjt, n, grow, lpk, uniq, inverse, counts, n_uniq, bad)

    def _raise_bad_id(self, b: WindowBatch) -> None:
        v = b.kjt.values().long().cpu()
        table = id_tables(b.table_accesses)
        rows = self._t_rows.cpu()[table]
        i = int(torch.nonzero((v < 0) | (v >= rows))[0, 0])
        t = int(table[i])
        raise IndexError(
            f"freq_cache: id {int(v[i])} out of range for table {self.feature_names[t]} ({int(rows[i])} rows)"
        )

    def _table_of(self, rows: torch.Tensor) -> torch.Tensor:
        """The table of each global row (the scratch id counts as the last table's)."""
        table = torch.searchsorted(self._t_row_off, rows, right=True) - 1
        return table.clamp_(max=len(self.tables) - 1)

    def _slot_of(self, rows: torch.Tensor) -> torch.Tensor:
        """The slot holding each global row (static or dynamic), -1 where none does."""
        if self.slots.row_map == "dense":
            return self.slots.lookup(rows)  # the dense map holds the static rows too
        table = self._table_of(rows)
        rank = rows - self._t_row_off[table]
        static = rank < self._t_static_rows[table]
        return torch.where(static, rank + self._t_static_off[table], self.slots.lookup(rows))

    def _mark_dirty(self, b: WindowBatch) -> None:
        assert b.pinned is not None  # called for prepared batches only
        with self.mover.planning():
            self.slots.mark_dirty(b.pinned)

    @torch.no_grad()
    def _prepare(self, b: WindowBatch) -> bool:
        """Make ``b``'s rows resident and pin them; False (nothing changed) when they do not fit.

        One host read per call (one synchronization of the plan stream under CUDA): the number of
        distinct rows (first call only), misses, free slots and the out-of-range flag together.
        Everything else is sized by what the host already knows: misses are found with
        ``nonzero_static`` of the read size, victims' write-backs go to the store's scratch row
        when they are clean or empty, pins go by ``index_add_``.
        """
        if b.first is not None:
            return self._prepare_ids(b)
        assert b.uniq is not None and b.inverse is not None and b.counts is not None  # sorted
        assert isinstance(b.bad, torch.Tensor)  # a device flag, read with the sizes
        s = self.slots
        with self.mover.planning():
            su = self._slot_of(b.uniq)
            hit = su >= 0
            hit_i = hit.to(torch.int32)
            s.pin.index_add_(0, su.clamp(min=0), hit_i)
            free = s.pin[s.num_static :] == 0
            sized = isinstance(b.n_uniq, int)
            miss = ~hit
            if not sized:  # the padding (the scratch id) is never resident: not a miss
                miss &= torch.arange(b.uniq.numel(), device=self.device) < b.n_uniq
            sizes = [miss.sum(), free.sum(), b.bad.to(torch.int64)]
            if not isinstance(b.n_uniq, int):  # not sized
                sizes.append(b.n_uniq)
            n_miss, n_free, bad, *n_uniq = self.mover.read(torch.stack(sizes))
            if bad:  # the batch is dropped: the cache stays as it was, usable for other batches
                s.pin.index_add_(0, su.clamp(min=0), -hit_i)
                if b in self._queue:
                    self._queue.remove(b)
                self._raise_bad_id(b)
            if not sized:  # the padding added no pins (misses add 0)
                b.n_uniq, b.uniq, b.counts = n_uniq[0], b.uniq[: n_uniq[0]], b.counts[: n_uniq[0]]
                su, hit = su[: b.n_uniq], hit[: b.n_uniq]
            if n_miss:
                if n_miss > n_free:
                    s.pin.index_add_(0, su.clamp(min=0), -hit.to(torch.int32))
                    return False
                victims = self.policy.choose(n_miss, free)
                assert victims is not None  # given ``free``, with n_miss <= n_free
                miss_idx = torch.nonzero_static(~hit, size=n_miss).squeeze(1)
                self._evict_and_load(victims, b.uniq[miss_idx])
                s.pin_add(victims, 1)
                su.index_copy_(0, miss_idx, victims)
            b.pinned = su
            b.indices = su.index_select(0, b.inverse)
            b.prepared = True
            if b.train:
                self._mark_dirty(b)
            self.policy.observe(b.uniq, b.counts, su)
            if b.first_hits is None:
                b.first_hits = self._hit_sums(b, hit)
            b.event = self.mover.ready()
        b.signal(self.mover.streams)
        return True

    def _evict_and_load(self, victims: torch.Tensor, rows: torch.Tensor) -> None:
        """Write back the dirty ones among ``victims``, then fill them with (non-resident) ``rows``.

        Every victim is written, to the store's scratch row where it is clean or empty: the copy
        kernels then have sizes the host knows (no count of dirty victims to read).  In training
        nearly every victim is dirty (its rows were loaded by training batches)."""
        s = self.slots
        old = s.slot_row.index_select(0, victims)
        occupied = old >= 0
        wb = occupied & s.dirty.index_select(0, victims)
        self.mover.move(victims, torch.where(wb, old, self.store.scratch_row), victims, rows)
        s.assign(victims, rows)
        self.policy.admitted(victims, rows)
        self._counters.evicted(occupied, wb, rows.numel())

    def _hit_sums(self, b: WindowBatch, hit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Hits per table (accesses) and distinct rows hit of a deduplicated batch; ``hit``: its
        distinct rows resident before it was placed."""
        assert b.uniq is not None and b.counts is not None  # deduplicated
        table_hits = torch.zeros(len(self.tables), dtype=torch.int64, device=self.device)
        table_hits.index_add_(0, self._table_of(b.uniq), b.counts * hit)
        return table_hits, hit.sum()

    def _count_forwarded(
        self, b: WindowBatch, table_hits: torch.Tensor, distinct_hits: torch.Tensor | int
    ) -> None:
        """A forwarded batch's accesses, given what was resident when it was placed."""
        assert isinstance(b.n_uniq, int)  # known once placed
        self._counters.forwarded(b.num_ids, b.table_accesses, b.n_uniq, table_hits, distinct_hits)

    def _deduplicate(self, b: WindowBatch) -> None:
        """``uniq``, ``inverse`` and ``counts`` of a batch analysed per id (the overflow path's)."""
        if b.uniq is None:
            assert b.grow is not None  # analysed
            first, b.inverse, b.counts = self.slots.dedup(b.grow)
            b.uniq = b.grow.index_select(0, first)

    def _unprepare(self, b: WindowBatch) -> None:
        if b.prepared:
            b.ready.clear()
            assert b.pinned is not None  # prepared
            with self.mover.planning():
                self.slots.pin_add(b.pinned, -1)
            b.prepared, b.pinned, b.indices, b.event = False, None, None, None

    def _try_prepare(self) -> None:
        """Prepare queued batches in order while they fit (FIFO: a deferred one blocks later ones)."""
        if any(b.overflow is not None for b in self._inflight):
            return  # its rows are outside the cache until it retires
        for b in list(self._queue):
            if b.prepared:
                continue
            try:
                placed = self._prepare(b)
            except BaseException as e:  # raised by this batch's forward; later batches go on
                b.error = e
                b.signal(self.mover.streams)
                continue
            if not placed:
                if not b.deferred:
                    b.deferred = True
                    self._counters.add("deferred_batches", 1)
                return
