"""The stream protocol as a tested contract: the real training loop, Pipeline and freq_cache on the
CPU with every stream operation recorded (stream_harness.RecordingStreams).

Per steady-state step, for look-ahead 1 and 2, with and without deferred batches, with an
evaluation and a checkpoint between steps, on one process and on 2 gloo ranks: no host read waits
for compute work of the step just issued, the compute stream never waits for a whole other stream,
no two streams touch the same rows unordered, every tensor used off its allocating stream is
``record_stream``-ed (or outlived by a host synchronization), and no device op touches the cache's
host store (rows cross only as copies from and to staging buffers).  The cache's streams issue at
most ``CACHE_OPS_PER_BATCH`` device ops per batch.  A mutation test plants each kind of host read
and wait in the cache's forward and requires the recorder to report it.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from stream_harness import RecordingStreams

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
sys.path.insert(0, str(Path(__file__).parents[1] / "embedding"))
from launching import launch_ranks
from test_freq_cache import make_batch, make_tables, random_state  # noqa: E402
from test_train import base_overrides, compose_train  # noqa: E402

from dlrm_cache.concurrency.streams import streams_for, streams_override
from dlrm_cache.embedding.base import SparseOptim
from dlrm_cache.embedding.freq_cache import FreqCacheBackend
from dlrm_cache.train import build, metrics
from dlrm_cache.train.loop import train

STEPS = 12
# issue 26, target 2: device ops per batch on the cache's streams (plan, while it exists, and copy)
CACHE_OPS_PER_BATCH = 30
CACHE_STREAMS = ("plan", "copy")


def _tracked(init):
    """``FreqCacheBackend.__init__`` that also has the recorder check the cache's slot buffers
    (``transfers.cache_w``, ``transfers.cache_m``) and host store (``store.data``) row by row, and
    declares the host store host-resident (a backend may declare it itself: the same call)."""

    def tracked_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        rec = streams_for("cpu")
        for t in (self.transfers.cache_w, self.transfers.cache_m, self.store.data):
            if t is not None:
                rec.track_rows(t)
        rec.host_resident(self.store.data)  # the cache declares it too (transfer.py)

    return tracked_init


def _allowed(fn, why: str):
    """``fn`` whose host reads may drain the step (an evaluation's metrics, a checkpoint)."""

    def wrapper(*args, **kwargs):
        with streams_for("cpu").allowed(why):
            return fn(*args, **kwargs)

    return wrapper


# what the recorded runs wrap: (class, attribute, wrapper)
_WRAPS = [
    (FreqCacheBackend, "__init__", _tracked),
    (metrics.EvalMetrics, "compute", lambda f: _allowed(f, "metrics")),
    (build.TrainingRun, "checkpoint", lambda f: _allowed(f, "checkpoint")),
]


def _record_training(monkeypatch, data: Path, run_dir: Path, overrides: list[str]):
    """Train under the recorder; returns it (closed) and the run's summary."""
    for cls, name, wrap in _WRAPS:
        monkeypatch.setattr(cls, name, wrap(getattr(cls, name)))
    cfg = compose_train(
        base_overrides(data, run_dir)
        + ["embedding=freq_cache", f"max_steps={STEPS}", f"log_every={STEPS}", *overrides]
    )
    with streams_override(RecordingStreams):
        rec = streams_for("cpu")
        with rec.activate():
            summary = train(cfg)
    return rec, summary


def steady(rec: RecordingStreams):
    """Host reads that drained the step, but the loop's own reads at its log interval and before
    an evaluation or a checkpoint (its loss, the loss guard's check)."""
    return [
        r
        for r in rec.drains()
        if "train/loop.py" not in r.where and "train/guard.py" not in r.where
    ]


def findings(rec: RecordingStreams) -> dict[str, list[str]]:
    """Every check's findings as text, each distinct one once with its count (the first 10)."""
    drains = [
        f"{r.thread} {r.kind} on {r.stream} at {r.where}: waits for compute ops of the step"
        for r in steady(rec)
    ]
    lists = [drains, rec.overwaits, rec.races, rec.unrecorded, rec.host_memory]
    names = ["drains", "overwaits", "races", "unrecorded", "host_memory"]
    return {
        name: [f"{n}x {text}" for text, n in Counter(items).most_common(10)]
        for name, items in zip(names, lists)
    }


def assert_clean(found: dict[str, list[str]]) -> None:
    """No check found anything (the message lists every check that did)."""
    bad = {check: items for check, items in found.items() if items}
    assert not bad, "\n".join(f"{check}:\n  " + "\n  ".join(items) for check, items in bad.items())


@pytest.mark.parametrize(
    "lookahead,ratio,batch",
    [(1, 0.05, 128), (2, 0.05, 128), (2, 0.1, 0)],
    ids=["lookahead1", "lookahead2", "deferred"],
)
def test_no_step_waits_for_the_cache(
    monkeypatch, processed_synth, tmp_path, lookahead, ratio, batch
):
    rec, summary = _record_training(
        monkeypatch,
        processed_synth,
        tmp_path / "run",
        [
            f"embedding.lookahead={lookahead}",
            f"embedding.cache_ratio={ratio}",
            f"embedding.batch_size={batch}",
            "eval_every=5",
            "eval_batches=2",
            "data.eval_batch_size=128",
            "checkpoint_every=7",
        ],
    )
    assert summary["steps"] == STEPS
    if batch == 0:  # the window is not sized for the batches: some wait for space
        assert summary["embedding_deferred_batches"] > 0, summary
    assert summary["embedding_overflow_batches"] == 0, summary  # a documented slow path: it drains
    assert rec.ops > 3_000 and rec.steps >= STEPS  # the whole loop ran under the recorder
    assert_clean(findings(rec))


@pytest.mark.parametrize(
    "data,sizing",
    [
        ("processed_synth", []),
        # its ids are so concentrated that only a window smaller than the sized one misses rows
        ("multi_hot_dataset", ["embedding.batch_size=0", "embedding.cache_ratio=0.7"]),
    ],
    ids=["one_hot", "multi_hot"],
)
def test_the_cache_issues_at_most_30_device_ops_per_batch(
    monkeypatch, request, data, sizing, tmp_path
):
    """Issues 26 and 36, target 2: the cache's device work per batch is proportional to the batch, at most
    ``CACHE_OPS_PER_BATCH`` aten ops that touch memory on its streams, counted over the real loop's
    steady state (look-ahead 2).  Each training forward first lets the planner run every task
    posted so far (``settle``), so the ops between two forwards are exactly one batch's: its
    prefetch, demand, forward and retirement.

    Issue 36: the cache plans on the device in rounds of two batches: 24 ops per batch on the plan
    stream and 3 on the copy stream with one id per sample and table, 26.75 and 3 with multi-hot
    lists (measured 2026-11-28).  Before: 12 per batch on the copy stream with the cache planning
    on the host; at 6a65ee4, which planned on the device per batch, 99 (plan 92, copy 7)."""
    marks: list[dict[str, int]] = []
    forward = FreqCacheBackend.forward

    def marked(self, features):
        if torch.is_grad_enabled():
            self.settle()
            marks.append(streams_for("cpu").ops_by_stream())
        return forward(self, features)

    monkeypatch.setattr(FreqCacheBackend, "forward", marked)
    rec, summary = _record_training(
        monkeypatch,
        request.getfixturevalue(data),
        tmp_path / "run",
        ["embedding.lookahead=2", "embedding.cache_ratio=0.05", "eval_batches=1", *sizing],
    )
    assert summary["steps"] == STEPS and len(marks) == STEPS
    # the steady state: rows move every round, and none waits for space or overflows
    assert summary["embedding_rows_loaded"] > 0
    assert summary["embedding_deferred_batches"] == summary["embedding_overflow_batches"] == 0
    first, last = marks[3], marks[-1]  # the first batches warm the cache up
    per_batch = {s: (last[s] - first.get(s, 0)) / (STEPS - 4) for s in last}
    cache = sum(per_batch.get(s, 0) for s in CACHE_STREAMS)
    assert cache > 0, per_batch  # the cache's streams were counted
    assert cache <= CACHE_OPS_PER_BATCH, (
        f"{cache:.1f} device ops per batch on {'+'.join(CACHE_STREAMS)} (at most "
        f"{CACHE_OPS_PER_BATCH}); per stream: {per_batch}"
    )


# host reads and waits planted after the cache's forward (the batch's pooled output ``out``, the
# device's streams ``st``): each is a finding of the recorder ("drains": of that kind)
PLANTS = {
    "tolist": lambda out, st: out.values()[:1, :1].tolist(),
    "cpu": lambda out, st: out.values()[:1].cpu(),
    "numpy": lambda out, st: out.values()[:1].detach().numpy(),
    "host_wait": lambda out, st: st.host_wait(st.record_event(st.current_stream())),
    "event.synchronize": lambda out, st: st.record_event(st.current_stream()).synchronize(),
    "event.query": lambda out, st: st.record_event(st.current_stream()).query(),
    "overwait": lambda out, st: st.wait_stream(st.current_stream(), st.copy),
    "to": lambda out, st: out.values()[:1].to("cpu"),
    "pageable_copy": lambda out, st: torch.from_numpy(np.zeros(1, np.float32)).copy_(
        out.values()[0, :1], non_blocking=True
    ),
}


@pytest.mark.parametrize("plant", [None, *PLANTS])
def test_the_recorder_reports_every_planted_read_or_wait(
    monkeypatch, processed_synth, tmp_path, plant
):
    """Issue 26, target 4: the real loop with a host read (or a compute-stream wait for the whole
    copy stream) planted in every training forward of the cache is reported; unplanted (None),
    it has no drain and no overwait."""
    forward = FreqCacheBackend.forward

    def planted(self, features):
        out = forward(self, features)
        if plant is not None and torch.is_grad_enabled():
            PLANTS[plant](out, streams_for("cpu"))
        return out

    monkeypatch.setattr(FreqCacheBackend, "forward", planted)
    steps = 3
    rec, summary = _record_training(
        monkeypatch,
        processed_synth,
        tmp_path / "run",
        [
            f"max_steps={steps}",
            f"log_every={steps}",
            "embedding.lookahead=1",
            "embedding.cache_ratio=0.05",
            "eval_batches=1",
            "data.eval_batch_size=128",
        ],
    )
    assert summary["steps"] == steps
    found = findings(rec)
    if plant is None:
        assert not found["drains"] and not found["overwaits"], found
    elif plant == "overwait":
        assert len(rec.overwaits) == steps and "whole copy stream" in rec.overwaits[0], found
    else:
        planted_reads = [r for r in steady(rec) if r.kind == plant and r.thread == "MainThread"]
        assert len(planted_reads) == steps, found


def _recorded_rank(overrides: list[str]) -> dict:
    """One torchrun rank (gloo, CPU) training under its own recorder: what the checks found."""
    from hydra import compose, initialize_config_dir

    from dlrm_cache.commands.store import config_dir, register_configs

    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    for cls, name, wrap in _WRAPS:  # a process of its own: nothing to undo
        setattr(cls, name, wrap(getattr(cls, name)))
    with streams_override(RecordingStreams):
        rec = streams_for("cpu")
        with rec.activate():
            summary = train(cfg)
    return {
        "steps": summary["steps"],
        "recorded_steps": rec.steps,
        "ops": rec.ops,
        "findings": findings(rec),
    }


def test_no_step_waits_for_the_cache_sharded_over_two_gloo_ranks(processed_synth, tmp_path):
    """The same contract for 2 ranks sharding the tables (each rank's cache behind the sharded
    backend's collectives), through torch's elastic launcher (what torchrun runs)."""
    overrides = base_overrides(processed_synth, tmp_path / "run") + [
        "embedding=freq_cache",
        f"max_steps={STEPS}",
        f"log_every={STEPS}",
        "embedding.lookahead=2",
        "embedding.cache_ratio=0.05",
        "eval_every=5",
        "eval_batches=2",
        "data.eval_batch_size=128",
        "checkpoint_every=7",
    ]
    out = launch_ranks(2, _recorded_rank, overrides)
    for rank, found in out.items():
        assert found["steps"] == STEPS and found["recorded_steps"] >= STEPS, (rank, found)
        assert found["ops"] > 3_000, (rank, found)
    assert_clean(
        {
            f"rank {rank} {check}": items
            for rank in out
            for check, items in out[rank]["findings"].items()
        }
    )


@pytest.mark.parametrize("how", ["cancelled", "eval_first"])
def test_a_round_that_loads_nothing_is_ready_after_the_copies_that_load_its_rows(how):
    """A round whose ids all hit may hit rows an earlier round's copy is still landing: a round
    whose batch was cancelled (its rows stay resident), or a training round queued behind an
    evaluation batch that is forwarded first.  The step must be ordered after those copies: the
    recorder tracks the slot rows and finds the copy stream's write and the step's read
    unordered when the round's ready event is the plan stream's alone."""
    tables = make_tables()
    optim = SparseOptim("rowwise_adagrad", lr=0.1)
    with streams_override(RecordingStreams):
        rec = streams_for("cpu")
        cache = FreqCacheBackend(
            tables, optim, device="cpu", cache_ratio=0.05, policy="lru", lookahead=1
        )
        for t in (cache.transfers.cache_w, cache.transfers.cache_m):
            rec.track_rows(t)
        cache.import_tables(random_state(tables, optim))
        b = make_batch(np.random.default_rng(0), tables, 128)
        with rec.activate():
            cache.prefetch(b)
            cache.settle()
            loaded = cache.stats()["rows_loaded"]
            if how == "cancelled":
                cache.cancel_prefetch()
                cache.prefetch(b)
                cache.settle()
                rec.handed_to_step()
                cache(b)
            else:
                with torch.no_grad():  # the same ids, as an evaluation batch
                    cache.prefetch(b)
                    cache.settle()
                    rec.handed_to_step()
                    cache(b)
            assert loaded > 0 and cache.stats()["rows_loaded"] == loaded  # the second loads none
    assert rec.races == []
