"""Checks before allocation (issue 27, target 7), through the real command line: what fbgemm or
the allocator would refuse with a traceback, and checkpoint tensors that are not the model their
meta.json describes, are refused in one line naming the key or the file, before anything is built
or loaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_integrity import cli, one_line, train_args

STEP = "checkpoints/step_00000002"


@pytest.fixture(scope="module")
def data(tmp_path_factory, dataset_writer) -> Path:
    root = tmp_path_factory.mktemp("preflight") / "ds"
    dataset_writer(root, {"train": 2000, "val": 500}, [50, 200, 1000, 30, 500])
    return root


@pytest.fixture(scope="module")
def trained(data: Path, tmp_path_factory) -> dict[str, Path]:
    """Two finished runs that differ in their top MLP (16 and 32 units)."""
    tmp = tmp_path_factory.mktemp("runs")
    runs = {}
    for width in (16, 32):
        runs[width] = tmp / f"top{width}"
        args = train_args(data, runs[width], "max_steps=2", f"model.top_mlp=[{width}]")
        code, err = cli(*args, cwd=tmp)
        assert code == 0, err
    return runs


def test_embedding_dim_fbgemm_cannot_use_is_refused_at_composition(data: Path, tmp_path: Path):
    """Before: fbgemm's AssertionError traceback after the run had started."""
    d = tmp_path / "run"
    one_line(
        *cli(*train_args(data, d, "model.embedding_dim=6"), cwd=tmp_path),
        "train",
        "model.embedding_dim=6: must be a multiple of 4",
    )
    assert not (d / "metrics.jsonl").exists()


def test_dense_layers_larger_than_memory_are_refused_before_allocating(data: Path, tmp_path: Path):
    """2 x 10^10 parameters (with Adagrad: 224 GiB): one line naming the key that holds them
    (before: the allocator's traceback, or the machine swapping)."""
    err = one_line(
        *cli(
            *train_args(data, tmp_path / "run", "model.top_mlp=[100000,100000,100000]"),
            cwd=tmp_path,
        ),
        "train",
        "model.top_mlp=[100000, 100000, 100000]: the dense layers' 20,002,700,361 parameters",
        "GiB with their gradients and optim.dense.name=adagrad state, but",
        "use smaller layers",
    )
    assert "model.bottom_mlp" not in err


def _swap_dense(run: Path, other: Path) -> str:
    """``run``'s dense.pt replaced by ``other``'s (another top MLP), its size recorded."""
    step = run / STEP
    shutil.copy(other / STEP / "dense.pt", step / "dense.pt")
    meta = json.loads((step / "meta.json").read_text())
    meta["files"]["dense.pt"] = (step / "dense.pt").stat().st_size
    (step / "meta.json").write_text(json.dumps(meta))
    return f"{step / 'dense.pt'}: not the model {step / 'meta.json'} describes"


def _short_table(run: Path, other: Path) -> str:
    """Table C3 (1000 rows) cut to 999 rows in tables-rank0.pt, its size recorded."""
    step = run / STEP
    tables = torch.load(step / "tables-rank0.pt", weights_only=True)
    tables["C3.weight"] = tables["C3.weight"][:999].clone()
    torch.save(tables, step / "tables-rank0.pt")
    meta = json.loads((step / "meta.json").read_text())
    meta["files"]["tables-rank0.pt"] = (step / "tables-rank0.pt").stat().st_size
    (step / "meta.json").write_text(json.dumps(meta))
    return (
        f"{step / 'tables-rank0.pt'}: C3.weight is float32 [999, 8] but meta.json makes "
        "it float32 [1000, 8]"
    )


@pytest.mark.parametrize("damage", [_swap_dense, _short_table], ids=["dense", "table"])
def test_checkpoint_tensors_unlike_its_config_are_refused_naming_the_file(
    trained: dict[str, Path], data: Path, tmp_path: Path, damage
):
    """`train resume=` and `predict` (before: load_state_dict / copy_ tracebacks); the resume
    leaves the run directory as it was."""
    run = tmp_path / "run"
    shutil.copytree(trained[16], run)
    says = damage(run, trained[32])
    before = (run / "metrics.jsonl").read_bytes()
    args = train_args(data, run, "max_steps=4", "model.top_mlp=[16]", f"resume={run}")
    one_line(*cli(*args, cwd=tmp_path), "train", says)
    assert (run / "metrics.jsonl").read_bytes() == before
    out = tmp_path / "p.parquet"
    predict = ["predict", f"checkpoint={run}", f"input={data}", f"output={out}"]
    predict += ["split=val", "progress=false"]
    one_line(*cli(*predict, cwd=tmp_path), "predict", says)
    assert not out.exists()


def test_a_run_and_a_dataset_stay_apart(dataset_writer, tmp_path: Path):
    """``hydra.run.dir=<dataset>/run`` trained, and `preprocess overwrite=true` of the dataset
    would then delete the run; a dataset in a run dir is emptied by `train overwrite=true` there.
    Both are refused in one line before the run starts, the dataset left as it was."""
    ds = tmp_path / "ds"
    dataset_writer(ds, {"train": 2000, "val": 500}, [50, 200, 1000, 30, 500])
    before = sorted(ds.rglob("*"))
    err = one_line(*cli(*train_args(ds, ds / "run"), cwd=tmp_path), "train", "run dir")
    assert f"lies inside the dataset {ds}, which `preprocess overwrite=true`" in err, err
    assert sorted(ds.rglob("*")) == before  # the run dir Hydra made there is gone
    run = tmp_path / "run"
    shutil.copytree(ds, run / "ds")
    err = one_line(*cli(*train_args(run / "ds", run), cwd=tmp_path), "train", "data.path=")
    assert f"lies inside the run directory {run}" in err, err
    assert not (run / "metrics.jsonl").exists() and (run / "ds" / "manifest.json").is_file()
