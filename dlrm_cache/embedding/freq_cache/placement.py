"""Placing a batch, on the host: its ids' slots, its misses, their victims, its pins and its copies.

The input pipeline holds every batch in host memory before the device does, so the cache plans on
the host (as look-ahead caches do: cDLRM, ScratchPipe), against host bookkeeping (slots.py), and
sends the device only what it must do (transfer.py).  Per batch, in O(ids) host work:

* ``analyze`` (cache-independent; the loader thread runs it on a GPU): each id's global row, the
  range check, and the static region's slots, which follow from the ids' ranks.
* ``prepare`` (the planner thread): one gather of the other ids' slots from the row map; their
  misses, deduplicated through a scratch array; victims from the eviction policy (O(victims));
  pins per id (a pinned slot is never a victim until its batch retires); dirty bits; hit
  statistics; then the batch's copies (transfer.py) -- host-to-device rows into the victims,
  dirty victims written back, the lookup indices -- on the copy stream.
* ``release``: a retired (or unprepared) batch's pins.

Nothing here reads the device: a placement's sizes are host numbers, so the planner never waits
for a kernel, and the training thread only waits for the batch's "rows ready" event on the GPU.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from .batch import Analysis, WindowBatch, id_tables, uniform_length
from .counters import Counters
from .layout import CacheLayout
from .policy import EvictionPolicy
from .slots import SlotTable
from .store import HostStore
from .transfer import Transfers


class Placer:
    def __init__(
        self,
        table_names: list[str],
        table_rows: np.ndarray,
        layout: CacheLayout,
        slots: SlotTable,
        policy: EvictionPolicy,
        store: HostStore,
        transfers: Transfers,
    ) -> None:
        self.table_names = table_names
        self.rows = table_rows
        self.row_off = store.row_offsets
        self.static_rows = layout.static_rows
        self.static_off = layout.static_offsets
        self.slots = slots
        self.policy = policy
        self.store = store
        self.transfers = transfers
        self.streams = transfers.streams
        # observed accesses as a torch view (index_add_: numpy's add.at is several times slower)
        self._observed = None if store.observed is None else torch.from_numpy(store.observed)
        self.counters = Counters(len(table_names))
        # seconds in each part of ``prepare`` (the planning bench's breakdown; never reset)
        self.phase_s: defaultdict[str, float] = defaultdict(float)
        self._cols: dict[np.dtype, tuple[np.ndarray, np.ndarray]] = {}
        # a placement that failed part-way: the host bookkeeping no longer matches the slots
        self.broken: BaseException | None = None

    # -- analysis (no cache state: any thread) ---------------------------------------------
    def analyze(self, kjt: KeyedJaggedTensor, values: np.ndarray) -> Analysis:
        """``kjt``'s ids (``values``, on the host): the range check, the static ids' slots, the
        other ids' global rows, and the batch's number of distinct rows."""
        if list(kjt.keys()) != self.table_names:
            raise ValueError(
                f"freq_cache: batch features {list(kjt.keys())} != tables {self.table_names}"
            )
        lpk = np.asarray(kjt.length_per_key(), dtype=np.int64)
        per = uniform_length(lpk)
        if per and values.size == per * len(lpk):  # one length per table: [tables, 1] columns
            ids = values.reshape(len(lpk), per)
            bad = bool((ids.min(axis=1) < 0).any() or (ids.max(axis=1) >= self.rows).any())
            table: np.ndarray | slice = slice(None)
            column = self._columns(values.dtype)
        else:
            ids, table = values, id_tables(lpk)
            bad = bool(((ids < 0) | (ids >= self.rows[table])).any())
            rows_col, off_col = self._columns(values.dtype)
            column = (rows_col[:, 0], off_col[:, 0])
        if bad:  # refused at its prefetch: nothing else is needed
            return Analysis(kjt, values, lpk, _EMPTY, _EMPTY, _EMPTY, True, 0, None)
        static_rows, static_off = (c[table] for c in column)
        static = ids < static_rows
        # the lookup indices go straight into the staging buffer their copy reads
        with self.streams.on_host():
            staged = self.streams.pinned((values.size,), torch.from_numpy(values[:0]).dtype)
        lookup = staged.numpy()
        np.add(ids, static_off, out=lookup.reshape(ids.shape))
        np.copyto(lookup, -1, where=~static.reshape(-1))
        dynamic = np.flatnonzero(lookup < 0)
        owner = dynamic // per if per else table[dynamic]  # type: ignore[index]
        rows = values[dynamic] + self.row_off[owner]
        # distinct rows: static slots marked in a flag array (-1, the others, marks the spare last
        # entry), the others counted from a sort (fewer than a tenth of the ids, at Criteo sizes)
        seen = np.zeros(self.slots.num_static + 1, dtype=bool)
        seen[lookup] = True
        distinct = int(np.count_nonzero(seen[:-1])) + _count_distinct(rows)
        return Analysis(kjt, values, lpk, rows, lookup, dynamic, False, distinct, staged)

    def _columns(self, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Per table, as ``[tables, 1]`` columns of the ids' dtype: its static rows, and the
        static slot of its rank 0 (the ids' own arithmetic, no upcast of a batch)."""
        if dtype not in self._cols:
            self._cols[dtype] = (
                self.static_rows[:, None].astype(dtype),
                self.static_off[:, None].astype(dtype),
            )
        return self._cols[dtype]

    def bad_id_error(self, a: Analysis) -> IndexError:
        """The error naming the first out-of-range id of a batch ``analyze`` found ``bad``."""
        values, table = a.values, id_tables(a.table_accesses)
        limit = self.rows[table]
        i = int(np.flatnonzero((values < 0) | (values >= limit))[0])
        return IndexError(
            f"freq_cache: id {int(values[i])} out of range for table "
            f"{self.table_names[table[i]]} ({int(limit[i])} rows)"
        )

    # -- placement (the planner thread) ----------------------------------------------------
    def prepare(self, b: WindowBatch) -> bool:
        """Make ``b``'s rows resident, pin them and issue its copies; False (nothing changed) when
        its missing rows do not fit beside the pinned window."""
        t0 = time.perf_counter()
        self.transfers.write_backs.settle(keep=2)
        t1 = time.perf_counter()
        try:
            with self.streams.on_host():
                plan = self._plan(b)
            t2 = time.perf_counter()
            if plan is not None:
                b.indices, b.event = self.transfers.place(*plan)
        except BaseException as e:  # the bookkeeping may be half changed: nothing goes on
            self.broken = e
            raise
        self.phase_s["settle"] += t1 - t0
        self.phase_s["plan"] += t2 - t1
        self.phase_s["place"] += time.perf_counter() - t2
        return plan is not None

    def _plan(self, b: WindowBatch) -> _Placed | None:
        """The host half of ``prepare``: the bookkeeping, and what ``Transfers.place`` moves."""
        a, s = b.analysis, self.slots
        assert a is not None and not a.bad  # analysed; a refused batch is never placed
        rows = a.rows
        sd = s.row_slot[rows]
        miss = np.flatnonzero(sd < 0)  # not resident (in the host store, or being written back)
        hits = sd[sd >= 0]
        s.pin_add(hits, 1)  # this batch's resident rows are no victims
        first, inverse = s.dedup_rows(rows[miss])
        loads = rows[miss[first]]
        sources = s.row_slot[loads]  # -1: in the host store; below: being written back
        if (sources < -1).any():  # those last: the others are gathered in one piece
            order = np.argsort(sources < -1, kind="stable")
            loads, sources = loads[order], sources[order]
            inverse = np.argsort(order)[inverse]
        t = time.perf_counter()
        victims = self.policy.choose(len(loads))
        self.phase_s["victims"] += time.perf_counter() - t
        if victims is None:
            s.pin_add(hits, -1)
            return None
        wb_slots, wb_rows = self.admit(victims, loads)
        s.dirty[victims[sources < -1]] = True  # newer than the host store until written back
        sd[miss] = victims[inverse]
        s.pin_add(sd[miss], 1)
        assert a.staged is not None  # analysed and not bad
        if a.sent:  # placed before (and given back): its copy may still read the buffer
            fresh = self.streams.pinned(tuple(a.staged.shape), a.staged.dtype)
            fresh.copy_(a.staged)
            a.staged, a.lookup = fresh, fresh.numpy()
        a.lookup[a.dynamic] = sd
        a.sent = True
        if b.first_hits is None:  # what was resident at the first placement: counted at forward
            b.first_hits = self._hits(a, miss, len(loads))
        self.used(rows, sd)
        b.pinned, b.prepared = sd, True
        if b.train:
            self.mark_dirty(b)
        return victims, loads, sources, wb_slots, wb_rows, a.staged

    def admit(self, victims: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``rows`` (not resident) take the ``victims`` slots, for the slot table, the policy and
        the counters; the dirty rows evicted, with their slots, are to be written back."""
        wb_slots, wb_rows, evicted = self.slots.assign(victims, rows)
        self.policy.admitted(victims, rows)
        self.counters.add("evictions", evicted)
        self.counters.add("rows_written_back", len(wb_rows))
        self.counters.add("rows_loaded", len(rows))
        return wb_slots, wb_rows

    def release(self, b: WindowBatch) -> None:
        """``b`` no longer holds its slots (retired, or unprepared to make room)."""
        assert b.pinned is not None  # prepared
        with self.streams.on_host():
            self.slots.pin_add(b.pinned, -1)
        b.prepared, b.pinned = False, None

    def mark_dirty(self, b: WindowBatch) -> None:
        """``b``'s slots will be updated by its step (its static rows: the static region)."""
        assert b.pinned is not None  # prepared
        self.slots.dirty[b.pinned] = True
        self.slots.static_dirty = True

    def count_forwarded(self, b: WindowBatch) -> None:
        assert b.analysis is not None and b.first_hits is not None  # placed
        table_hits, distinct, distinct_hits = b.first_hits
        self.counters.forwarded(b.analysis.table_accesses, table_hits, distinct, distinct_hits)

    def _hits(self, a: Analysis, miss: np.ndarray, loads: int) -> tuple[np.ndarray, int, int]:
        """Hits per table, distinct rows and distinct rows hit of a batch whose dynamic ids at
        ``miss`` were not resident (``loads`` distinct rows)."""
        missed = np.bincount(
            tables_of(a.dynamic[miss], a.table_accesses), minlength=len(a.table_accesses)
        )
        return a.table_accesses - missed, a.distinct, a.distinct - loads

    def used(self, rows: np.ndarray, slots: np.ndarray) -> None:
        """The policy's view of a placement: observed accesses per id, rescored slots."""
        if self._observed is not None:
            with self.streams.on_host():
                one = torch.ones((), dtype=torch.int64).expand(len(rows))
                self._observed.index_add_(0, torch.from_numpy(rows), one)
        if self.policy.rescores:
            first, _ = self.slots.dedup_rows(rows)
            self.policy.used(slots[first], rows[first])


_EMPTY = np.zeros(0, dtype=np.int64)
# what ``Transfers.place`` moves: victims, loads, their sources, write-back slots and rows, lookup
_Placed = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, torch.Tensor]


def _count_distinct(values: np.ndarray) -> int:
    if values.size == 0:
        return 0
    v = np.sort(values)
    return int(np.count_nonzero(v[1:] != v[:-1])) + 1


def global_rows(a: Analysis, row_off: np.ndarray) -> np.ndarray:
    """The global row of every id of an analysed batch."""
    return a.values + row_off[id_tables(a.table_accesses)]


def tables_of(pos: np.ndarray, lpk: np.ndarray) -> np.ndarray:
    """The table of each id at positions ``pos`` of a batch (ids are feature-major)."""
    per = uniform_length(lpk)
    if per:
        return pos // per
    return np.searchsorted(np.cumsum(lpk), pos, side="right")
