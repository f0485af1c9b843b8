"""Signals are honoured everywhere (issue 27, target 8): SIGTERM during the final evaluation
stops it as it stops training (exit 143, the final checkpoint kept, a resume evaluates it), and no
read of a data, statistics or checkpoint path that is not a regular file (a FIFO, /dev/zero)
blocks the command: refused in one line naming it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from launching import ForkedCli
from test_integrity import _records, ended, one_line, train_args

SLOW_EVAL = ("data.eval_batch_size=1", "max_steps=2")  # 6000 one-row evaluation batches: ~4 s


def test_sigterm_during_the_final_evaluation_stops_it(tmp_path: Path, dataset_writer):
    """Before: "SIGTERM received" and then the whole evaluation, a summary and exit status 0."""
    ds = tmp_path / "ds"
    dataset_writer(ds, {"train": 1000, "val": 6000}, [50, 200, 1000, 30, 500], shard_rows=3000)
    d = tmp_path / "run"
    job = ForkedCli(*train_args(ds, d, *SLOW_EVAL), cwd=tmp_path)
    final = d / "checkpoints" / "step_00000002"
    while not (final / "meta.json").is_file():  # the final checkpoint: the evaluation follows
        assert job.poll() is None, "the job ended before it was signalled"
        time.sleep(0.01)
    time.sleep(0.3)
    job.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    code, err = ended(job, timeout=60)
    assert code == 143, err
    assert time.monotonic() - signalled < 3, "the evaluation went on"
    (line,) = [ln for ln in err.splitlines() if "stopped by" in ln]
    assert f"stopped by SIGTERM: checkpoint of step 2 in {final}" in line and f"resume={d}" in line
    assert "hydra.run.dir" not in line  # resume=RUN continues in RUN
    assert line in (d / "train.log").read_text()  # the log file holds what the console said
    assert not (d / "summary.json").exists()
    # the resume does no step and evaluates the final checkpoint
    code, err = ended(ForkedCli(*train_args(ds, d, *SLOW_EVAL, f"resume={d}"), cwd=tmp_path))
    assert code == 0, err
    assert json.loads((d / "summary.json").read_text())["val_samples"] == 6000


def test_a_periodic_evaluation_a_signal_cut_short_is_done_on_resume(tmp_path: Path, dataset_writer):
    """SIGTERM during the evaluation at step 2 saves step 2 without it; the resume evaluates
    step 2 before it trains on, so the log holds every evaluation an uninterrupted run's does
    (before: step 2's was lost)."""
    ds = tmp_path / "ds"
    dataset_writer(ds, {"train": 1000, "val": 3000}, [50, 200, 1000, 30, 500], shard_rows=3000)
    d = tmp_path / "run"
    args = ("data.eval_batch_size=1", "eval_every=2", "max_steps=4")  # 3000 one-row batches
    job = ForkedCli(*train_args(ds, d, *args), cwd=tmp_path)
    log = d / "metrics.jsonl"
    while not (log.is_file() and '"kind": "train"' in log.read_text()):  # step 2: then evaluated
        assert job.poll() is None, "the job ended before it was signalled"
        time.sleep(0.01)
    time.sleep(0.3)
    job.send_signal(signal.SIGTERM)
    code, err = ended(job, timeout=60)
    assert code == 143 and "checkpoint of step 2" in err, err
    assert _records(d, "eval") == []
    code, err = ended(ForkedCli(*train_args(ds, d, *args, f"resume={d}"), cwd=tmp_path))
    assert code == 0, err
    assert [(r["step"], r["samples"]) for r in _records(d, "eval")] == [(2, 3000), (4, 3000)]
    assert [r["step"] for r in _records(d, "checkpoint")] == [2, 4]


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


# what is replaced, by what, the command's arguments beyond the dataset, what the line names
CASES: dict[str, tuple[str, Callable[[Path], None], tuple[str, ...], str]] = {
    "manifest a FIFO": ("manifest.json", _fifo, (), "a FIFO, not a regular file"),
    "a shard a FIFO": ("val/part-00000.parquet", _fifo, (), "a FIFO, not a regular file"),
    "statistics /dev/zero (train)": (
        "stats/counts.parquet",
        _dev_zero,
        ("embedding=freq_cache",),
        "a device or socket, not a regular file",
    ),
    "statistics /dev/zero (verify)": (
        "stats/counts.parquet",
        _dev_zero,
        (),
        "a device or socket, not a regular file",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_path_that_is_not_a_regular_file_is_refused_not_read(
    processed_synth: Path, tmp_path: Path, case: str
):
    """Before: each of these waited forever (for a FIFO's writer, or for /dev/zero to end), and
    SIGTERM only set train's flag."""
    rel, replace, extra, says = CASES[case]
    ds = tmp_path / "ds"
    shutil.copytree(processed_synth, ds)
    replace(ds / rel)
    verify = "verify" in case
    args = ["verify", str(ds)] if verify else train_args(ds, tmp_path / "run", *extra)
    job = ForkedCli(*args, cwd=tmp_path)
    if not job.ended_within(60):
        pytest.fail(f"{case}: still reading after 60 s")
    code, err = ended(job)
    if verify:  # one line per bad file, then the count
        assert code == 1 and f"{ds / rel}: {says}" in err, err
    else:
        one_line(code, err, "train", f"{ds / rel}: {says}")
