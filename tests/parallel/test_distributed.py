"""Two-process CPU (gloo) training: same parameters as one process on the same global batches."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
from launching import TORCHRUN_2, child_env, launch_ranks
from tiny import TINY_MODEL

from dlrm_cache.parallel.placement import parse_key
from dlrm_cache.train.saved import Checkpoint


def _overrides(data: Path, run_dir: Path, extra: list[str]) -> list[str]:
    return [
        f"data.path={data}",
        f"run_dir={run_dir}",
        "device=cpu",
        "progress=false",
        # 2000 validation rows in batches of 1999: the last batch has 1 row, so one rank gets none
        "data.batch_size=128",
        "data.eval_batch_size=1999",
        *TINY_MODEL,
        "log_every=5",
        "data.shuffle=true",
        "optim.sparse.lr=0.1",
        "optim.dense.name=sgd",
        "optim.dense.lr=0.1",
        *extra,
    ]


def _train_entry(overrides: list[str], per_rank: dict[int, list[str]]):
    """Runs in each launched process: compose the config like the CLI does and train."""
    from hydra import compose, initialize_config_dir

    from dlrm_cache.commands.store import config_dir, register_configs
    from dlrm_cache.train.loop import train

    rank = int(os.environ["RANK"])
    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides + per_rank.get(rank, []))
    try:
        return train(cfg)
    except ValueError as e:
        return f"ValueError: {e}"


def launch(
    nproc: int,
    overrides: list[str],
    per_rank: dict[int, list[str]] | None = None,
    expect_ok: bool = True,
):
    out = launch_ranks(nproc, _train_entry, overrides, per_rank or {})
    if expect_ok:
        for rank, result in out.items():
            assert isinstance(result, dict), f"rank {rank}: {result}"
    return out


def run_single(overrides: list[str]):
    """One process, in this interpreter (no launcher start-up cost)."""
    out = {0: _train_entry(overrides, {})} if "RANK" in os.environ else _in_process(overrides)
    assert isinstance(out[0], dict), out[0]
    return out


def _in_process(overrides: list[str]):
    os.environ["RANK"] = "0"
    try:
        return {0: _train_entry(overrides, {})}
    finally:
        del os.environ["RANK"]


def _state(ckpt: Path) -> dict[str, torch.Tensor]:
    """Dense parameters and whole tables (row-wise shards reassembled) of a checkpoint."""
    c = Checkpoint(ckpt)
    out = {f"dense.{k}": v for k, v in c.dense["model"].items()}
    whole = sorted({f"{table}.{field}" for table, _, _, field in map(parse_key, c.meta["tables"])})
    out.update(c.tables(whole))
    return out


@pytest.mark.parametrize("row_wise", [False, True])
def test_two_ranks_match_one_rank(small_dataset: Path, tmp_path: Path, row_wise: bool):
    """Table-wise, and with every table over 100 rows split row-wise across both ranks."""
    steps = ["max_steps=20"] + (["shard_rows_above=100"] if row_wise else [])
    one = run_single(_overrides(small_dataset, tmp_path / "one", steps))
    two = launch(2, _overrides(small_dataset, tmp_path / "two", steps))
    a, b = (
        _state(tmp_path / "one/checkpoints/step_00000020"),
        _state(tmp_path / "two/checkpoints/step_00000020"),
    )
    assert a.keys() == b.keys() and any(k.startswith("C") for k in a)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    # the tables really were split over both ranks, and the metrics agree
    stored = Checkpoint(tmp_path / "two/checkpoints/step_00000020").meta["tables"]
    assert set(stored.values()) == {"tables-rank0.pt", "tables-rank1.pt"}
    assert any(":" in k for k in stored) == row_wise  # e.g. C3:0-500.weight
    assert two[0]["val_samples"] == 2000 and two[0]["train_samples"] == 20 * 128
    assert abs(one[0]["val_auc"] - two[0]["val_auc"]) < 1e-4


def test_two_rank_checkpoint_resumes_on_one_rank(small_dataset: Path, tmp_path: Path):
    """Written by 2 ranks with row-wise shards, reassembled into whole tables by 1 rank."""
    launch(2, _overrides(small_dataset, tmp_path / "two", ["max_steps=10", "shard_rows_above=100"]))
    run_single(
        _overrides(small_dataset, tmp_path / "one", ["max_steps=20", f"resume={tmp_path / 'two'}"])
    )
    straight = run_single(_overrides(small_dataset, tmp_path / "straight", ["max_steps=20"]))
    a, b = (
        _state(tmp_path / "one/checkpoints/step_00000020"),
        _state(tmp_path / "straight/checkpoints/step_00000020"),
    )
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    assert straight[0]["steps"] == 20


def test_mismatched_configs_fail_fast(small_dataset: Path, tmp_path: Path):
    out = launch(
        2,
        _overrides(small_dataset, tmp_path / "r", ["max_steps=2"]),
        {1: ["optim.sparse.lr=0.2"]},
        expect_ok=False,
    )
    for rank in (0, 1):
        assert "different configs: optim.sparse.lr=0.1 on rank 0 but 0.2 on rank 1" in out[rank]


def test_too_little_host_memory_fails_fast(small_dataset: Path, tmp_path: Path):
    out = launch(
        2,
        _overrides(small_dataset, tmp_path / "r", ["max_steps=2", "host_memory_gb=0.00001"]),
        expect_ok=False,
    )
    for rank in (0, 1):
        assert "2 rank(s) cannot hold the tables: they need" in out[rank], out[rank]


def test_torchrun_cli_one_run_dir(small_dataset: Path, tmp_path: Path):
    """The real launcher and console entry: one run directory, one metrics file, rank 0 prints."""
    env = child_env()
    cmd = [
        *TORCHRUN_2,
        "train",
        *[
            o
            for o in _overrides(small_dataset, tmp_path, ["max_steps=6"])
            if not o.startswith("run_dir=")
        ],
    ]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = [p.parent for p in (tmp_path / "runs" / "train").rglob("metrics.jsonl")]
    assert len(runs) == 1, runs
    assert res.stdout.count("dlrm-cache train:") == 1  # the summary table, from rank 0 only
    assert (runs[0] / "checkpoints" / "step_00000006" / "meta.json").is_file()
    assert {p.name for p in runs[0].glob("*.log")} == {"train.log", "train-rank1.log"}
    assert "embedding placement (2 ranks)" in (runs[0] / "train.log").read_text()


def test_sharded_freq_cache_matches_single_process_host(processed_synth: Path, tmp_path: Path):
    """Each rank keeps its tables behind its own cache; the model is still the uncached one."""
    steps = ["max_steps=12"]
    run_single(_overrides(processed_synth, tmp_path / "host", steps))
    out = launch(
        2,
        _overrides(
            processed_synth,
            tmp_path / "cache",
            steps
            + [
                "embedding=freq_cache",
                "embedding.cache_ratio=0.05",
                "embedding.lookahead=2",
                "shard_rows_above=50",
            ],
        ),
    )
    a, b = (
        _state(tmp_path / "host/checkpoints/step_00000012"),
        _state(tmp_path / "cache/checkpoints/step_00000012"),
    )
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)
    assert out[0]["embedding_rows_loaded"] > 0 and 0 < out[0]["embedding_hit_rate"] < 1


def test_a_batch_the_ranks_cannot_split_is_refused_before_a_resume_sets_anything_aside(
    small_dataset: Path, tmp_path: Path
):
    """A one-process run of batch 129 resumed into its own run dir on 2 ranks: refused naming the
    key before the run dir is claimed, so the checkpoints after the resumed one stay where they
    were (before: the branch was set aside into abandoned/, then the batch was refused)."""
    run = tmp_path / "r"
    odd = ["data.batch_size=129", "max_steps=4", "checkpoint_every=2"]
    run_single(_overrides(small_dataset, run, odd))
    later = run / "checkpoints" / "step_00000004"
    assert later.is_dir()
    resume = [f"resume={run / 'checkpoints' / 'step_00000002'}"]
    out = launch(2, _overrides(small_dataset, run, odd + resume), expect_ok=False)
    for rank in (0, 1):
        assert "data.batch_size=129: must be a positive multiple of the number of ranks (2)" in str(
            out[rank]
        ), out[rank]
    assert later.is_dir() and not (run / "abandoned").exists()
