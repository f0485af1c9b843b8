"""logger.tensorboard: the event file holds every number of every metrics.jsonl record, read back
by our CRC-checking reader and (when installed) by TensorBoard's own EventAccumulator."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from dlrm_cache.tensorboard import crc32c, masked_crc32c, read_scalars, record_scalars


def test_crc32c_known_values():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c(b"") == 0
    assert masked_crc32c(b"") == 0xA282EAD8


def test_event_file_mirrors_metrics_jsonl(cached_run):
    (events,) = cached_run.path.glob("events.out.tfevents.*")
    got = {(s.step, s.tag): s.value for s in read_scalars(events)}
    records = [
        json.loads(line) for line in (cached_run.path / "metrics.jsonl").read_text().splitlines()
    ]
    want = {}
    for r in records:
        for tag, value in record_scalars(r):
            want[(r.get("step", r.get("steps", 0)), tag)] = float(np.float32(value))
    assert got == want
    tags = {tag for _, tag in got}
    # what the issue asks to watch live: loss, samples/s, evaluation, cache hit rate, bytes moved
    assert {
        "train/loss",
        "train/samples_per_s",
        "val/auc",
        "val/logloss",
        "test/auc",
        "train/hit_rate",
        "train/bytes_loaded",
        "train/bytes_written_back",
    } <= tags
    assert [s for s, t in got if t == "train/loss"] == [10, 20, 30]
    assert [s for s, t in got if t == "val/auc"] == [20, 30]


def test_reader_refuses_a_damaged_file(cached_run, tmp_path):
    (events,) = cached_run.path.glob("events.out.tfevents.*")
    data = bytearray(events.read_bytes())
    length = struct.unpack("<Q", data[:8])[0]
    data[12 + length + 4 + 12 + 3] ^= 1  # a byte inside the second record
    (tmp_path / "bad").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="bad record at byte"):
        read_scalars(tmp_path / "bad")


def test_tensorboard_reads_it(cached_run):
    """TensorBoard itself (a dev-only check: it is not a dependency of dlrm-cache)."""
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(cached_run.path))
    acc.Reload()
    loss = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    records = [
        json.loads(line) for line in (cached_run.path / "metrics.jsonl").read_text().splitlines()
    ]
    assert loss == [
        (r["step"], float(np.float32(r["loss"]))) for r in records if r["kind"] == "train"
    ]
    assert acc.Scalars("test/auc")[0].value == pytest.approx(
        cached_run.summary["test_auc"], rel=1e-6
    )
