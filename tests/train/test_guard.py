"""The loss guard at any batch size (issue 27, target 9): a healthy run at data.batch_size=1 runs
to the end, and damage still stops it, naming the step and the shard."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from shards import write_split
from test_integrity import cli, one_line, train_args

from dlrm_cache.data.format import (
    DENSE_NAMES,
    LABEL,
    SCHEMA_VERSION,
    SPARSE_NAMES,
    Manifest,
)
from dlrm_cache.train.guard import CHANCE, LossGuard

SIZES = [20, 20]


def _confident(root: Path, damaged: bool = False) -> Path:
    """Labels that C1 decides (id < 10 clicks) and I1 shows, one in a thousand flipped: a model becomes sure
    of itself (mean loss ~0.005) and each flipped label costs ~15, over 1000x a typical sample.
    ``damaged``: the second training shard's dense values 10^4 times what they were."""
    rng = np.random.default_rng(0)

    def shard_tables(split: str, n: int, parts: int):
        for k in range(parts):
            m = n // parts
            ids = [rng.integers(0, s, m) for s in SIZES]
            labels = (ids[0] < 10).astype(np.float32)
            dense = rng.random((len(DENSE_NAMES), m)).astype(np.float32)
            dense[0] += labels  # I1 tells too: the model's dense part has weight to lose
            flip = rng.random(m) < 1e-3
            labels[flip] = 1 - labels[flip]
            if damaged and split == "train" and k == 1:
                dense *= 1e4
            cols = {LABEL: labels, **dict(zip(DENSE_NAMES, dense))}
            cols.update({nm: i.astype(np.int32) for nm, i in zip(SPARSE_NAMES, ids)})
            yield cols

    splits = {
        split: write_split(root, split, shard_tables(split, n, parts))
        for split, n, parts in (("train", 2400, 2), ("val", 500, 1))
    }
    Manifest(
        SCHEMA_VERSION, SIZES, splits, "none", 1, 0, [], sparse_names=SPARSE_NAMES[: len(SIZES)]
    ).save(root)
    return root


ONE = ("data.batch_size=1", "data.shuffle=false", "log_every=100", "epochs=1")


def test_batch_size_one_healthy_run_is_not_stopped(tmp_path: Path):
    """Before: stopped at step ~1350, a flipped label's 15 being "more than 10x" the largest loss
    (0.006) of 1000 single samples."""
    ds = _confident(tmp_path / "ds")
    d = tmp_path / "run"
    code, err = cli(*train_args(ds, d, *ONE), cwd=tmp_path)
    assert code == 0, err
    summary = json.loads((d / "summary.json").read_text())
    assert summary["steps"] == 2400 and summary["val_auc"] > 0.99


def test_batch_size_one_damage_is_still_caught(tmp_path: Path):
    """The second shard (rows 1200..2399) with dense values 10^4 too large: its I1 still points
    the right way, so its rows cost nothing until the first label that disagrees, whose loss (~1e5)
    lifts the mean of 1024 samples far past 10x chance at that step: stopped inside the shard,
    naming it; no summary."""
    ds = _confident(tmp_path / "ds", damaged=True)
    d = tmp_path / "run"
    err = one_line(
        *cli(*train_args(ds, d, *ONE), cwd=tmp_path),
        "train",
        "over its last 1024 samples) is more than 10x the loss of chance",
        f"on a batch from {ds / 'train/part-00001.parquet'};",
    )
    step = int(err.split("step ")[1].split(":")[0])
    assert 1200 < step <= 2400, err
    assert not (d / "summary.json").exists()


@pytest.mark.parametrize("batch", [1, 100, 4096])
def test_guard_judges_the_mean_of_1024_samples(batch: int):
    """A sample's loss 1000x the typical one passes at any batch size; a sustained loss 10x
    chance stops it within the steps of 1024 samples; NaN stops it at its step."""
    guard = LossGuard(10.0, "ds", batch)
    span = -(-1024 // batch)
    for _ in range(3 * span):
        assert guard.judge(0.005) is None
    assert guard.judge(15.0 if batch == 1 else 0.005) is None
    bad = [guard.judge(10 * CHANCE * 1.01) for _ in range(span)]
    assert bad[-1] is not None and "is more than 10x the loss of chance" in bad[-1]
    assert guard.judge(float("nan")) == " is not finite"
