"""Ranks agree on the data, not only on the config (issue 27, target 3): two ranks on gloo whose
``data.path`` (the same string, relative) holds a different dataset on each (a copy per node)
stop at start, every rank with one line naming data.path, before the run directory is claimed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from launching import TORCHRUN_2, child_env, launch_ranks
from test_distributed import _overrides


def _node_entry(nodes: Path, overrides: list[str]):
    """One rank on "its node": its own working directory, where ``ds`` is its local copy."""
    from hydra import compose, initialize_config_dir

    from dlrm_cache.commands.store import config_dir, register_configs
    from dlrm_cache.train.loop import train

    os.chdir(nodes / f"node{os.environ['RANK']}")
    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    try:
        return train(cfg)
    except (ValueError, OSError) as e:
        return f"{type(e).__name__}: {e}"


SHAPE = {"train": 3000, "val": 1000}, [50, 200, 1000, 30, 500]


@pytest.mark.parametrize("rank1", ["another dataset", "no dataset"])
def test_ranks_reading_different_datasets_stop_naming_data_path(
    tmp_path: Path, dataset_writer, rank1: str
):
    """Before: "another dataset" (same table sizes and rows, other rows and statistics) trained
    to the end, a checkpoint of tables from one dataset and a dense part averaged over two;
    "no dataset": rank 0 waited for rank 1 in a collective until the timeout."""
    dataset_writer(tmp_path / "node0" / "ds", *SHAPE, seed=0)
    if rank1 == "another dataset":
        dataset_writer(tmp_path / "node1" / "ds", *SHAPE, seed=1)
    else:
        (tmp_path / "node1").mkdir()
    run = tmp_path / "run"
    out = launch_ranks(
        2, _node_entry, tmp_path, _overrides(Path("ds"), run, ["max_steps=4", "dist_timeout_s=60"])
    )
    for rank in (0, 1):
        msg = out[rank]
        assert isinstance(msg, str) and msg.startswith("SameOnEveryRank: data.path=ds: rank 1 "), (
            msg
        )
        assert "\n" not in msg
        if rank1 == "another dataset":
            assert "reads another dataset there than rank 0 (shard_footers differ)" in msg, msg
        else:
            assert f"cannot read it ({Path('ds') / 'manifest.json'}: no manifest" in msg, msg
    assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()


def test_torchrun_with_no_dataset_says_so_once(tmp_path: Path):
    """Every rank printed the same "rank 0 cannot read it" line (8 of them under 8 ranks): the
    ranks agree on the error, so rank 0 alone prints it; the job still exits 1 and leaves no run."""
    env = child_env(plain_errors=True)
    cmd = [*TORCHRUN_2, "train", "data.path=missing", "device=cpu", "dist_timeout_s=60"]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("dlrm-cache train: error:")]
    assert len(lines) == 1 and "data.path=missing: rank 0 cannot read it" in lines[0], res.stderr
    assert not [p for p in tmp_path.rglob("*") if not p.is_dir()]  # no run left
