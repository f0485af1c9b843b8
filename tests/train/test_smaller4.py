"""Issue 38, target 7 (reliability round 4), the smaller ones for `train`: test=true without a test
split, a checkpoint's log_records beyond its run's log, a run directory on a full file system.
Through ``dlrm-cache``."""

from __future__ import annotations

import json
import resource
import shutil
import signal
from pathlib import Path

import pytest
from test_integrity import cli, one_line, train_args

from dlrm_cache.cli import main


@pytest.fixture(scope="module")
def data(tiny_dataset: Path) -> Path:
    return tiny_dataset


@pytest.fixture(scope="module")
def finished(data: Path, tmp_path_factory) -> Path:
    """A run of 4 steps with a checkpoint at step 2 and 4."""
    run = tmp_path_factory.mktemp("finished") / "run"
    code, err = cli(*train_args(data, run, "max_steps=4", "checkpoint_every=2"), cwd=run.parent)
    assert code == 0, err
    return run


def test_test_true_without_a_test_split_is_refused_before_training(data: Path, tmp_path: Path):
    """Before: trained, then ended with exit 0 and no word of the test split."""
    run = tmp_path / "run"
    code, err = cli(*train_args(data, run, "max_steps=2", "test=true"), cwd=tmp_path)
    one_line(code, err, "train", f"test=true: {data} has no test split (has train, val)")
    assert not (run / "metrics.jsonl").exists()


def test_log_records_beyond_the_log_are_refused_before_anything_moves(
    finished: Path, data: Path, tmp_path: Path
):
    """Before: accepted; the resume kept the later steps' records mid-file."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    meta_path = run / "checkpoints" / "step_00000002" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["log_records"] = 999
    meta_path.write_text(json.dumps(meta))
    shutil.rmtree(run / "checkpoints" / "step_00000004")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    log = (run / "metrics.jsonl").read_bytes()
    args = train_args(data, run, "max_steps=4", f"resume={run}")
    one_line(*cli(*args, cwd=tmp_path), "train", f"{meta_path}: log_records 999, but")
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    assert (run / "metrics.jsonl").read_bytes() == log


def test_a_run_dir_on_a_full_file_system_leaves_no_empty_files(capsys, data: Path, tmp_path: Path):
    """Before: an empty .hydra/config.yaml and train.log were left behind."""
    run = tmp_path / "run"
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (10, resource.RLIM_INFINITY))
    try:
        with pytest.raises(SystemExit) as e:
            main(train_args(data, run, "max_steps=2"))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        signal.signal(signal.SIGXFSZ, old)
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("dlrm-cache train: error: hydra.run.dir: "), lines
    assert not run.exists()
