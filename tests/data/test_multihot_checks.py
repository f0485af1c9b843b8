"""`verify` and the loader check every element of a multi-hot list column, naming file and column."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from test_integrity import cli  # noqa: E402

from dlrm_cache.data.format import Manifest  # noqa: E402
from dlrm_cache.data.loader import ShardStream  # noqa: E402
from dlrm_cache.data.parquet import read_parquet, write_shard  # noqa: E402
from dlrm_cache.data.verify import VerifyConfig, verify  # noqa: E402


def _set_column(ds: Path, rel: str, name: str, make: Callable[[pa.ChunkedArray, int], pa.Array]):
    t = read_parquet(ds / rel)
    m = Manifest.load(ds)
    col = make(t.column(name), m.table_sizes[m.sparse_names.index(name)])
    write_shard(t.set_column(t.schema.get_field_index(name), name, col), ds / rel)


def _last_element_too_big(col: pa.ChunkedArray, size: int) -> pa.Array:
    """Only the last element of the last non-empty list is out of range (min/max of the
    first ids, or of the lists' lengths, would not see it)."""
    arr = col.combine_chunks()
    values = arr.values.to_numpy().copy()
    values[-1] = size
    return pa.ListArray.from_arrays(arr.offsets, pa.array(values))


DEFECTS = {
    "an id past its table inside a list": (_last_element_too_big, "holds ids outside [0, "),
    "a list that is null": (
        lambda col, size: pa.array([None] + col.to_pylist()[1:], col.type),
        "is not a list of ids per sample without nulls",
    ),
    "a multi-hot column stored one id per sample": (
        lambda col, size: pa.array([(x or [0])[0] for x in col.to_pylist()], pa.int32()),
        "is not a list of ids per sample without nulls",
    ),
}


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_list_columns_are_checked_element_by_element(
    multi_hot_dataset: Path, tmp_path: Path, defect: str
):
    ds = tmp_path / "ds"
    shutil.copytree(multi_hot_dataset, ds)
    verify(OmegaConf.structured(VerifyConfig(data_path=str(ds), progress=False)))  # clean before
    make, says = DEFECTS[defect]
    rel = Manifest.load(ds).splits["val"].shards[1]
    _set_column(ds, rel, "C4", make)
    code, err = cli("verify", str(ds), cwd=tmp_path)
    assert code == 1, err
    named = [ln for ln in err.splitlines() if f"{ds / rel}: column C4 " in ln and says in ln]
    assert len(named) == 1, err
    m = Manifest.load(ds)  # the loader's error is the same line
    with pytest.raises(ValueError) as loader:
        list(ShardStream(ds, m, "val", 100).batches())
    assert named[0].endswith(str(loader.value))


def test_a_one_hot_column_holding_lists_is_refused(multi_hot_dataset: Path, tmp_path: Path):
    ds = tmp_path / "ds"
    shutil.copytree(multi_hot_dataset, ds)
    rel = Manifest.load(ds).splits["train"].shards[0]
    _set_column(
        ds,
        rel,
        "C1",
        lambda col, size: pa.array([[x] for x in np.asarray(col)], pa.list_(pa.int32())),
    )
    with pytest.raises(ValueError) as loader:
        list(ShardStream(ds, Manifest.load(ds), "train", 100).batches())
    assert str(loader.value).startswith(f"{ds / rel}: column C1 holds list<")
