"""The look-ahead window, on the planner thread: batches from their prefetch to their retirement.

The training thread posts the cache's tasks (backend.py); this object runs them, in the order
posted, on the planner (planner.py).  Prefetched batches queue (FIFO) and are placed in *rounds*
(plan.py): two consecutive batches together where the trainer looks at least two batches ahead
(so the next prefetch always comes before a batch's forward: a round's device ops, copies and
host work serve two batches), else one.  A round that does not fit beside the live rounds' pins
is tried alone, then *deferred* (it and the ones behind it wait until a retirement frees space:
FIFO).  A demanded batch (its forward waits) is placed whatever it takes: alone, then with the
queued rounds' space given back, else by the overflow path.  A round's pins are released when all
of its batches have retired or were forgotten.  Flush, import and the statistics run here too, so
every piece of the cache's state has one owner.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .batch import Round, WindowBatch
from .counters import Counters
from .overflow import OverflowPath
from .plan import RoundPlanner
from .sets import SetMap
from .store import HostStore
from .transfer import Transfers


class Window:
    def __init__(
        self,
        planner: RoundPlanner,
        transfers: Transfers,
        overflow: OverflowPath,
        counters: Counters,
        store: HostStore,
        static_slots: tuple[np.ndarray, np.ndarray],
        round_batches: int,
    ) -> None:
        self.planner = planner
        self.sets: SetMap = planner.sets
        self.transfers = transfers
        self.overflow = overflow
        self.counters = counters
        self.store = store
        self.static_slots = static_slots  # (slots, rows) of the static region
        self.round_batches = round_batches
        self.streams = transfers.streams
        self.queue: list[WindowBatch] = []  # prefetched, not yet forwarded (FIFO)
        self.inflight: list[WindowBatch] = []  # forwarded, backward not known to be done
        self.rounds: list[Round] = []  # placed rounds holding pins
        self.trained = False  # a training batch was placed since the last flush
        self.seq = 0  # rounds planned (the lru policy's clock)
        self._freed = True  # pins were released since a round last did not fit
        # a placement that failed part-way: the device map no longer matches the host store
        self.broken: BaseException | None = None

    # -- tasks -------------------------------------------------------------------------------
    def prefetch(self, b: WindowBatch) -> None:
        if (error := self._broken_error()) is not None:
            self._fail(b, error)
            return
        self.queue.append(b)
        self._try_prepare()

    def demand(self, b: WindowBatch, train: bool) -> None:
        """``b`` is forwarded next: placed now, whatever it takes."""
        if b.error is None:
            b.error = self._broken_error()
        if b.error is not None:
            self._fail(b, b.error)
            return
        b.demanded = True
        if train and not b.train:  # prefetched under no_grad, trained on after all
            b.train = self.trained = True
        if b.round is None:
            try:
                self._try_prepare()
                if b.round is None and b.error is None and not self._place([b]):
                    # give the queued rounds' space back (they are placed again later), retry
                    for r in [r for r in self.rounds if not r.in_flight() and b not in r.batches]:
                        self._unprepare(r)
                    b.needs_overflow = not self._place([b])
            except BaseException as e:
                b.error = e
        if b.needs_overflow:  # the overflow path writes back what it evicts once rows change
            self.trained |= b.train
            self.overflow.written_back = self.trained
            self.seq += 1  # its admissions are a round of their own to lru's clock
            self.overflow.seq = self.seq
        if b in self.queue:
            self.queue.remove(b)
        b.signal(self.streams)

    def forwarded(self, b: WindowBatch, stall: float) -> None:
        self.counters.add("stall_s", stall)
        r = b.round
        if r is not None:  # counted now (the overflow path counted its own)
            first = not any(x.forwarded for x in r.batches)
            with self.streams.use(self.streams.plan):
                self.planner.count(r.hits, r.batches.index(b))
            self.counters.forwarded(b, (r.distinct, r.distinct_hits) if first else None)
        b.forwarded = True
        self.inflight.append(b)
        self._try_prepare()  # batches deferred for lack of space

    def add_stall(self, stall: float) -> None:
        self.counters.add("stall_s", stall)

    def retire(self, event: Any) -> None:
        self.transfers.retired(event)
        for b in self.inflight:
            if b.overflow is not None:
                self.overflow.retire(b)
            b.finished = True
        self.inflight.clear()
        self._release_done()
        self._try_prepare()

    def cancel(self, gone: list[WindowBatch]) -> None:
        for b in gone:
            if b in self.queue:
                self.queue.remove(b)
            b.finished = True
            if b.round is not None and not any(x.forwarded for x in b.round.batches):
                self._unprepare(b.round)
        self._release_done()
        self._try_prepare()  # batches deferred behind the forgotten ones

    def flush(self) -> None:
        if (error := self._broken_error()) is not None:
            raise error
        tr = self.transfers
        tr.sync()
        tr.write_backs.settle(keep=0)
        with self.streams.use(self.streams.plan):  # the device map is the plan stream's
            slots, rows = self.sets.resident()
            self.sets.reset_phantoms()
        if self.trained:
            static_slots, static_rows = self.static_slots
            tr.write_back_now(np.r_[slots, static_slots], np.r_[rows, static_rows])
            self.counters.add("rows_written_back", len(slots) + len(static_slots))
        self.trained = self._training_pending()

    def import_tables(self, state: dict[str, torch.Tensor]) -> None:
        if (error := self._broken_error()) is not None:
            raise error
        self.transfers.write_backs.settle(keep=0)
        with self.streams.on_host():
            self.store.load(state)
        with self.streams.use(self.streams.plan):
            slots, rows = self.sets.resident()
        static_slots, static_rows = self.static_slots
        self.transfers.upload(np.r_[slots, static_slots], np.r_[rows, static_rows])
        self.trained = self._training_pending()

    def stats(self) -> dict[str, float]:
        with self.streams.use(self.streams.plan):  # counted by the plan stream's ops
            hits = self.planner.hit_counts.cpu().numpy()
        return self.counters.report(hits)

    def reset_stats(self) -> None:
        self.counters.reset()
        with self.streams.use(self.streams.plan):
            self.planner.hit_counts.zero_()

    # -- placement ---------------------------------------------------------------------------
    def _try_prepare(self) -> None:
        """Place queued batches in order while they fit (FIFO: a deferred one blocks the later
        ones), two per round where rounds hold two; a lone batch waits for its partner unless
        its forward is waiting for it."""
        if any(b.overflow is not None for b in self.inflight):
            return  # its rows are outside the cache until it retires
        waiting = [b for b in self.queue if b.round is None and b.error is None]
        if waiting and waiting[0].deferred and not (self._freed or waiting[0].demanded):
            return  # nothing was released since it did not fit: it still does not
        while waiting:
            # training and evaluation batches are never placed together (each counts as its own)
            group = [b for b in waiting[: self.round_batches] if b.train == waiting[0].train]
            if len(waiting) < self.round_batches and not group[0].demanded:
                return
            try:
                placed = self._place(group)
                if not placed and len(group) > 1:
                    group = group[:1]
                    placed = self._place(group)
            except BaseException as e:  # this round's forwards raise it, the later ones the rest
                for b in group:
                    self._fail(b, e)
                for b in list(self.queue):
                    self._fail(b, self._broken_error() or e)
                return
            if not placed:
                self._freed = False
                if not group[0].deferred:
                    group[0].deferred = True
                    self.counters.add("deferred_batches", 1)
                return
            waiting = [b for b in waiting if b.round is None and b.error is None]

    def _place(self, group: list[WindowBatch]) -> bool:
        """Plan, commit and copy one round; False (nothing changed) when it does not fit.  A
        batch with an id outside its table fails alone (True: the others wait for a round)."""
        st, planner = self.streams, self.planner
        self.seq += 1
        try:
            with st.use(st.plan):
                for b in group:
                    st.wait_event(st.plan, b.copied)
                p = planner.propose([b.kjt for b in group], self.seq)
                if p.bad_range or not p.fits:
                    planner.refuse(p)
        except BaseException as e:  # the device map may be half changed: nothing goes on
            self.broken = e
            raise
        if p.bad_range:
            self._refuse_out_of_range(group)
            return True
        if not p.fits:
            return False
        # every earlier write-back in the host store before its rows are read (its own error: a
        # write-back that did not land loses rows, and raises from here on)
        self.transfers.write_backs.settle(keep=0)
        self.trained |= any(b.train for b in group)
        try:
            staging = self.transfers.stage(p.rows)
            with st.use(st.plan):
                lookup, hits = planner.commit(p, self.seq)
                ready = st.record_event(st.plan)
            if p.misses:
                evicted = p.evicted if self.trained else None
                ready = self.transfers.copy_round(p.victim[: p.misses], staging, evicted, ready)
            else:  # its hits may be rows an earlier round's copies are still landing
                ready = self.transfers.after_copies(ready)
        except BaseException as e:  # the device map may be half changed: nothing goes on
            self.broken = e
            raise
        self.counters.placed(p.misses, written=self.trained)
        outside = p.distinct - int(p.has_static)  # distinct rows outside the static region
        r = Round(list(group), self.seq, p.slot, ready, hits, outside, outside - p.misses)
        self.rounds.append(r)
        at = 0
        for i, (b, n) in enumerate(zip(group, p.ids.lengths)):
            b.lookup = lookup[i].reshape(-1) if lookup.dim() == 3 else lookup[at : at + n]
            b.round = r
            at += n
            b.signal(self.streams)
        return True

    def _refuse_out_of_range(self, group: list[WindowBatch]) -> None:
        """The batches of ``group`` with an id outside its table fail with an error naming it
        (read back: this is not the step's path); the others wait for another round."""
        for b in group:
            with self.streams.use(self.streams.plan):  # after the plan that found it
                error = self.planner.range_error(b.kjt)
            if error is not None:
                self._fail(b, error)

    def _unprepare(self, r: Round) -> None:
        """``r``'s batches no longer hold their slots (given back to make room, or forgotten)."""
        with self.streams.use(self.streams.plan):
            self.planner.release(r.slots)
        self.rounds.remove(r)
        self._freed = True
        for b in r.batches:
            b.round, b.lookup = None, None
            if not b.finished:
                b.ready.clear()

    def _release_done(self) -> None:
        """Rounds whose batches all retired (or were forgotten): pins released."""
        for r in [r for r in self.rounds if r.done()]:
            with self.streams.use(self.streams.plan):
                self.planner.release(r.slots)
            self.rounds.remove(r)
            self._freed = True

    def _training_pending(self) -> bool:
        """Placed training batches whose steps are still to come: their rows will change."""
        return any(b.train for r in self.rounds for b in r.batches if not b.finished)

    # -- failures ----------------------------------------------------------------------------
    def _broken_error(self) -> BaseException | None:
        """Once a placement failed part-way, the error every later batch and call gets: training
        on must not use rows the device map and the host store no longer agree on."""
        if self.broken is None:
            return None
        e = RuntimeError(
            "freq_cache: a placement failed part-way, so the cache's device map no longer matches "
            "its host store; restart from the last checkpoint (the cause is chained below)"
        )
        e.__cause__ = self.broken
        return e

    def _fail(self, b: WindowBatch, e: BaseException) -> None:
        b.error = e
        if b in self.queue:
            self.queue.remove(b)
        b.signal(self.streams)
