"""The stream protocol as a tested contract: the real training loop, Pipeline and freq_cache on the
CPU with every stream operation recorded (stream_harness.RecordingStreams).

Per steady-state step, for look-ahead 1 and 2, with and without deferred batches, with an
evaluation and a checkpoint between steps: no host read waits for compute work of the step just
issued, no two streams touch the same rows unordered, and every tensor used off its allocating
stream is ``record_stream``-ed (or outlived by a host synchronization)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from stream_harness import RecordingStreams

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from launching import launch_ranks
from test_train import base_overrides, compose_train  # noqa: E402

from dlrm_cache.embedding.freq_cache import FreqCacheBackend
from dlrm_cache.streams import streams_for, streams_override
from dlrm_cache.train import build, metrics
from dlrm_cache.train.loop import train

STEPS = 12


def _tracked(init):
    """``FreqCacheBackend.__init__`` that also has the recorder check the cache's slot buffers and
    host store row by row."""

    def tracked_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        for t in (self.transfers.cache_w, self.transfers.cache_m, self.store.data):
            if t is not None:
                self.streams.track_rows(t)

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
    """Host reads that drained the step, but the loop's own loss read at its log interval."""
    return [r for r in rec.drains() if "train/loop.py" not in r.where]


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
    drained = steady(rec)
    assert not drained, "\n".join(
        f"{r.thread} {r.kind} on {r.stream} at {r.where}: waits for "
        f"{r.waits_for} compute ops of the step"
        for r in drained[:10]
    )
    assert not rec.races, "\n".join(rec.races[:10])
    assert not rec.unrecorded, "\n".join(rec.unrecorded[:10])
    assert rec.ops > 3_000 and rec.steps >= STEPS  # the whole loop ran under the recorder


def _recorded_rank(overrides: list[str]) -> dict:
    """One torchrun rank (gloo, CPU) training under its own recorder: what the checks found."""
    from hydra import compose, initialize_config_dir

    from dlrm_cache.configstore import config_dir, register_configs

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
        "drains": [
            f"{r.thread} {r.kind} on {r.stream} at {r.where}: {r.waits_for} ops"
            for r in steady(rec)
        ],
        "races": rec.races[:10],
        "unrecorded": rec.unrecorded[:10],
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
        assert not found["drains"], (rank, found["drains"])
        assert not found["races"], (rank, found["races"])
        assert not found["unrecorded"], (rank, found["unrecorded"])
