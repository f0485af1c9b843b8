"""A round's placement, decided on the device in a fixed number of torch ops, on the plan stream.

A *round* is one or two batches placed together (window.py).  Its ids, as the device has them:

1. ``ids``: each id's global row, its static flag (a rank compare: ``rank < static_rows[t]``) and
   its static slot; a range check folded into two numbers; a plan key ``set << 35 | row`` for the
   others (static ids all get the dummy set's key).
2. ``propose``: the distinct keys (``torch.unique``, sorted: by set, then row) and each id's index
   among them; one gather of their sets' keys finds the resident ones (the hits), whose ways are
   pinned at once (scores.py); the misses, sorted again to the front (still by set), take victims:
   the ``rank``-th lowest eviction key of their set, ``rank`` being their place among their set's
   misses.  One copy brings back what the host needs: whether every victim was unpinned, how many
   hits, the range check, the missed rows and the rows their victims held.
3. ``commit`` (only when the proposal holds): the misses' rows and scores into their victims' ways,
   each id's slot (static slot, hit's way or victim), and the per-table miss counts.

The host reads two things per round, both waiting only for the plan stream's own ops: the number
of distinct keys (``unique``) and that one copy.  Nothing here waits for the compute stream: the
plan stream waits only for the batches' input copies.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from .scores import EvictionScores
from .sets import PIN, ROW_BITS, ROW_MASK, SetMap

# readback layout: [fail, hits, range min, range max, last key's set, rows (D), old rows (D)]
_FAIL, _HITS, _LO, _HI, _LAST, _ROWS = 0, 1, 2, 3, 4, 5


class TableParams:
    """Per table, on the device: row offset, static rows, rows, static slot of rank 0 -- as
    ``[4, 1, T, 1]`` (broadcast over one-hot batches ``[R, T, B]``) and ``[T, 4]`` (gathered per id
    of jagged ones, once per batch of a round: :meth:`cells`)."""

    def __init__(
        self,
        names: list[str],
        row_offsets: np.ndarray,
        static_rows: np.ndarray,
        static_slots: np.ndarray,
        device: torch.device,
    ) -> None:
        self.names = list(names)
        rows = np.diff(row_offsets)
        table = np.stack([row_offsets[:-1], static_rows, rows, static_slots]).astype(np.int64)
        self.host = table  # rows: row offset, static rows, rows, static slot of rank 0
        self.num_tables = len(rows)
        self.rows = rows
        self.per_table = torch.from_numpy(table.T.copy()).to(device)  # [T, 4]
        self.broadcast = self.per_table.t().reshape(4, 1, -1, 1)
        self.device = device
        self._cells: dict[int, torch.Tensor] = {}
        self._aranges: dict[torch.dtype, torch.Tensor] = {}

    def cells(self, batches: int) -> torch.Tensor:
        """``[batches * T, 4]``: the per-table rows once per batch of a round."""
        if batches not in self._cells:
            self._cells[batches] = self.per_table.repeat(batches, 1)
        return self._cells[batches]

    def arange(self, n: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        """``0..n-1`` (a view of a kept tensor)."""
        t = self._aranges.get(dtype)
        if t is None or t.numel() < n:
            size = max(n, 1024, 0 if t is None else 2 * t.numel())
            t = self._aranges[dtype] = torch.arange(size, dtype=dtype, device=self.device)
        return t[:n]


@dataclasses.dataclass
class RoundIds:
    """A round's ids on the device and what follows from them without the cache's state."""

    values: torch.Tensor  # [R, T, B] (one-hot batches of one size) or [N]
    static: torch.Tensor  # bool, values' shape
    static_slot: torch.Tensor
    key: torch.Tensor  # plan keys, static ids: the dummy set's
    lengths: list[int]  # ids per batch (its slice of the flat order)
    cell: torch.Tensor | None  # [N]: each id's batch * T + table (jagged rounds only)


def uniform_batch(kjts: list[KeyedJaggedTensor]) -> int:
    """The samples per batch when every batch of a round has one id per sample and table and the
    same size (their ids stack as ``[R, T, B]``), else 0."""
    b = kjts[0].stride()
    for k in kjts:
        lpk = k.length_per_key()
        if k.stride() != b or any(n != b for n in lpk):
            return 0
    return b


def round_ids(
    kjts: list[KeyedJaggedTensor],
    p: TableParams,
    sets: int,
    sent_key: int,
    readback: torch.Tensor,
    streams: Any,
) -> RoundIds:
    """Step 1 (see the module docstring) for the round's batches ``kjts`` (their ids on the
    device); the range check's min and max (0 and 0 when every id is in range) go to
    ``readback``."""
    b = uniform_batch(kjts)
    cell = None
    if b:
        parts = [k.values().view(p.num_tables, b) for k in kjts]
        values = parts[0].unsqueeze(0) if len(parts) == 1 else torch.stack(parts)
        off, static_rows, rows, static_at = p.broadcast
    else:
        values, cell = _jagged_cells(kjts, p, streams)
        off, static_rows, rows, static_at = p.cells(len(kjts)).index_select(0, cell).unbind(1)
    in_range = torch.div(values, rows, rounding_mode="floor")  # 0 for ids inside their table
    torch.aminmax(in_range, out=(readback[_LO], readback[_HI]))
    g = torch.add(values, off)
    static = torch.lt(values, static_rows)
    key = torch.add(g, torch.remainder(g, sets), alpha=1 << ROW_BITS)
    key.masked_fill_(static, sent_key)
    static_slot = torch.add(values, static_at)
    lengths = [int(k.values().numel()) for k in kjts]
    return RoundIds(values, static, static_slot, key, lengths, cell)


def _jagged_cells(
    kjts: list[KeyedJaggedTensor], p: TableParams, streams: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenated ids of jagged batches and each id's cell (``batch * T + table``), repeated from
    the batches' per-key lengths (host numbers: one copy of ``R * T`` of them to the device)."""
    lengths = [n for k in kjts for n in k.length_per_key()]
    with streams.on_host():
        host = streams.pinned((len(lengths),), torch.int64)
        host.numpy()[:] = lengths
    counts = host.to(p.device, non_blocking=True, copy=True)
    n = sum(lengths)
    cell = torch.repeat_interleave(p.arange(len(lengths)), counts, output_size=n)
    values = kjts[0].values() if len(kjts) == 1 else torch.cat([k.values() for k in kjts])
    return values, cell


@dataclasses.dataclass
class Proposal:
    """What ``propose`` decided on the device, and read back: the round's plan before commit."""

    ids: RoundIds
    inverse: torch.Tensor  # each id's index among the distinct keys
    counts: torch.Tensor  # ids per distinct key
    distinct: int  # distinct keys (the dummy set's one included, if any)
    hit: torch.Tensor  # per distinct key: resident before the round
    slot: torch.Tensor  # per distinct key: its way if resident (pinned); then its slot
    order: torch.Tensor  # distinct misses first (by set, row): index among the distinct keys
    victim: torch.Tensor  # per entry of ``order``: the slot it takes
    host: np.ndarray  # the readback, read
    misses: int = 0  # distinct rows to load
    fits: bool = False  # every miss found an unpinned way
    bad_range: bool = False  # an id is outside its table
    has_static: bool = False  # the dummy set's key is among the distinct keys

    @property
    def rows(self) -> np.ndarray:
        """The missed rows (host memory: the readback)."""
        return self.host[_ROWS : _ROWS + self.misses]

    @property
    def evicted(self) -> np.ndarray:
        """The rows their victims held (the host store's scratch row for an empty way)."""
        return self.host[_ROWS + self.distinct : _ROWS + self.distinct + self.misses]


class RoundPlanner:
    """The plan and commit ops of rounds over one set map (the cache's state), with one policy."""

    def __init__(
        self, sets: SetMap, scores: EvictionScores, params: TableParams, streams: Any
    ) -> None:
        self.sets = sets
        self.scores = scores
        self.params = params
        self.streams = streams
        self.geometry = sets.geometry
        # allocated by ``readback`` on the plan stream, the only one that uses it
        self._readback = torch.zeros(0, dtype=torch.int64, device=params.device)
        self._sent_key = torch.tensor(self.geometry.sent_key, device=params.device)
        self.plan_s = 0.0  # wall time of proposals and commits (with their waits: device work)
        # per table: the hits of forwarded batches (``count``), read back by ``stats()``
        self.hit_counts = torch.zeros(params.num_tables, dtype=torch.int64, device=params.device)
        self._settled = torch.zeros(0, dtype=torch.int64, device=params.device)

    def readback(self, ids: int) -> torch.Tensor:
        """The plan stream's readback buffer for a round of ``ids`` ids (kept: only the plan
        stream touches it)."""
        n = _ROWS + 2 * ids
        if self._readback.numel() < n:
            size = max(n, 2 * self._readback.numel(), 1024)
            self._readback = torch.zeros(size, dtype=torch.int64, device=self.params.device)
        return self._readback

    def propose(self, kjts: list[KeyedJaggedTensor], seq: int) -> Proposal:
        """Step 2, on the calling thread's current stream (the plan stream); waits for it."""
        t0 = time.perf_counter()
        try:
            return self._propose(kjts, seq)
        finally:
            self.plan_s += time.perf_counter() - t0

    def _propose(self, kjts: list[KeyedJaggedTensor], seq: int) -> Proposal:
        g, st, sets = self.geometry, self.streams, self.sets
        n = sum(int(k.values().numel()) for k in kjts)
        if n == 0:
            return self._empty(kjts)
        rb = self.readback(n)
        ids = round_ids(kjts, self.params, g.sets, g.sent_key, rb, st)
        u, inverse, counts = torch.unique(
            ids.key, sorted=True, return_inverse=True, return_counts=True
        )
        d = u.numel()
        set_of = torch.bitwise_right_shift(u, ROW_BITS)
        row = torch.bitwise_and(u, ROW_MASK)
        hit, way = torch.eq(sets.keys2d[set_of], row.unsqueeze(1)).max(1)
        slot = torch.add(way, set_of, alpha=g.cols)  # a miss: its set's phantom
        self.scores.touch(sets.evict, slot, hit, seq)
        missed, order = torch.sort(torch.where(hit, self._sent_key, u))
        miss_set = torch.bitwise_right_shift(missed, ROW_BITS)
        rank = torch.sub(self.params.arange(d), torch.searchsorted(miss_set, miss_set))
        rank.clamp_(max=g.cols - 1)
        ranked, ranked_col = torch.sort(sets.evict2d[miss_set], stable=True, dim=1)
        chosen = ranked.gather(1, rank.unsqueeze(1))
        col = ranked_col.gather(1, rank.unsqueeze(1)).squeeze(1)
        victim = torch.add(col, miss_set, alpha=g.cols)
        torch.amax(chosen, out=rb[_FAIL])
        torch.sum(hit, 0, out=rb[_HITS])
        torch.bitwise_right_shift(u[-1], ROW_BITS, out=rb[_LAST])
        torch.bitwise_and(missed, ROW_MASK, out=rb[_ROWS : _ROWS + d])
        torch.index_select(sets.keys, 0, victim, out=rb[_ROWS + d : _ROWS + 2 * d])
        host = st.pinned((_ROWS + 2 * d,), torch.int64)
        host.copy_(rb[: _ROWS + 2 * d], non_blocking=True)
        st.host_wait(st.record_event(st.current_stream()))
        h = host.numpy()
        p = Proposal(ids, inverse, counts, d, hit, slot, order, victim, h)
        p.misses = d - int(h[_HITS])
        p.fits = int(h[_FAIL]) < PIN
        p.bad_range = bool(h[_LO] != 0 or h[_HI] != 0)
        p.has_static = int(h[_LAST]) == g.sets
        return p

    def _empty(self, kjts: list[KeyedJaggedTensor]) -> Proposal:
        """The proposal of a round without ids: nothing to look up, nothing to load."""
        none = torch.zeros(0, dtype=torch.int64, device=self.params.device)
        ids = RoundIds(none, none.bool(), none, none, [0] * len(kjts), none)
        p = Proposal(ids, none, none, 0, none.bool(), none, none, none, np.zeros(_ROWS, np.int64))
        p.fits = True
        return p

    def range_error(self, kjt: KeyedJaggedTensor) -> IndexError | None:
        """The error naming ``kjt``'s first id outside its table, or None (reads the ids back:
        only after a proposal found one)."""
        lpk = np.asarray(kjt.length_per_key(), dtype=np.int64)
        values = kjt.values().cpu().numpy()
        table = np.repeat(np.arange(len(lpk)), lpk)
        limit = self.params.rows[table]
        bad = np.flatnonzero((values < 0) | (values >= limit))
        if not len(bad):
            return None
        i = int(bad[0])
        return IndexError(
            f"freq_cache: id {int(values[i])} out of range for table "
            f"{self.params.names[table[i]]} ({int(limit[i])} rows)"
        )

    def refuse(self, p: Proposal) -> None:
        """A proposal that does not hold: its hits' pins taken back (nothing else changed)."""
        self.scores.untouch(self.sets.evict, p.slot, p.hit)

    def commit(self, p: Proposal, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 3 on the plan stream: the misses placed; each id's slot (``values``' shape) and
        the round's hits (static or resident before it) per batch and table, ``[R, T]``, for
        ``count`` as each batch is forwarded."""
        t0 = time.perf_counter()
        sets, m = self.sets, p.misses
        victims, rows = p.victim[:m], self._readback[_ROWS : _ROWS + m]
        sets.keys.index_copy_(0, victims, rows)
        self.scores.admit(sets.evict, victims, rows, seq)
        p.slot.index_copy_(0, p.order[:m], victims)
        lookup = torch.where(p.ids.static, p.ids.static_slot, p.slot[p.inverse])
        hits = self._cell_hits(p)
        self.plan_s += time.perf_counter() - t0
        return lookup, hits

    def _cell_hits(self, p: Proposal) -> torch.Tensor:
        """Per batch and table, the ids served from the cache (static, or resident before the
        round): ``[R, T]``."""
        ids, t = p.ids, self.params.num_tables
        settled = self._settled_buffer(ids.static.numel()).view(ids.static.shape)
        torch.logical_or(p.hit[p.inverse], ids.static, out=settled)
        if ids.cell is None:  # [R, T, B]
            return settled.sum(-1)
        batches = len(ids.lengths)
        cells = torch.zeros(batches * t, dtype=torch.int64, device=self.params.device)
        return cells.index_add_(0, ids.cell, settled).view(batches, t)

    def _settled_buffer(self, n: int) -> torch.Tensor:
        """The plan stream's int64 scratch for per-id flags (kept: only the plan stream uses it)."""
        if self._settled.numel() < n:
            size = max(n, 2 * self._settled.numel())
            self._settled = torch.empty(size, dtype=torch.int64, device=self.params.device)
        return self._settled[:n]

    def count(self, hits: torch.Tensor, batch: int) -> None:
        """Batch ``batch`` of a round forwarded: its hits (a row of the round's ``commit``'s
        ``[R, T]``) into the per-table totals."""
        self.hit_counts.add_(hits[batch])

    def release(self, slots: torch.Tensor) -> None:
        """A round's pins (its distinct keys' slots) taken back: it retired, or was given back."""
        self.scores.untouch(self.sets.evict, slots)
