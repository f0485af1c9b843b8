"""Issue 38, target 7 (reliability round 4): a dataset rebuilt (`preprocess overwrite=true`) while
it is read stops the reader, in one line for `train`, rather than mix two datasets in one run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from launching import ForkedCli
from test_integrity import ended, one_line, train_args

from dlrm_cache.data.format import Manifest
from dlrm_cache.data.loader import ShardStream
from dlrm_cache.files.atomic import replace_dir

TABLES = [50, 200, 1000, 30, 500]


def _rebuild(root: Path, dataset_writer, seed: int = 1) -> None:
    """``root`` replaced by another dataset of the same tables (as `preprocess overwrite=true`
    replaces one: built beside it, then renamed into place; its statistics' digest is another)."""
    new = root.parent / f"{root.name}.new"
    manifest = dataset_writer(new, {"train": 2000, "val": 500}, TABLES, shard_rows=100, seed=seed)
    manifest.stats_digest = f"rebuilt with seed {seed}"
    manifest.save(new)
    replace_dir(new, root)


def test_a_stream_stops_at_the_first_shard_read_after_its_dataset_was_replaced(
    dataset_writer, tmp_path: Path
):
    """Before: the stream went on with the new dataset's shards (the loss jumped, exit 0)."""
    root = tmp_path / "ds"
    dataset_writer(root, {"train": 2000, "val": 500}, TABLES, shard_rows=100)
    manifest = Manifest.load(root)
    batches = ShardStream(root, manifest, "train", 50).batches(epoch=0)
    next(batches)
    _rebuild(root, dataset_writer)
    with pytest.raises(ValueError, match="changed while this command read the dataset"):
        for _ in batches:
            pass
    with pytest.raises(ValueError, match=r"manifest.json: changed while"):
        ShardStream(root, manifest, "val", 50)  # a stream made later, as the test split's


def test_train_stops_in_one_line_when_its_dataset_is_rebuilt_under_it(
    dataset_writer, tmp_path: Path
):
    root = tmp_path / "ds"
    dataset_writer(root, {"train": 2000, "val": 500}, TABLES, shard_rows=100)
    run = tmp_path / "run"
    job = ForkedCli(*train_args(root, run, "epochs=1000", "data.batch_size=50"), cwd=tmp_path)
    log, t0 = run / "metrics.jsonl", time.monotonic()
    while not (log.is_file() and '"kind": "train"' in log.read_text()):  # training has started
        assert job.poll() is None and time.monotonic() - t0 < 120
        time.sleep(0.05)
    _rebuild(root, dataset_writer)
    code, err = ended(job)
    one_line(code, err, "train", "changed while this command read the dataset", str(root))
