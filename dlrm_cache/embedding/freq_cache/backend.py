"""FreqCacheBackend: full tables in host memory, a frequency-aware row cache on the device.

Layout
    One fbgemm TBE on the device with a single table of slots that every feature maps onto
    (``feature_table_map = [0] * T``): a *global* slot pool, its usable size the sum over tables
    of ``max(1, ceil(cache_ratio * rows_t))`` -- the same memory as per-table caches -- plus the
    slots ``cache_layout`` (layout.py) adds when the look-ahead window needs more; capacity goes
    where the accesses are.  Lookups and the fused optimizer (backward) run on slot ids, so a row's
    optimizer state lives next to its weight in the slot and travels with it.

    Static region: the ``static_fraction`` share of the slots holding the globally hottest rows.
    With dataset counts, that is the top rows by count over all tables; since rows are frequency
    ranks, each table's share is a prefix ``rank < static_rows[t]``, placed at its static slot by
    a rank compare -- no lookup, never evicted.  Without counts (lfu/lru) each table gets
    ``static_fraction`` of its own share.  ``static_fraction=0`` gives a pure lfu/lru cache.

    Window (dynamic) region: a set-associative map on the device (sets.py), filled at start-up
    with the next hottest rows, evicting by the policy (scores.py).

Where the work runs
    The cache plans on the device: per round of one or two batches a fixed number of torch ops on
    its *plan* stream decide hits, misses and victims and produce the lookup indices (plan.py);
    the host reads back how many rows to move and which, gathers them from the host store, and the
    copy stream loads them and writes the victims back (transfer.py).  The planner thread
    (planner.py; inline on a CPU device) runs those rounds (window.py) beside the step; the
    training thread only posts tasks and waits, on the GPU, for its batch's "rows ready" event.

Step protocol (what the trainer does)
    ``prefetch(kjt, copied)`` for each future batch (FIFO; ``copied``: the event after which its
    ids are on the device), then ``forward(kjt)`` for the oldest one, then its backward.  A
    round's slots are pinned until all of its batches are *retired*, at the next call of
    ``prefetch``, ``forward``, ``step_done``, ``flush``, ``export_tables`` or ``import_tables``
    after their forward -- i.e. their backward must have been issued by then, which is what
    every training loop does.  ``forward`` waits until its batch is placed (normally long done);
    a batch without a prior prefetch (an ad-hoc batch) is placed then.

    ``forward`` consumes a prefetched batch by the FIFO protocol of ``EmbeddingBackend``: under grad
    the oldest, under no_grad the oldest prefetched under no_grad (evaluation batches queue behind
    the training window).

Overflow
    A round whose misses do not fit beside the live rounds' pins is *deferred* (later prefetches
    queue up behind it) and placed when earlier batches retire.  A batch that does not fit even
    with nothing else placed runs through a temporary TBE holding exactly its rows (overflow.py):
    slower, but correct.  Both are counted in ``stats()``.

Write-backs
    Once a training batch has been placed, every row evicted goes back to the host store (a way
    loaded by evaluation only is written back too: it holds what the store holds); before that
    (evaluation, predict) nothing is written back.  ``flush`` writes back what is resident.
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
from .batch import WindowBatch
from .counters import Counters
from .layout import cache_layout, round_batches
from .overflow import OverflowPath
from .plan import RoundPlanner, TableParams
from .planner import Planner
from .scores import EvictionScores
from .sets import Geometry, SetMap, warm_rows
from .settings import check_settings, flatten_counts
from .store import HostStore
from .threads import HostThreads
from .transfer import Transfers
from .window import Window

log = logging.getLogger(__name__)


def resolve_planner_threads(threads: int, device: torch.device) -> int:
    """``embedding.planner_threads``; 0: 1 on a CPU device (its step already uses every core),
    else up to 4 (the host's row gathers and scatters are memory-bound)."""
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
        lookahead: int = 3,
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
        self.geometry = Geometry.for_rows(self.layout.window_rows)
        self.slot_bytes = optim.row_bytes(self.dim)  # a slot's device bytes: row + optimizer state
        num_static = self.layout.num_static
        self.tbe_rows = self.geometry.dynamic_slots + num_static
        self._check_device_memory(self.tbe_rows * self.slot_bytes)

        # ---- allocation
        if self.device.type == "cuda" and self.device.index is None:  # the threads' device
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.planner_threads = resolve_planner_threads(planner_threads, self.device)
        host = HostThreads(self.planner_threads)
        self.store = HostStore(self.tables, optim, self.dim, host)
        self._lr = optim.lr
        tbe = make_tbe(
            [self.tbe_rows], self.dim, optim, self.device, feature_table_map=[0] * len(tables)
        )
        object.__setattr__(self, "tbe", tbe)
        self.transfers = Transfers(
            self.store,
            weights_view(tbe, self.dim),
            momentum_view(tbe, optim, self.dim),
            self.device,
        )
        self.streams = self.transfers.streams
        sets = SetMap(self.geometry, self.store.scratch_row, self.device)
        scores = EvictionScores(policy, refresh_counts, flat_counts, self.device)
        row_off = self.store.row_offsets
        static_at = self.geometry.dynamic_slots + self.layout.static_offsets
        params = TableParams(
            self.feature_names, row_off, self.layout.static_rows, static_at, self.device
        )
        self.planner = RoundPlanner(sets, scores, params, self.streams)
        self.counters = Counters(self.feature_names, self.slot_bytes)
        self._overflow = OverflowPath(
            self.planner, self.transfers, self.counters, optim, self.dim, self.device
        )
        static = _static_region(row_off, self.layout.static_rows, static_at)
        self._window = Window(
            self.planner,
            self.transfers,
            self._overflow,
            self.counters,
            self.store,
            static,
            round_batches(self.lookahead),
        )
        self._warm_fill(sets, scores, row_off, flat_counts)
        self.transfers.upload(*np.concatenate([np.stack(sets.resident()), np.stack(static)], 1))

        self._fifo: deque[WindowBatch] = deque()  # training thread: prefetched, not forwarded
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
                "freq_cache: cache_ratio=%g gives %s window slots, but the look-ahead (%d) with "
                "batches of %d samples pins ~%s distinct rows at once: window region sized to %s "
                "rows (+%s slots, +%.1f MiB)",
                self.cache_ratio,
                f"{int(layout.ratio_rows.sum()) - layout.num_static:,}",
                self.lookahead,
                batch_size,
                f"{layout.window_needed:,}",
                f"{layout.window_rows:,}",
                f"{layout.added_rows:,}",
                layout.added_rows * self.optim.row_bytes(self.dim) / 2**20,
            )
        return layout

    def _warm_fill(
        self, sets: SetMap, scores: EvictionScores, row_off: np.ndarray, counts: np.ndarray | None
    ) -> None:
        """The dynamic region starts full: the next hottest rows after the static region, each in
        its own set.  Rows are frequency ranks: the dataset's counts, where given, order rows of
        different tables; without them, their ranks do."""
        want = 2 * self.geometry.window_rows + 1024  # room for sets that fill up first
        per_table = [
            np.arange(s, min(n, s + want))
            for s, n in zip(self.layout.static_rows, np.diff(row_off))
        ]
        ranks = np.concatenate(per_table).astype(np.int64)
        rows = np.concatenate([off + r for off, r in zip(row_off[:-1], per_table)]).astype(np.int64)
        priority = 1.0 / (1.0 + ranks) if counts is None else counts[rows]
        best = np.argsort(-priority, kind="stable")[:want]
        rows = rows[best]
        slots, placed, score = warm_rows(self.geometry, rows, scores.initial(rows, counts))
        sets.fill(slots, placed, score)

    def _check_device_memory(self, nbytes: int) -> None:
        if self.device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(self.device)
            if nbytes > free:
                raise ValueError(
                    f"embedding.cache_ratio={self.cache_ratio}: the cache needs "
                    f"{nbytes / 2**30:.2f} GiB of GPU memory but {free / 2**30:.2f} GiB "
                    "are free; lower embedding.cache_ratio"
                )

    @classmethod
    def host_bytes_per_row(cls, device: torch.device, settings: dict[str, Any]) -> int:
        """Host bytes per table row besides the store's record: the dataset counts flattened
        (float64) and their buckets (int64) for ``freq``, while the cache is built."""
        return 16 if settings.get("policy", "freq") == "freq" else 0

    # -- the training thread's side: post to the planner (which, inline on a CPU, runs the task) --
    def prefetch(self, features: KeyedJaggedTensor, copied: Any = None) -> None:
        self._retire()
        b = WindowBatch(features, torch.is_grad_enabled(), self._copied(features, copied))
        self._planner.post(self._window.prefetch, b)
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
            b = WindowBatch(features, train, self._copied(features, None))
            self._planner.post(self._window.prefetch, b)
        self._planner.post(self._window.demand, b, train)
        b.wait(self.streams, self._planner)
        stall = time.perf_counter() - t0
        self._unretired = True  # from here on, the batch is in flight (or failed)
        if b.error is not None:
            raise b.error
        if b.needs_overflow:
            self._planner.call(self._window.add_stall, stall)  # the planner is idle from here on
            out = self._overflow.forward(b, features, self._lr)
            self._planner.call(self._window.forwarded, b, 0.0)
            return pooled(features, out, self.dim)
        assert b.lookup is not None and b.round is not None  # placed
        self.transfers.wait_ready(b.round.event, b.lookup)
        offsets = features.offsets()
        if offsets.device != self.device:  # a host batch forwarded as it is
            offsets = offsets.to(self.device, non_blocking=True)
        offsets = offsets.to(dtype=b.lookup.dtype)
        out = self.tbe(b.lookup, offsets)
        self._planner.post(self._window.forwarded, b, stall)
        return pooled(features, out, self.dim)

    def _copied(self, features: KeyedJaggedTensor, copied: Any) -> Any:
        """The event after which ``features``' ids are on the device: the pipeline's copy event;
        for a batch made elsewhere, one after the compute stream's work so far (None on a CPU)."""
        if copied is not None or not self.streams.asynchronous:
            return copied
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
        """Counters since the last ``reset_stats`` (nothing changes)."""
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
        """The cache's regions: usable rows and the device bytes they take (the window's padding
        ways, its map and the policy's segments included)."""
        static, window = self.layout.num_static, self.layout.window_rows
        static_bytes = static * self.slot_bytes
        window_bytes = (
            self.geometry.dynamic_slots * self.slot_bytes
            + self.planner.sets.bytes()
            + self.planner.scores.segment_bytes()
        )
        return {
            "cache_bytes": float(static_bytes + window_bytes),
            "cache_rows": float(static + window),
            "static_rows": float(static),
            "static_bytes": float(static_bytes),
            "window_rows": float(window),
            "window_bytes": float(window_bytes),
            "window_needed_rows": float(self.layout.window_needed),
        }


def _static_region(
    row_off: np.ndarray, static_rows: np.ndarray, static_at: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(slots, rows) of the static region: table ``t``'s ranks ``[0, static_rows[t])``."""
    ranks = [np.arange(n, dtype=np.int64) for n in static_rows]
    slots = np.concatenate([at + r for at, r in zip(static_at, ranks)] or [np.zeros(0, np.int64)])
    rows = np.concatenate([off + r for off, r in zip(row_off, ranks)] or [np.zeros(0, np.int64)])
    return slots.astype(np.int64), rows.astype(np.int64)
