"""``bench kind=planning``: the freq_cache's own work per batch with Criteo-Kaggle-shaped tables, by
party: the plan on the device, the host's staging of rows, the copies; and the floor the host's
part is measured against, in the same run.

Per timed batch, as in training (batch ``i`` is prefetched while batches ``i - lookahead .. i-1``
hold their rows), the cache's counters give:

* ``plan_ms``: the rounds' proposals and commits (plan.py) as the planner thread sees them: the
  device ops and the two reads that wait for them (on a CPU device the ops run there);
* ``staging_ms``: the host's part, what has to scale with the rows moved: the gather of the missed
  rows into staging (``gather_ms``), the write-backs' scatter into the host store
  (``landing_ms``, the write-back thread's on a GPU), and on a GPU issuing the copies
  (``issue_ms``; on a CPU device issuing them is doing them, device work, reported as
  ``copies_ms`` and left out);
* ``floor_ms``: the same numbers of rows as each round moved in and out (random ones), gathered
  from and scattered into the same host store by bare torch ops (``index_select``,
  ``index_copy_``) on the same host threads (:class:`_Floor`: beside each round on a CPU device,
  at the end of the run with a GPU): what moving that many rows costs this machine at least.

``staging_vs_floor`` is their ratio, the number that travels between machines (their memory
systems differ by more than the code does).  After the timed batches, ``sync_count_batches`` more
run with the training thread's calls (prefetch, forward) under :class:`HostSyncCounter`: the reads
that would make it wait for the device.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections import deque
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..data.batch import OneIdPerSample
from ..data.format import NUM_DENSE
from ..embedding.base import SparseOptim
from .inputs import COUNTED_SAMPLES, host_batches, sync
from .syncs import HostSyncCounter


def planning(cfg: DictConfig, tables, batches, device, counts) -> list[dict[str, Any]]:
    """kind=planning: the freq_cache's own cost per batch, for each cache ratio and each value of
    ``planner_threads`` (see the module docstring)."""
    from ..embedding.freq_cache import FreqCacheBackend

    keys = [t.name for t in tables]
    b = cfg.batch_size
    dense, labels = torch.zeros(b, NUM_DENSE), torch.zeros(b)
    host = host_batches(
        OneIdPerSample(keys), dense, batches, labels, pin=device.type == "cuda"
    )  # pinned as the loader makes them
    results = []
    for ratio in cfg.cache_ratios:
        for threads in cfg.planner_threads:
            gc.collect()  # the previous cache's host store goes before this one is made
            emb = FreqCacheBackend(
                tables,
                SparseOptim("rowwise_adagrad", cfg.lr),
                device=device,
                cache_ratio=ratio,
                counts=counts,
                lookahead=cfg.lookahead,
                policy=cfg.policy,
                batch_size=cfg.batch_size,
                planner_threads=threads,
                counted_samples=COUNTED_SAMPLES,
            )
            # as after import_tables in training: every page of the host store written once (a
            # fresh allocation maps zero pages, and the first write to each would be timed)
            emb.store.data.zero_()
            r = _run(cfg, emb, host, device)
            r["variant"] = f"freq_cache {ratio:.1%} {cfg.policy} threads={emb.planner_threads}"
            _print(r)
            results.append(r)
            del emb
    return results


class _Floor:
    """The floor of the host's part, measured beside the real work: after each timed round's
    staging (and write-back), a bare torch gather (scatter) of as many random rows of the same
    host store, on the same host threads.  On a CPU device right away, in the conditions the
    round's own work met (its plan's ops ran on the same cores); with a GPU at the end of the run,
    so that it does not compete with the write-back thread for the host's memory."""

    def __init__(self, emb, interleave: bool, seed: int) -> None:
        self.store, self.threads = emb.store.data, emb.store.threads
        self.rng = np.random.default_rng(seed)
        self.interleave = interleave
        self.counts: list[tuple[str, int]] = []  # ("in" | "out", rows), when not interleaved
        self.seconds = 0.0
        self.on = False
        # the gathers' destination, kept and written once before it is timed, as the staging
        # buffers the real rounds reuse are (pinned where the real ones are)
        self._pin = emb.device.type == "cuda"
        self._landing = torch.zeros((0, self.store.shape[1]))
        tr = emb.transfers
        stage, add = tr.stage, tr.write_backs.add

        def staged(rows):
            out = stage(rows)
            self._moved("in", len(rows))
            return out

        def written(rows, records, event):
            out = add(rows, records, event)
            self._moved("out", len(rows))
            return out

        tr.stage, tr.write_backs.add = staged, written

    def _moved(self, way: str, n: int) -> None:
        if not self.on:
            return
        if self.interleave:
            self.seconds += self._time(way, n)
        else:
            self.counts.append((way, n))

    def finish(self) -> float:
        """Seconds of the floor of the timed rounds."""
        self.seconds += sum(self._time(way, n) for way, n in self.counts)
        self.counts.clear()
        return self.seconds

    def _buffer(self, n: int) -> torch.Tensor:
        """``n`` rows of the kept landing buffer (grown, and written once, outside the timing)."""
        if self._landing.shape[0] < n:
            size = (max(n, 2 * self._landing.shape[0]), self.store.shape[1])
            self._landing = torch.zeros(size, pin_memory=self._pin)
        return self._landing[:n]

    def _time(self, way: str, n: int) -> float:
        store = self.store
        index = torch.from_numpy(self.rng.integers(0, store.shape[0] - 1, n))
        if way == "in":
            buf = self._buffer(n)
            t0 = time.perf_counter()
            self.threads.split(
                n, lambda a, b: torch.index_select(store, 0, index[a:b], out=buf[a:b])
            )
            return time.perf_counter() - t0
        index = torch.unique(index)  # distinct, as a write-back's rows are
        records = torch.index_select(store, 0, index)  # what is there: the store stays as it was
        t0 = time.perf_counter()
        self.threads.split(len(index), lambda a, b: store.index_copy_(0, index[a:b], records[a:b]))
        return time.perf_counter() - t0


def _counters(emb) -> dict[str, float]:
    tr = emb.transfers
    return {
        "plan": emb.planner.plan_s,
        "gather": tr.stage_s,
        "landing": tr.write_backs.scatter_s,
        "issue": tr.issue_s,
    }


def _run(cfg: DictConfig, emb, host: list, device: torch.device) -> dict[str, Any]:
    timed_end = cfg.warmup + cfg.iters
    total = timed_end + cfg.sync_count_batches
    window: deque[KeyedJaggedTensor] = deque()
    counter, stats = HostSyncCounter(), None
    floor = _Floor(emb, interleave=not emb.streams.asynchronous, seed=cfg.seed)
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    wall = 0.0
    # as in training: batch i is prefetched while batches i-lookahead..i-1 hold their rows
    for i in range(total + cfg.lookahead):
        counted = timed_end <= i < total
        if i == cfg.warmup:  # the timed batches start: their counters and clocks from here
            emb.settle()
            emb.reset_stats()
            before, floor.on, t0 = _counters(emb), True, time.perf_counter()
        if i == timed_end:
            emb.settle()
            sync(device)
            emb.transfers.write_backs.settle(keep=0)
            wall = time.perf_counter() - t0
            after, floor.on = _counters(emb), False
            stats = emb.take_stats()  # the timed batches' counters
        if i < total:
            kjt, copied = _to_device(host[i % len(host)].sparse, emb.streams, device)
            with counter if counted else contextlib.nullcontext():
                emb.prefetch(kjt, copied)
            window.append(kjt)
        if len(window) > cfg.lookahead or i >= total:
            with counter if counted else contextlib.nullcontext():
                emb.forward(window.popleft())
                emb.step_done()
    stats_all = emb.stats()
    assert stats is not None  # iters >= 1
    n, ms = max(1, cfg.sync_count_batches), 1000 / cfg.iters
    part = {k: (after[k] - before[k]) * ms for k in after}
    asynchronous = emb.streams.asynchronous
    staging = part["gather"] + part["landing"] + (part["issue"] if asynchronous else 0.0)
    floor_ms = floor.finish() * ms
    return {
        "planner_threads": emb.planner_threads,
        "plan_ms": part["plan"],
        "staging_ms": staging,
        "gather_ms": part["gather"],
        "landing_ms": part["landing"],
        "issue_ms": part["issue"] if asynchronous else 0.0,
        "copies_ms": 0.0 if asynchronous else part["issue"],
        "floor_ms": floor_ms,
        "staging_vs_floor": staging / floor_ms if floor_ms else float("nan"),
        "wall_ms": wall * ms,
        "hit_rate": stats["hit_rate"],
        "rows_loaded_per_batch": stats["rows_loaded"] / cfg.iters,
        "rows_written_back_per_batch": stats["rows_written_back"] / cfg.iters,
        "stats": stats,
        "host_syncs_per_batch": counter.total_syncs / n,
        "host_syncs_by_kind": {k: v / n for k, v in sorted(counter.syncs.items())},
        "deferred_batches_all": stats_all["deferred_batches"] + stats["deferred_batches"],
        "overflow_batches_all": stats_all["overflow_batches"] + stats["overflow_batches"],
    }


def _to_device(kjt: KeyedJaggedTensor, st, device: torch.device):
    """``kjt`` copied to ``device`` on the input stream, as the pipeline does, with its event."""
    if not st.asynchronous:
        return kjt, None
    with st.use(st.input):
        kjt = kjt.to(device, non_blocking=True)
    return kjt, st.record_event(st.input)


def _print(r: dict[str, Any]) -> None:
    s = r["stats"]
    print(
        f"  {r['variant']:<36} plan {r['plan_ms']:6.2f}  staging {r['staging_ms']:6.2f} "
        f"(gather {r['gather_ms']:.2f} + landing {r['landing_ms']:.2f} + issue "
        f"{r['issue_ms']:.2f})  floor {r['floor_ms']:6.2f}  staging/floor "
        f"{r['staging_vs_floor']:.3f}  copies {r['copies_ms']:.2f} (ms/batch)  hit "
        f"{r['hit_rate']:.4f}  rows in/out per batch "
        f"{r['rows_loaded_per_batch']:,.0f}/{r['rows_written_back_per_batch']:,.0f}  "
        f"deferred {s['deferred_batches']:.0f}  overflow {s['overflow_batches']:.0f}",
        flush=True,
    )
    kinds = " ".join(f"{k} {v:g}" for k, v in r["host_syncs_by_kind"].items()) or "none"
    print(
        f"  {'':<36} training thread's host syncs per batch (prefetch+forward): {kinds}; "
        f"window {s['window_rows']:,.0f} rows (needed ~{s['window_needed_rows']:,.0f}), "
        f"static {s['static_rows']:,.0f} rows",
        flush=True,
    )
