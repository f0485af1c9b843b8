"""Training end to end on a small planted dataset: AUC above chance, exact resume, checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from tiny import TINY_MODEL

from dlrm_cache.commands.store import config_dir, register_configs
from dlrm_cache.train.loop import train
from dlrm_cache.train.saved import Checkpoint
from dlrm_cache.train.timing import seconds_since_process_start

# a small CPU training job (tiny MLPs, frequent logs): the integrity and reliability tests' base
SMALL = [
    "device=cpu",
    "progress=false",
    "data.batch_size=128",
    "data.eval_batch_size=1000",
    *TINY_MODEL,
    "log_every=2",
    "optim.sparse.lr=0.1",
    "optim.dense.lr=0.05",
    "optim.warmup_steps=0",  # tuned for tens of steps: the full rates from the first
]


def compose_train(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def base_overrides(data: Path, run_dir: Path) -> list[str]:
    return [
        f"data.path={data}",
        f"run_dir={run_dir}",
        "device=cpu",
        "progress=false",
        "data.batch_size=128",
        "data.eval_batch_size=512",
        "model.embedding_dim=8",
        "model.bottom_mlp=[32]",
        "model.top_mlp=[32]",
        "log_every=10",
        "optim.sparse.lr=0.1",
        "optim.dense.lr=0.05",
        "optim.warmup_steps=0",
    ]


def test_train_beats_chance_and_writes_run_dir(small_dataset: Path, tmp_path: Path):
    run = tmp_path / "run"
    summary = train(
        compose_train(
            base_overrides(small_dataset, run) + ["epochs=2", "eval_every=40", "test=true"]
        )
    )
    assert summary["steps"] == 2 * (6000 // 128)
    assert summary["val_auc"] > 0.65, summary
    assert 0 < summary["val_logloss"] < 0.69
    assert summary["test_samples"] == 1000 and summary["val_samples"] == 2000
    records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "start" and kinds[-1] == "summary"
    assert (
        sum(1 for r in records if r["kind"] == "eval" and r["split"] == "val") == 3
    )  # steps 40, 80, end
    assert (run / "checkpoints" / f"step_{summary['steps']:08d}" / "meta.json").is_file()
    assert json.loads((run / "summary.json").read_text())["steps"] == summary["steps"]
    # start-up: from the process start to the first step, inside this (longer-lived) process's age
    first = [r for r in records if r["kind"] == "first_step"]
    assert len(first) == 1 and first[0]["step"] == 0
    assert (
        0 < summary["startup_s"] == round(first[0]["startup_s"], 3) < seconds_since_process_start()
    )


def _params(ckpt: Path) -> dict[str, torch.Tensor]:
    """Dense parameters, embedding tables and optimizer state of a checkpoint, by name."""
    c = Checkpoint(ckpt)
    out = {f"dense.{k}": v for k, v in c.dense["model"].items()}
    out.update(c.tables(list(c.meta["tables"])))
    for i, s in c.dense["optimizer"]["state"].items():
        out.update({f"opt.{i}.{k}": v for k, v in s.items() if isinstance(v, torch.Tensor)})
    return out


def test_resume_continues_exactly(small_dataset: Path, tmp_path: Path):
    """Train 30 steps straight vs. 12 steps, stop, resume to 30: identical parameters and state."""
    straight, first = tmp_path / "straight", tmp_path / "first"
    train(compose_train(base_overrides(small_dataset, straight) + ["max_steps=30"]))
    train(compose_train(base_overrides(small_dataset, first) + ["max_steps=12"]))
    resumed = tmp_path / "resumed"
    train(
        compose_train(base_overrides(small_dataset, resumed) + ["max_steps=30", f"resume={first}"])
    )
    a = _params(straight / "checkpoints" / "step_00000030")
    b = _params(resumed / "checkpoints" / "step_00000030")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    # the resumed run did not silently start from scratch
    c = _params(first / "checkpoints" / "step_00000012")
    assert not torch.equal(a["C3.weight"], c["C3.weight"])


def test_resume_refuses_other_batch_size(small_dataset: Path, tmp_path: Path):
    first = tmp_path / "first"
    train(compose_train(base_overrides(small_dataset, first) + ["max_steps=3"]))
    cfg = compose_train(
        base_overrides(small_dataset, tmp_path / "r") + ["data.batch_size=64", f"resume={first}"]
    )
    with pytest.raises(ValueError, match="data.batch_size=128"):
        train(cfg)


def test_missing_dataset_names_the_path(tmp_path: Path):
    cfg = compose_train(base_overrides(tmp_path / "nowhere", tmp_path / "run"))
    with pytest.raises(FileNotFoundError, match="nowhere/manifest.json"):
        train(cfg)


def test_cli_multirun_sweep(small_dataset: Path, tmp_path: Path):
    """`-m` runs one job per value, each in its own run directory with its own summary."""
    from launching import run_cli

    args = [
        o
        for o in base_overrides(small_dataset, tmp_path)
        if not o.startswith(("run_dir=", "optim.sparse.lr="))
    ]
    res = run_cli("train", "-m", "optim.sparse.lr=0.05,0.2", "max_steps=3", *args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    summaries = sorted((tmp_path / "runs" / "multirun").rglob("summary.json"))
    assert [p.parent.name for p in summaries] == ["0", "1"]
    lrs = [
        json.loads(l)["config"]["optim"]["sparse"]["lr"]
        for p in summaries
        for l in (p.parent / "metrics.jsonl").read_text().splitlines()
        if json.loads(l)["kind"] == "start"
    ]
    assert lrs == [0.05, 0.2]


def test_lr_schedule_warmup_then_polynomial_decay():
    from dlrm_cache.train.schedule import lr_scale

    assert [lr_scale(s, 4) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert lr_scale(9, 4, decay_start=10, decay_steps=10) == 1.0
    assert lr_scale(15, 4, decay_start=10, decay_steps=10) == pytest.approx(0.25)
    assert lr_scale(25, 4, decay_start=10, decay_steps=10) == 0.0


def test_resume_is_exact_with_a_schedule(small_dataset: Path, tmp_path: Path):
    sched = ["optim.warmup_steps=5", "optim.decay_start=10", "optim.decay_steps=15"]
    straight, first = tmp_path / "straight", tmp_path / "first"
    train(compose_train(base_overrides(small_dataset, straight) + sched + ["max_steps=20"]))
    train(compose_train(base_overrides(small_dataset, first) + sched + ["max_steps=12"]))
    train(
        compose_train(
            base_overrides(small_dataset, tmp_path / "r")
            + sched
            + ["max_steps=20", f"resume={first}"]
        )
    )
    a, b = (
        _params(straight / "checkpoints" / "step_00000020"),
        _params(tmp_path / "r" / "checkpoints" / "step_00000020"),
    )
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


@pytest.mark.parametrize(
    "embedding, dataset", [("host", "small_dataset"), ("freq_cache", "processed_synth")]
)
def test_tables_larger_than_host_memory_fail_before_allocating(
    request, tmp_path: Path, embedding, dataset
):
    data = request.getfixturevalue(
        dataset
    )  # freq_cache needs the frequency statistics of a real run
    cfg = compose_train(
        base_overrides(data, tmp_path / "run")
        + [f"embedding={embedding}", "host_memory_gb=0.0001", "max_steps=2"]
    )
    with pytest.raises(ValueError, match=r"host_memory_gb: the embedding tables take .* GiB \(x2"):
        train(cfg)
    assert not (tmp_path / "run" / "checkpoints").exists()
