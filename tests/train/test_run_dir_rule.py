"""Issue 38, target 7 (reliability round 4): `train`'s run directory by the outputs rule: one that
holds its dataset (which ``overwrite=true`` would empty), or lies in a dataset.  Through
``dlrm-cache`` in a child process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_integrity import cli, one_line, train_args

from dlrm_cache.data.format import Manifest


@pytest.fixture(scope="module")
def data(tiny_dataset: Path) -> Path:
    return tiny_dataset


def test_a_run_dir_holding_its_dataset_is_refused_before_overwrite_removes_it(
    data: Path, tmp_path: Path
):
    """Before: `overwrite=true` emptied the run directory, the dataset inside it included, then
    failed reading it."""
    run = tmp_path / "run"
    inside = run / "checkpoints" / "ds"
    inside.parent.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    shutil.copytree(data, inside)
    code, err = cli(*train_args(inside, run, "max_steps=2", "overwrite=true"), cwd=tmp_path)
    one_line(code, err, "train", f"hydra.run.dir={run}: would contain the dataset {inside}")
    assert Manifest.load(inside).splits.keys() == {"train", "val"}


@pytest.mark.parametrize("where", [".", "run"], ids=["the dataset", "inside it"])
def test_a_run_dir_in_a_dataset_is_refused_and_nothing_is_written_there(
    data: Path, tmp_path: Path, where: str
):
    """Before: train wrote its run (.hydra/, train.log, metrics.jsonl) into the dataset."""
    before = sorted(p.relative_to(data) for p in data.rglob("*"))
    run = (data / where).resolve()
    code, err = cli(*train_args(data, run, "max_steps=2"), cwd=tmp_path)
    one_line(code, err, "train", f"hydra.run.dir={run}")
    assert sorted(p.relative_to(data) for p in data.rglob("*")) == before
    assert json.loads((data / "manifest.json").read_text())
