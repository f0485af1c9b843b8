"""logger.tensorboard: the event file holds every number of every metrics.jsonl record, read back
by our CRC-checking reader and (when installed) by TensorBoard's own EventAccumulator."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from dlrm_cache.rundir.tensorboard import crc32c, masked_crc32c, read_scalars, record_scalars


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
    # the cards that matter, grouped apart from the bookkeeping
    assert {t for t in tags if t.startswith("main/")} == {
        "main/loss",
        "main/samples_per_s",
        "main/hit_rate",
        "main/val_auc",
        "main/val_logloss",
        "main/test_auc",
        "main/test_logloss",
    }
    assert {"cache/bytes_loaded", "cache/bytes_written_back", "cache/rows_loaded"} <= tags
    assert {"tables/hit_rate/C3", "tables/accesses/C3", "time/startup_s", "time/stall_s"} <= tags
    assert {t.split("/")[0] for t in tags} == {
        "main", "cache", "tables", "time", "start", "train", "val", "test", "summary", "best"
    }  # fmt: skip
    assert [s for s, t in got if t == "main/loss"] == [10, 20, 30]
    assert [s for s, t in got if t == "main/val_auc"] == [20, 30]


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
    loss = [(e.step, e.value) for e in acc.Scalars("main/loss")]
    records = [
        json.loads(line) for line in (cached_run.path / "metrics.jsonl").read_text().splitlines()
    ]
    assert loss == [
        (r["step"], float(np.float32(r["loss"]))) for r in records if r["kind"] == "train"
    ]
    assert acc.Scalars("main/test_auc")[0].value == pytest.approx(
        cached_run.summary["test_auc"], rel=1e-6
    )
