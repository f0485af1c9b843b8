"""Checks before allocation (issue 27, target 7), through the real command line: what fbgemm or
the allocator would refuse with a traceback, and checkpoint tensors that are not the model their
meta.json describes, are refused in one line naming the key or the file, before anything is built
or loaded."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from ckpt_files import record_file
from test_integrity import cli, one_line, train_args

STEP = "checkpoints/step_00000002"


@pytest.fixture(scope="module")
def data(tiny_dataset: Path) -> Path:
    return tiny_dataset


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
    """``run``'s dense.pt replaced by ``other``'s (another top MLP), its size and sha256 recorded."""
    step = run / STEP
    shutil.copy(other / STEP / "dense.pt", step / "dense.pt")
    record_file(step, "dense.pt")
    return f"{step / 'dense.pt'}: not the model {step / 'meta.json'} describes"


def _short_table(run: Path, other: Path) -> str:
    """Table C3 (1000 rows) cut to 999 rows in tables-rank0.pt, its size and sha256 recorded."""
    step = run / STEP
    tables = torch.load(step / "tables-rank0.pt", weights_only=True)
    tables["C3.weight"] = tables["C3.weight"][:999].clone()
    torch.save(tables, step / "tables-rank0.pt")
    record_file(step, "tables-rank0.pt")
    return (
        f"{step / 'tables-rank0.pt'}: C3.weight is float32 [999, 8] but meta.json makes "
        "it float32 [1000, 8]"
    )


def _flipped_byte(run: Path, other: Path) -> str:
    """One byte of table C3's first weight flipped on the disk (its exponent: a weight of 1e36 or
    so), the file's size unchanged.  Before: `predict` and `resume=` took the weight, exit 0."""
    path = run / STEP / "tables-rank0.pt"
    weight = torch.load(path, weights_only=True)["C3.weight"]
    data = bytearray(path.read_bytes())
    at = data.index(weight[:4].contiguous().numpy().tobytes()) + 3  # sign and exponent byte
    data[at] ^= 0x7E
    path.write_bytes(bytes(data))
    assert not torch.equal(torch.load(path, weights_only=True)["C3.weight"], weight)
    return f"{path}: its sha256 is not the one {run / STEP / 'meta.json'} records (damaged"


@pytest.mark.parametrize(
    "damage", [_swap_dense, _short_table, _flipped_byte], ids=["dense", "table", "flipped byte"]
)
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
