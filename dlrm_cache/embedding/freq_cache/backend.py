"""FreqCacheBackend: full tables in host memory, a frequency-aware row cache on the device.

Layout
    One fbgemm TBE on the device with a single table of ``num_slots`` rows that every feature maps
    onto (``feature_table_map = [0] * T``): a *global* slot pool.  Its size is the sum over tables of
    ``max(1, ceil(cache_ratio * rows_t))`` -- the same memory as per-table caches -- but capacity goes
    where the accesses are: a 3-row table does not get 1 slot it must thrash through every batch
    while a 10M-row table has spare ones.  Lookups and the fused optimizer (backward) run on slot
    ids, so a row's optimizer state lives next to its weight in the slot and travels with it.

    Static region: the ``static_fraction`` share of the slots holding the globally hottest rows.
    With dataset counts, that is the top rows by count over all tables; since rows are frequency
    ranks, each table's share is a prefix ``rank < static_rows[t]``, placed at slot
    ``static_offsets[t] + rank`` -- no lookup, never evicted.  Without counts (lfu/lru) each table
    gets ``static_fraction`` of its own share.  ``static_fraction=0`` gives a pure lfu/lru cache.

Step protocol (what the trainer does)
    ``prefetch(kjt)`` for each future batch (FIFO), then ``forward(kjt)`` for the oldest one, then
    its backward.  A prefetch dedupes the batch's ids, finds misses, evicts victims by policy (dirty
    ones written back), loads the misses, and keeps the remapped slot ids for that batch.  Every slot
    a prefetched batch uses is pinned (refcount) until that batch is *retired*.  A batch is retired at
    the next call of ``prefetch``, ``forward``, ``step_done``, ``flush``, ``export_tables`` or
    ``import_tables`` -- i.e. its backward must have been issued by then, which is what every
    training loop does (forward, backward, optimizer step, next batch).  ``forward`` without a prior
    prefetch (evaluation, ``lookahead=0``) prepares the batch synchronously.

    ``forward`` consumes the oldest prefetched batch when the given KJT is the same object, or has
    the same keys and number of ids (and, when both are on the CPU, equal ids and lengths) -- so the
    trainer may prefetch the host batch and run forward on its device copy.  Anything else is an
    ad-hoc batch (evaluation between training steps) and leaves the window alone unless it needs
    the space.

Overflow
    A batch whose rows do not fit next to the pinned window is *deferred* (the window shrinks; later
    prefetches queue up behind it) and prepared when earlier batches retire.  A batch that does not
    fit even in an empty dynamic region runs through a temporary TBE holding exactly its rows
    (copied from the slots or the host store, written back after its backward): slower, but correct.
    Both are counted in ``stats()``.

Dirty tracking
    A forward with autograd enabled marks the batch's slots dirty; only dirty rows are written back
    on eviction and by ``flush()``.  ``torch.no_grad()`` forwards (evaluation) never cause write-backs.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from typing import Any

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from ..base import EmbeddingBackend, SparseOptim, TableSpec, pooled, shared_dim
from ..tbe import make_tbe, momentum_view, weights_view
from .mover import Mover
from .policy import POLICIES, EvictionPolicy
from .slots import SlotTable
from .store import HostStore


@dataclasses.dataclass(eq=False)
class _Batch:
    """One batch between its prefetch and its retirement."""

    kjt: KeyedJaggedTensor
    values: np.ndarray  # ids (ranks), int64
    lengths: np.ndarray | None  # CPU lengths when the KJT was on the CPU (for matching)
    static: np.ndarray  # bool: id is in its table's static region
    slot_values: np.ndarray  # slot of every id (static ones filled at analysis)
    uniq: np.ndarray  # distinct global rows outside the static region
    inverse: np.ndarray  # position in uniq of every non-static id
    counts: np.ndarray  # accesses of each uniq row in this batch
    # statistics that do not depend on what is resident (computed once, in the loader thread)
    table_accesses: np.ndarray  # accesses per table
    static_table_hits: np.ndarray  # accesses per table served by the static region
    static_hits: int  # accesses to static rows
    static_slots: np.ndarray  # distinct static slots it uses
    dyn_pos: np.ndarray  # positions of the ids outside the static region

    @property
    def static_distinct(self) -> int:
        return int(self.static_slots.size)
    prepared: bool = False
    deferred: bool = False

    @property
    def table(self) -> np.ndarray:
        """Table index of every id (only the rare overflow path needs it per id)."""
        return np.repeat(np.arange(self.table_accesses.size), self.table_accesses)

    counted: bool = False
    pinned: np.ndarray | None = None  # dynamic slots pinned by this batch (= its uniq rows' slots)
    indices: torch.Tensor | None = None  # slot ids on the device
    event: Any = None  # CUDA event: its rows are in place
    train: bool = False
    overflow: dict | None = None


class FreqCacheBackend(EmbeddingBackend):
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
    ) -> None:
        super().__init__(tables, optim)
        # ---- validation: everything before a byte is allocated
        self.dim = shared_dim(tables, "freq_cache")
        if not (isinstance(cache_ratio, (int, float)) and 0 < cache_ratio <= 1):
            raise ValueError(f"embedding.cache_ratio={cache_ratio!r}: must be in (0, 1]")
        if policy not in POLICIES:
            raise ValueError(f"embedding.policy={policy!r}: choose one of {list(POLICIES)}")
        if not 0 <= static_fraction <= 1:
            raise ValueError(f"embedding.static_fraction={static_fraction!r}: must be in [0, 1]")
        if int(lookahead) != lookahead or lookahead < 0:
            raise ValueError(f"embedding.lookahead={lookahead!r}: must be an integer >= 0")
        if policy == "freq" and counts is None:
            raise ValueError(
                "embedding.policy='freq' ranks rows by their dataset access counts, but no counts "
                "were given (the trainer reads them from the dataset's stats/counts.parquet); use "
                "embedding.policy=lfu or lru without them"
            )
        flat_counts = None
        if counts is not None:
            parts = []
            for t in tables:
                if t.name not in counts or counts[t.name] is None:
                    raise ValueError(f"embedding counts: no per-row counts for table {t.name}")
                c = counts[t.name]
                c = c.detach().cpu().numpy() if isinstance(c, torch.Tensor) else np.asarray(c)
                if c.ndim != 1 or c.shape[0] != t.num_rows:
                    raise ValueError(
                        f"embedding counts for table {t.name}: {c.shape[0] if c.ndim == 1 else c.shape} "
                        f"entries but the table has {t.num_rows} rows (dataset stats and "
                        "manifest disagree: preprocess again)"
                    )
                if c.size and c.min() < 0:
                    raise ValueError(f"embedding counts for table {t.name}: negative counts")
                parts.append(c.astype(np.float64))
            flat_counts = np.concatenate(parts)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"embedding=freq_cache on device={self.device} but CUDA is not available; "
                "use device=cpu (the cache logic is the same) or embedding=host"
            )
        self.cache_ratio = float(cache_ratio)
        self.lookahead = int(lookahead)
        self.policy_name = policy

        rows = np.array([t.num_rows for t in tables], dtype=np.int64)
        cache_rows = np.maximum(1, np.ceil(self.cache_ratio * rows - 1e-9)).astype(np.int64)
        cache_rows = np.minimum(cache_rows, rows)
        num_slots = int(cache_rows.sum())
        num_static = int(math.floor(static_fraction * num_slots))
        if flat_counts is not None and policy == "freq" and num_static > 0:
            # The globally hottest rows; per table a prefix of ranks (counts follow rank order).
            top = np.argpartition(-flat_counts, num_static - 1)[:num_static]
            row_off = np.concatenate([[0], np.cumsum(rows)])
            static_rows = np.bincount(np.searchsorted(row_off, top, side="right") - 1, minlength=len(tables))
        else:
            static_rows = np.floor(static_fraction * cache_rows).astype(np.int64)
            num_static = int(static_rows.sum())
        self.cache_rows_per_table = cache_rows
        self.cache_bytes = num_slots * optim.row_bytes(self.dim)
        if self.device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(self.device)
            if self.cache_bytes > free:
                raise ValueError(
                    f"embedding.cache_ratio={cache_ratio}: the cache needs {self.cache_bytes / 2**30:.2f} GiB "
                    f"of GPU memory but {free / 2**30:.2f} GiB are free; lower embedding.cache_ratio"
                )

        # ---- allocation
        pin = torch.cuda.is_available()
        self.store = HostStore(self.tables, optim, self.dim, pin)
        self.row_offsets = self.store.row_offsets
        self.static_rows = static_rows.astype(np.int64)
        self.static_offsets = np.concatenate([[0], np.cumsum(self.static_rows)[:-1]]).astype(np.int64)
        self.slots = SlotTable(self.store.num_rows, num_slots, num_static)
        self.policy = EvictionPolicy(policy, self.slots, self.store.num_rows, flat_counts, refresh_counts)
        self._lr = optim.lr
        object.__setattr__(
            self, "tbe", make_tbe([num_slots], self.dim, optim, self.device, feature_table_map=[0] * len(tables))
        )
        cache_w = weights_view(self.tbe, self.dim)
        cache_m = momentum_view(self.tbe, optim, self.dim)
        self.mover = Mover(self.store, cache_w, cache_m, self.device)
        # Static region: table t's rows [0, static_rows[t]) at slots static_offsets[t] + rank.
        st_slots = np.arange(num_static, dtype=np.int64)
        st_table = np.repeat(np.arange(len(tables)), self.static_rows)
        st_rows = self.row_offsets[st_table] + (st_slots - self.static_offsets[st_table])
        self.slots.assign(st_slots, st_rows)
        self.mover.load(st_slots, st_rows)

        self._queue: deque[_Batch] = deque()  # prefetched, not yet forwarded (FIFO)
        self._inflight: list[_Batch] = []  # forwarded, backward not yet known to be done
        self._stats = self._zero_stats()

    # ------------------------------------------------------------------------------ public API
    def analyze(self, features: KeyedJaggedTensor) -> _Batch:
        """The cache-independent part of a prefetch; reads only state fixed at construction."""
        return self._analyze(features)

    def prefetch(self, features: KeyedJaggedTensor, analysis: _Batch | None = None) -> None:
        self._retire()
        if analysis is None or analysis.kjt is not features:
            analysis = self._analyze(features)
        self._queue.append(analysis)
        self._try_prepare()

    def step_done(self) -> None:
        """The last forwarded batch's backward has been issued (optional: any later call implies it)."""
        self._retire()

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        self._retire()
        t0 = time.perf_counter()
        if self._queue and self._matches(self._queue[0], features):
            batch = self._queue.popleft()
        else:
            batch = self._analyze(features)
        if not batch.prepared and not self._prepare(batch):
            # Give the window's space back (those batches are prepared again later), then retry.
            for b in self._queue:
                self._unprepare(b)
            if not self._prepare(batch):
                out = self._forward_overflow(batch, features)
                self._stats["stall_s"] += time.perf_counter() - t0
                return pooled(features, out, self.dim)
        self._stats["stall_s"] += time.perf_counter() - t0
        batch.train = torch.is_grad_enabled()
        if batch.train:
            self.slots.dirty[batch.static_slots] = True
            self.slots.dirty[batch.pinned] = True
        self.mover.wait_ready(batch.event, batch.indices)
        offsets = features.offsets().to(self.device, dtype=torch.int64, non_blocking=True)
        out = self.tbe(batch.indices, offsets)
        batch.indices, batch.event = None, None
        self._inflight.append(batch)
        self._try_prepare()  # batches deferred for lack of space
        return pooled(features, out, self.dim)

    def set_learning_rate(self, lr: float) -> None:
        self._lr = float(lr)
        self.tbe.set_learning_rate(lr)

    @torch.no_grad()
    def flush(self) -> None:
        self._retire()
        self.mover.sync()
        slots = np.flatnonzero(self.slots.dirty)
        if slots.size:
            rows = self.slots.slot_row[slots]
            w, m = self.mover.read_slots(slots)
            r = torch.from_numpy(rows)
            self.store.weight.index_copy_(0, r, w)
            if m is not None:
                self.store.momentum.index_copy_(0, r, m)
            self.slots.dirty[slots] = False
            self._stats["rows_written_back"] += slots.size

    def export_tables(self) -> dict[str, torch.Tensor]:
        self.flush()
        return self.store.export()

    @torch.no_grad()
    def import_tables(self, state: dict[str, torch.Tensor]) -> None:
        self._retire()
        self.mover.sync()
        self.store.load(state)
        slots, rows = self.slots.resident()
        if slots.size:
            r = torch.from_numpy(rows)
            m = None if self.store.momentum is None else self.store.momentum.index_select(0, r)
            self.mover.write_slots(slots, self.store.weight.index_select(0, r), m)
        self.slots.dirty[:] = False

    def stats(self) -> dict[str, float]:
        s = self._stats
        out: dict[str, float] = {}
        acc, dist = s["accesses"], s["distinct"]
        out["hit_rate"] = float(s["hits"] / acc) if acc else 0.0
        out["hit_rate_distinct"] = float(s["distinct_hits"] / dist) if dist else 0.0
        for i, t in enumerate(self.tables):
            a = s["table_accesses"][i]
            out[f"hit_rate/{t.name}"] = float(s["table_hits"][i] / a) if a else 0.0
        out["accesses"] = float(acc)
        out["distinct_ids"] = float(dist)
        rb = self.optim.row_bytes(self.dim)
        out["rows_loaded"] = float(s["rows_loaded"])
        out["bytes_loaded"] = float(s["rows_loaded"] * rb)
        out["rows_written_back"] = float(s["rows_written_back"])
        out["bytes_written_back"] = float(s["rows_written_back"] * rb)
        out["evictions"] = float(s["evictions"])
        out["stall_s"] = float(s["stall_s"])
        out["writeback_wait_s"] = float(self.mover.wait_s)
        out["overflow_batches"] = float(s["overflow_batches"])
        out["deferred_batches"] = float(s["deferred_batches"])
        out["cache_bytes"] = float(self.cache_bytes)
        out["cache_rows"] = float(self.slots.num_slots)
        out["static_rows"] = float(self.slots.num_static)
        self._stats = self._zero_stats()
        self.mover.wait_s = 0.0
        return out

    # ------------------------------------------------------------------------------ internals
    def _zero_stats(self) -> dict[str, Any]:
        T = len(self.tables)
        return dict(
            accesses=0, hits=0, distinct=0, distinct_hits=0,
            table_accesses=np.zeros(T, dtype=np.int64), table_hits=np.zeros(T, dtype=np.float64),
            rows_loaded=0, rows_written_back=0, evictions=0, stall_s=0.0,
            overflow_batches=0, deferred_batches=0,
        )  # fmt: skip

    def _analyze(self, kjt: KeyedJaggedTensor) -> _Batch:
        """Everything about a batch that does not depend on what is resident.

        KJT values are feature-major, so each table's ids are one contiguous slice: the work is a
        few vectorized operations per table, with no per-id table lookups.
        """
        keys = kjt.keys()
        if list(keys) != self.feature_names:
            raise ValueError(f"freq_cache: batch features {list(keys)} != tables {self.feature_names}")
        vals_t = kjt.values()
        on_cpu = vals_t.device.type == "cpu"
        values = vals_t.detach().cpu().numpy().astype(np.int64, copy=False)
        lpk = np.asarray(kjt.length_per_key(), dtype=np.int64)
        bounds = np.concatenate([[0], np.cumsum(lpk)])
        T = len(self.tables)
        static = np.empty(values.size, dtype=bool)
        slot_values = np.empty(values.size, dtype=np.int64)
        grow_parts, static_table_hits = [], np.zeros(T, dtype=np.int64)
        for t in range(T):
            lo, hi = bounds[t], bounds[t + 1]
            if lo == hi:
                continue
            v = values[lo:hi]
            rows = self.row_offsets[t + 1] - self.row_offsets[t]
            vmin, vmax = v.min(), v.max()
            if vmin < 0 or vmax >= rows:
                bad = int(vmin if vmin < 0 else vmax)
                raise IndexError(
                    f"freq_cache: id {bad} out of range for table {self.feature_names[t]} ({rows} rows)"
                )
            st = v < self.static_rows[t]
            static[lo:hi] = st
            slot_values[lo:hi] = v + self.static_offsets[t]  # only the static entries are kept
            static_table_hits[t] = np.count_nonzero(st)
            grow_parts.append(v[~st] + self.row_offsets[t])
        grow = np.concatenate(grow_parts) if grow_parts else np.zeros(0, dtype=np.int64)
        uniq, inverse, counts = np.unique(grow, return_inverse=True, return_counts=True)
        lengths = kjt.lengths().numpy() if on_cpu else None
        static_slots = slot_values[static]
        return _Batch(
            kjt, values, lengths, static, slot_values, uniq, inverse.reshape(-1), counts,
            table_accesses=lpk,
            static_table_hits=static_table_hits,
            static_hits=int(static_slots.size),
            static_slots=np.flatnonzero(np.bincount(static_slots, minlength=1)),
            dyn_pos=np.flatnonzero(~static),
        )

    @staticmethod
    def _matches(b: _Batch, kjt: KeyedJaggedTensor) -> bool:
        if b.kjt is kjt:
            return True
        v = kjt.values()
        if v.numel() != b.values.size or list(kjt.keys()) != list(b.kjt.keys()):
            return False
        if v.device.type == "cpu" and b.lengths is not None:
            return np.array_equal(v.numpy(), b.values) and np.array_equal(kjt.lengths().numpy(), b.lengths)
        # A device copy: compare ids per feature (cached by KeyedJaggedTensor.to, so no sync).
        return list(kjt.length_per_key()) == list(b.kjt.length_per_key())

    def cancel_prefetch(self) -> None:
        """Forget prefetched batches that will not be forwarded (e.g. a loop left early)."""
        for b in self._queue:
            self._unprepare(b)
        self._queue.clear()

    def _prepare(self, b: _Batch) -> bool:
        """Make ``b``'s rows resident and pin them; False (nothing changed) when they do not fit."""
        s = self.slots
        su = s.row_slot[b.uniq].astype(np.int64)
        hit = su >= 0
        hit_slots = su[hit]
        miss_rows = b.uniq[~hit]
        s.pin[hit_slots] += 1
        if miss_rows.size:
            victims = self.policy.choose(miss_rows.size)
            if victims is None:
                s.pin[hit_slots] -= 1
                return False
            self._evict_and_load(victims, miss_rows)
            s.pin[victims] += 1
            su[~hit] = victims
        else:
            self.mover.begin()
        b.pinned = su
        b.slot_values[b.dyn_pos] = su[b.inverse]
        b.indices = self.mover.to_device(b.slot_values)
        b.event = self.mover.mark_ready()
        b.prepared = True
        self.policy.observe(b.uniq, b.counts, su)
        if not b.counted:
            b.counted = True
            self._count_hits(b, hit)
        return True

    def _evict_and_load(self, victims: np.ndarray, rows: np.ndarray) -> None:
        """Write back the dirty ones among ``victims``, then fill them with (non-resident) ``rows``."""
        s = self.slots
        self.mover.begin()
        old = s.slot_row[victims]
        occupied = old >= 0
        dirty = occupied & s.dirty[victims]
        self.mover.write_back(victims[dirty], old[dirty])
        s.release(victims)
        self.mover.load(victims, rows)
        s.assign(victims, rows)
        self.policy.admitted(victims, rows)
        st = self._stats
        st["evictions"] += int(occupied.sum())
        st["rows_written_back"] += int(dirty.sum())
        st["rows_loaded"] += int(rows.size)

    def _count_hits(self, b: _Batch, hit: np.ndarray) -> None:
        st = self._stats
        st["accesses"] += b.values.size
        st["hits"] += b.static_hits + int(b.counts[hit].sum())
        st["distinct"] += b.static_distinct + b.uniq.size
        st["distinct_hits"] += b.static_distinct + int(hit.sum())
        st["table_accesses"] += b.table_accesses
        hit_table = np.searchsorted(self.row_offsets, b.uniq[hit], side="right") - 1
        st["table_hits"] += b.static_table_hits
        st["table_hits"] += np.bincount(hit_table, weights=b.counts[hit], minlength=len(self.tables))

    def _unprepare(self, b: _Batch) -> None:
        if b.prepared:
            self.slots.pin[b.pinned] -= 1
            b.prepared, b.pinned, b.indices, b.event = False, None, None, None

    def _try_prepare(self) -> None:
        """Prepare queued batches in order while they fit (FIFO: a deferred one blocks later ones)."""
        if any(b.overflow is not None for b in self._inflight):
            return  # its rows are outside the cache until it retires
        for b in self._queue:
            if b.prepared:
                continue
            if not self._prepare(b):
                if not b.deferred:
                    b.deferred = True
                    self._stats["deferred_batches"] += 1
                return

    def _retire(self) -> None:
        for b in self._inflight:
            if b.overflow is not None:
                self._retire_overflow(b)
            else:
                self.slots.pin[b.pinned] -= 1
        self._inflight.clear()

    # ---- a batch larger than the dynamic region: a temporary TBE holding exactly its rows
    def _forward_overflow(self, b: _Batch, features: KeyedJaggedTensor) -> torch.Tensor:
        self._stats["overflow_batches"] += 1
        grow = b.values + self.row_offsets[b.table]
        rows, inverse = np.unique(grow, return_inverse=True)
        resident_access = self.slots.row_slot[grow] >= 0  # for the hit rate, before admissions
        # Still admit what fits (the best of the misses by policy), so that a cache too small for
        # its batches keeps serving the hot rows instead of staying empty.  Nothing is pinned now
        # (the window was released), and nothing else is prepared until this batch retires.
        su = self.slots.row_slot[b.uniq].astype(np.int64)
        misses = b.uniq[su < 0]
        k = min(misses.size, self.slots.num_dynamic)
        if k:
            admit = self.policy.admit_first(misses, k)
            victims = self.policy.choose(k)
            self._evict_and_load(victims, admit)
        self.policy.observe(b.uniq, b.counts, self.slots.row_slot[b.uniq].astype(np.int64))
        self.mover.sync()
        slots = self.slots.row_slot[rows].astype(np.int64)
        res = slots >= 0
        self._count_hits_overflow(b, rows, resident_access, grow)
        optim = dataclasses.replace(self.optim, lr=self._lr)
        tmp = make_tbe([rows.size], self.dim, optim, self.device, feature_table_map=[0] * len(self.tables))
        tw = weights_view(tmp, self.dim)
        tm = momentum_view(tmp, optim, self.dim)
        w_res, m_res = self.mover.read_slots(slots[res])
        r_host = torch.from_numpy(rows[~res])
        with torch.no_grad():
            w = torch.empty((rows.size, self.dim), dtype=torch.float32)
            w[torch.from_numpy(res)] = w_res
            w[torch.from_numpy(~res)] = self.store.weight.index_select(0, r_host)
            tw.copy_(w)
            if tm is not None:
                m = torch.empty(tuple(tm.shape), dtype=torch.float32)
                m[torch.from_numpy(res)] = m_res
                m[torch.from_numpy(~res)] = self.store.momentum.index_select(0, r_host)
                tm.copy_(m)
        self._stats["rows_loaded"] += int((~res).sum())
        b.train = torch.is_grad_enabled()
        b.overflow = dict(tbe=tmp, rows=rows, slots=slots, res=res, optim=optim)
        idx = torch.from_numpy(inverse.reshape(-1).astype(np.int64)).to(self.device)
        offsets = features.offsets().to(self.device, dtype=torch.int64)
        out = tmp(idx, offsets)
        self._inflight.append(b)
        return out

    def _count_hits_overflow(self, b: _Batch, rows: np.ndarray, resident_access: np.ndarray, grow: np.ndarray) -> None:
        st = self._stats
        T = len(self.tables)
        st["accesses"] += grow.size
        st["hits"] += int(resident_access.sum())
        st["distinct"] += rows.size
        st["distinct_hits"] += np.unique(grow[resident_access]).size
        st["table_accesses"] += np.bincount(b.table, minlength=T)
        st["table_hits"] += np.bincount(b.table[resident_access], minlength=T)

    @torch.no_grad()
    def _retire_overflow(self, b: _Batch) -> None:
        o, b.overflow = b.overflow, None
        if not b.train:
            return
        tw = weights_view(o["tbe"], self.dim).cpu()
        tm = momentum_view(o["tbe"], o["optim"], self.dim)
        tm = None if tm is None else tm.cpu()
        res, slots, rows = o["res"], o["slots"], o["rows"]
        res_t, host_t = torch.from_numpy(res), torch.from_numpy(~res)
        if res.any():
            self.mover.write_slots(slots[res], tw[res_t], None if tm is None else tm[res_t])
            self.slots.dirty[slots[res]] = True
        if (~res).any():
            r = torch.from_numpy(rows[~res])
            self.store.weight.index_copy_(0, r, tw[host_t])
            if tm is not None:
                self.store.momentum.index_copy_(0, r, tm[host_t])
            self._stats["rows_written_back"] += int((~res).sum())
