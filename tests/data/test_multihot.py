"""`preprocess input=<one-hot dataset> multi_hot_sizes=...`: MLPerf DLRM v2's synthetic multi-hot
set, checked against MLPerf's rule written out here (numpy's global generator, as its
multi_hot.py uses it) and counts recomputed with pandas."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from launching import run_cli
from omegaconf import OmegaConf

from dlrm_cache.data.config import PreprocessConfig
from dlrm_cache.data.format import MLPERF_MULTI_HOT_SIZES, Manifest
from dlrm_cache.data.multihot import parse_sizes
from dlrm_cache.data.preprocess import PreprocessError, preprocess
from dlrm_cache.data.verify import VerifyConfig, verify


def _mlperf_tables(sizes: list[int], rows: list[int], dist: str, seed: int) -> list[np.ndarray]:
    """MLPerf's one-hot -> multi-hot lookup tables, row x = the list of id x."""
    state = np.random.get_state()
    np.random.seed(seed)
    out = []
    for n, s in zip(rows, sizes):
        ids = np.arange(n)[:, None]
        if dist == "uniform":
            extra = np.random.randint(0, n, size=(n, s - 1))
        else:
            with np.errstate(invalid="ignore"):
                extra = np.random.pareto(a=0.25, size=(n, s - 1)).astype(np.int32) % n
        out.append(np.concatenate((ids, extra), axis=-1))
    np.random.set_state(state)
    return out


def _column(root: Path, m: Manifest, split: str, name: str) -> np.ndarray:
    """A split's ids of feature ``name``: ``[rows]``, or ``[rows, size]`` for lists of one size."""
    parts = []
    for rel in m.splits[split].shards:
        col = pq.read_table(root / rel)[name].combine_chunks()
        if hasattr(col, "offsets"):
            lengths = np.diff(col.offsets.to_numpy())
            assert len(set(lengths)) == 1  # MLPerf's lists: all of the table's size
            parts.append(col.values.to_numpy().reshape(len(col), lengths[0]))
        else:
            parts.append(col.to_numpy())
    return np.concatenate(parts)


def _check(src: Path, out: Path, sizes: list[int], dist: str, seed: int) -> None:
    one, m = Manifest.load(src), Manifest.load(out)
    assert m.multi_hot == [f for f, s in zip(m.sparse_names, sizes) if s > 1]
    assert m.splits == one.splits and m.table_sizes == one.table_sizes  # nothing folded
    tables = _mlperf_tables(sizes, one.table_sizes, dist, seed)
    counts = pq.read_table(out / "stats/counts.parquet").to_pandas()
    summary = json.loads((out / "stats/summary.json").read_text())["features"]
    for j, name in enumerate(m.sparse_names):
        n = one.table_sizes[j]
        train = tables[j][_column(src, one, "train", name)]
        seen = pd.Series(train.ravel()).value_counts()
        rare = int(seen.pop(n - 1)) if n - 1 in seen.index else 0  # the input's rare row
        want = sorted(seen.items(), key=lambda kv: (-kv[1], kv[0]))
        got = counts[counts.feature == name]
        assert list(zip(got.id, got["count"])) == want
        assert summary[name]["rare_count"] == rare
        order = np.append(got.id.to_numpy(), n - 1)  # new row -> input row
        for split in m.splits:
            lists = _column(out, m, split, name)
            ids = tables[j][_column(src, one, split, name)]
            if sizes[j] == 1:
                assert np.array_equal(order[lists], ids[:, 0])
            else:
                assert np.array_equal(order[lists], ids)  # [x, *T[x]] for every row


def test_mlperf_sizes_through_the_cli(processed_synth: Path, tmp_path: Path):
    out = tmp_path / "mh"
    args = ["preprocess", f"input={processed_synth}", f"output={out}", "progress=false"]
    # a child process: fbgemm prints its load lines when first imported, which this process did
    done = run_cli(*args, "multi_hot_sizes=mlperf", cwd=tmp_path, process=True)
    assert done.returncode == 0, done.stderr[-2000:]
    # issue 38 target 7: fbgemm's INFO line per library it loads (14 of them before) is not shown
    assert "Successfully loaded" not in done.stdout + done.stderr
    _check(processed_synth, out, MLPERF_MULTI_HOT_SIZES, "uniform", 0)
    again = run_cli(*args, "multi_hot_sizes=mlperf", cwd=tmp_path)
    assert "up to date, reusing" in again.stdout
    other = PreprocessConfig(
        input=str(processed_synth), output=str(out), multi_hot_sizes="mlperf", multi_hot_seed=1
    )
    with pytest.raises(PreprocessError, match="pass overwrite=true"):
        preprocess(other)
    verify(OmegaConf.structured(VerifyConfig(data_path=str(out), progress=False)))


def test_pareto_and_own_sizes(processed_synth: Path, tmp_path: Path):
    sizes = [4, 1, 3] + [1] * 17 + [20] + [1] * 5
    cfg = PreprocessConfig(
        input=str(processed_synth),
        output=str(tmp_path / "p"),
        multi_hot_sizes=sizes,
        multi_hot_distribution="pareto",
        multi_hot_seed=7,
        progress=False,
        workers=1,
    )
    preprocess(cfg)
    _check(processed_synth, tmp_path / "p", sizes, "pareto", 7)


@pytest.mark.parametrize(
    "what,says",
    [
        ("multi-hot input", "already multi-hot (C2, C4); give a one-hot dataset"),
        ("raw input", "is not a processed dataset (no manifest.json)"),
        ("sizes unset", "set multi_hot_sizes (mlperf, or 5 ints)"),
        ("mlperf on 5 tables", "multi_hot_sizes=mlperf: has 26 sizes, the data have 5 features"),
    ],
)
def test_bad_requests_say_why(
    multi_hot_dataset: Path, shared_small_dataset: Path, tmp_path: Path, what: str, says: str
):
    inp, sizes = shared_small_dataset, "mlperf"
    if what == "multi-hot input":
        inp = multi_hot_dataset
    elif what == "raw input":
        inp = tmp_path / "raw"
        inp.mkdir()
        (inp / "day_0").write_text("")
    elif what == "sizes unset":
        sizes = []
    cfg = PreprocessConfig(
        input=str(inp), output=str(tmp_path / "o"), multi_hot_sizes=sizes, workers=1
    )
    with pytest.raises(PreprocessError, match=says.replace("(", r"\(").replace(")", r"\)")):
        preprocess(cfg)
    assert not (tmp_path / "o").exists()


def test_sizes_are_integers_or_refused_naming_the_key():
    """A float is never rounded, a word is named with its place, one int is every feature's."""
    assert parse_sizes(3, 4) == [3, 3, 3, 3]
    assert parse_sizes(OmegaConf.create({"s": [2, 1, 3]}).s, 3) == [2, 1, 3]
    for value, says in [
        ([2.5, 1, 1], r"multi_hot_sizes\[0\]=2.5: not an integer"),
        ([1, "a", 1], r"multi_hot_sizes\[1\]='a': not an integer"),
        ([1, 1, True], r"multi_hot_sizes\[2\]=True: not an integer"),
        (2.0, r"multi_hot_sizes=2.0: give 'mlperf', one int or a list of 3 ints"),
        (0, r"need 3 ints >= 1, got \[0, 0, 0\]"),
    ]:
        with pytest.raises(ValueError, match=says):
            parse_sizes(value, 3)


def test_sizes_too_big_for_memory_are_refused_before_anything_is_drawn(
    shared_small_dataset: Path, tmp_path: Path
):
    """A size of 10^8 (numpy asked for 958 GiB with a traceback): one line through the CLI naming
    the key, the feature and the bytes; nothing written.  A float size: one line too."""
    args = ("preprocess", f"input={shared_small_dataset}", "output=o", "workers=1",
            "progress=false")  # fmt: skip
    rows = max(r for i in Manifest.load(shared_small_dataset).splits.values() for r in i.shard_rows)
    r = run_cli(*args, "multi_hot_sizes=[2,100000000,1,1,1]", cwd=tmp_path)
    assert r.returncode == 1
    (line,) = r.stderr.strip().splitlines()
    need = rows * 100000000 * 8 * 3
    assert "multi_hot_sizes: " in line and "Traceback" not in r.stderr
    assert f"size 100000000 of C2 expands a shard of {rows:,} rows to {need:,} bytes" in line or (
        "the lookup tables need" in line
    ), line
    r = run_cli(*args, "multi_hot_sizes=[2.5,1,1,1,1]", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "dlrm-cache preprocess: error: multi_hot_sizes[0]=2.5: not an integer (ids per sample)"
    ], r.stderr
    assert not any(tmp_path.iterdir()) or list(tmp_path.iterdir()) == [tmp_path / "outputs"]
