"""A user's own dataset (not Criteo) end to end through the real CLI: parquet input with 5 dense
and 8 sparse columns of other names -> preprocess -> train -> predict on raw input -> export ->
verify; every raw row scores exactly as the same row of the processed test split (one-hot, and
multi-hot: list columns through the jagged path, in blocks joined and cut across batches); and
Criteo's text layout with multi-hot C columns, raw lines scored as the processed split's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from launching import run_cli
from tiny import TINY_MODEL

from dlrm_cache.data.format import Manifest

SCHEMA = """\
format: parquet
label: click
dense:
  - {name: num0, transform: log1p}
  - {name: num1, transform: none}
  - {name: num2, transform: standardize}
  - {name: num3}
  - {name: num4}
sparse:
  - {name: cat0}
  - {name: cat1, hash: 50}
  - {name: cat2%s}
  - {name: cat3}
  - {name: cat4}
  - {name: cat5%s}
  - {name: cat6}
  - {name: cat7}
"""
TRAIN = ["embedding=host", "device=cpu", "progress=false", "data.batch_size=256", *TINY_MODEL,
         "max_steps=5"]  # fmt: skip


def _input(path: Path, multi_hot: bool, n: int = 3000) -> None:
    rng = np.random.default_rng(0)
    cols: dict = {"click": (rng.random(n) < 0.3).astype(np.int8)}
    for k in range(5):
        cols[f"num{k}"] = rng.gamma(2.0, 3.0, n)
    for k in range(8):
        if multi_hot and k in (2, 5):
            cols[f"cat{k}"] = [list(rng.integers(0, 40, rng.integers(0, 4))) for _ in range(n)]
        else:
            cols[f"cat{k}"] = [f"v{int(x)}" for x in rng.zipf(1.4, n) % 200]
    pq.write_table(pa.table(cols), path, row_group_size=500)


def _ok(r) -> None:
    assert r.returncode == 0, r.stderr[-3000:]


def _scored_in_batches_of_100(tmp_path: Path, raw: list[str]) -> pa.Table:
    """The test split and ``raw`` (predict's arguments for raw input of the same rows, read in
    blocks cut across batches) scored in batches of 100 each (a batch's size changes a CPU
    matmul's rounding): equal scores.  Returns the raw input's predictions."""
    for name, args in (("split100", ["input=ds"]), ("raw100", raw)):
        _ok(run_cli("predict", "checkpoint=run", *args, f"output={name}.parquet", "batch_size=100",
                    cwd=tmp_path))  # fmt: skip
    split, scored = (pq.read_table(tmp_path / f"{n}.parquet") for n in ("split100", "raw100"))
    np.testing.assert_array_equal(scored.column("probability"), split.column("probability"))
    return scored


def _tail_in_batches(tmp_path: Path, rows: int) -> None:
    """The input's last ``rows`` (its test split) as raw input, read in blocks of 30 rows (joined,
    and cut across batches), scored as the split is: equal scores, every line numbered."""
    tail = pq.read_table(tmp_path / "input.parquet")
    pq.write_table(tail.slice(len(tail) - rows), tmp_path / "tail.parquet")
    raw = _scored_in_batches_of_100(tmp_path, ["input=tail.parquet", "chunk_bytes=7680"])
    np.testing.assert_array_equal(raw.column("line"), np.arange(1, rows + 1))


def _chain(tmp_path: Path, multi_hot: bool) -> None:
    conf = tmp_path / "conf" / "schema"
    conf.mkdir(parents=True)
    flag = ", multi_hot: true" if multi_hot else ""
    (conf / "mine.yaml").write_text(SCHEMA % (flag, flag))
    _input(tmp_path / "input.parquet", multi_hot)
    _ok(run_cli("preprocess", "input=input.parquet", "output=ds", "schema=mine", "progress=false",
                f"hydra.searchpath=[file://{tmp_path / 'conf'}]", cwd=tmp_path))  # fmt: skip
    _ok(run_cli("train", "data.path=ds", "run_dir=run", *TRAIN, cwd=tmp_path))
    _ok(run_cli("predict", "checkpoint=run", "input=ds", "output=split.parquet", cwd=tmp_path))
    # blocks of 256 rows (chunk_bytes / 256) joined into one batch, as the split's is one batch
    _ok(run_cli("predict", "checkpoint=run", "input=input.parquet", "output=raw.parquet",
                "chunk_bytes=65536", cwd=tmp_path))  # fmt: skip
    split = pq.read_table(tmp_path / "split.parquet").column("probability").to_numpy()
    raw = pq.read_table(tmp_path / "raw.parquet").column("probability").to_numpy()
    assert len(raw) == 3000  # the test split is the input's last rows
    # in batches of other rows (3000 against the split's): up to a CPU matmul's rounding
    np.testing.assert_allclose(raw[-len(split) :], split, rtol=0, atol=1e-6)
    _tail_in_batches(tmp_path, len(split))  # in batches of the same rows: equal
    if not multi_hot:  # a one-hot column of lists: one line naming the file and the column
        t = pq.read_table(tmp_path / "input.parquet")
        lists = pa.array([[v] for v in t.column("cat0").to_pylist()])
        pq.write_table(t.set_column(1 + 5, "cat0", lists), tmp_path / "lists.parquet")
        r = run_cli("predict", "checkpoint=run", "input=lists.parquet", "output=l.parquet",
                    cwd=tmp_path)  # fmt: skip
        assert r.returncode == 1 and "Traceback" not in r.stderr
        assert "lists.parquet: column 'cat0': ids are integers or strings" in r.stderr
    _ok(run_cli("export", "checkpoint=run", "output=exp", cwd=tmp_path))
    _export_describes_schema(tmp_path, multi_hot)
    r = run_cli("verify", "ds", cwd=tmp_path)
    _ok(r)
    assert "3,000 rows" in r.stdout
    if not multi_hot:
        _other_schema_refused(tmp_path)


def _export_describes_schema(tmp_path: Path, multi_hot: bool) -> None:
    """dlrm.json's inputs are the schema's: each dense column's transform (standardize with the
    training split's mean and std of schema.json), each sparse column's own hash and multi-hot
    flag, and the raw id mapping of the format."""
    inputs = json.loads((tmp_path / "exp" / "dlrm.json").read_text())["inputs"]
    saved = json.loads((tmp_path / "ds" / "schema.json").read_text())
    assert "dense_transform" not in inputs and "hash_modulus" not in inputs  # Criteo's short form
    assert [(d["name"], d["transform"]) for d in inputs["dense"]] == [
        ("num0", "log1p"), ("num1", "none"), ("num2", "standardize"), ("num3", "log1p"),
        ("num4", "log1p")]  # fmt: skip
    num2 = inputs["dense"][2]
    assert [num2["mean"], num2["std"]] == saved["moments"]["num2"]
    assert "(x - mean) / std" in num2["formula"] and "mean" not in inputs["dense"][0]
    assert inputs["dense"][0]["formula"].startswith("log(1 + max(x, 0))")
    hashed = [0, 50, 0, 0, 0, 0, 0, 0]
    multi = [multi_hot and k in (2, 5) for k in range(8)]
    assert inputs["sparse"] == [
        {"name": f"cat{k}", "hash_modulus": hashed[k], "multi_hot": multi[k]} for k in range(8)
    ]
    assert inputs["raw_ids"].startswith("format parquet: a string or binary: 64-bit FNV-1a")
    assert inputs["schema_digest"] == Manifest.load(tmp_path / "ds").schema_digest


def _other_schema_refused(tmp_path: Path) -> None:
    """A copy of the run's dataset rebuilt in place (overwrite=true) under another dense
    transform (num1: none -> standardize; counts, table sizes and splits stay the same) is
    another dataset: predict (split and raw input) and export refuse it in one line naming the
    schema, and the run's own dataset is still accepted."""
    conf = tmp_path / "conf" / "schema"
    (conf / "other.yaml").write_text(
        SCHEMA.replace("num1, transform: none", "num1, transform: standardize") % ("", "")
    )
    shutil.copytree(tmp_path / "ds", tmp_path / "ds2")
    _ok(run_cli("preprocess", "input=input.parquet", "output=ds2", "schema=other", "overwrite=true",
                "progress=false", f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
                cwd=tmp_path))  # fmt: skip
    ours, theirs = (Manifest.load(tmp_path / d) for d in ("ds", "ds2"))
    assert (ours.stats_digest, ours.table_sizes) == (theirs.stats_digest, theirs.table_sizes)
    for command, args in (
        ("predict", ["input=input.parquet", "output=p2.parquet"]),
        ("predict", ["input=ds2", "output=p3.parquet"]),
        ("export", ["output=exp2"]),
    ):
        r = run_cli(command, "checkpoint=run", "dataset=ds2", *args, cwd=tmp_path)
        assert r.returncode == 1, (command, args, r.stdout[-2000:])
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "built under another schema" in lines[0], r.stderr[-2000:]
    assert not any((tmp_path / n).exists() for n in ("p2.parquet", "p3.parquet", "exp2"))
    r = run_cli("train", "data.path=ds2", "run_dir=run2", "resume=run", *TRAIN[:-1],
                "max_steps=6", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 1 and "dataset.schema_digest=" in r.stderr, r.stderr[-2000:]


def test_own_parquet_dataset_one_hot_end_to_end(tmp_path: Path) -> None:
    _chain(tmp_path, multi_hot=False)


def test_own_parquet_dataset_multi_hot_end_to_end(tmp_path: Path) -> None:
    _chain(tmp_path, multi_hot=True)


def test_criteo_layout_with_multi_hot_columns_scores_raw_lines_as_processed(tmp_path: Path) -> None:
    """Criteo's text layout with two multi-hot C columns (``|``-separated hex ids, one with a hash
    of its own): the raw file, read in many blocks, scores every test-split line as the processed
    split does (exactly, in batches of the same rows)."""
    conf = tmp_path / "conf" / "schema"
    conf.mkdir(parents=True)
    (conf / "mh.yaml").write_text(
        "format: criteo\nsparse:\n  - {name: C2, multi_hot: true}\n"
        "  - {name: C5, multi_hot: true, hash: 50}\n"
    )
    sizes = [1] * 26
    sizes[1], sizes[4] = 3, 2
    _ok(run_cli("synth", "output=raw", "lines=3000", "cardinality_scale=0.001", "progress=false",
                "min_cardinality=8", f"multi_hot_sizes=[{','.join(map(str, sizes))}]",
                cwd=tmp_path))  # fmt: skip
    _ok(run_cli("preprocess", "input=raw", "output=ds", "schema=mh", "progress=false", "min_count=2",
                f"hydra.searchpath=[file://{tmp_path / 'conf'}]", cwd=tmp_path))  # fmt: skip
    assert Manifest.load(tmp_path / "ds").multi_hot == ["C2", "C5"]
    _ok(run_cli("train", "data.path=ds", "run_dir=run", *TRAIN, cwd=tmp_path))
    _ok(run_cli("predict", "checkpoint=run", "input=ds", "output=split.parquet", cwd=tmp_path))
    _ok(run_cli("predict", "checkpoint=run", "input=raw/day_0", "output=raw.parquet",
                "chunk_bytes=20000", cwd=tmp_path))  # fmt: skip
    split = pq.read_table(tmp_path / "split.parquet")
    raw = pq.read_table(tmp_path / "raw.parquet")
    assert raw.num_rows == 3000  # the test split is the file's last lines
    n = split.num_rows
    # in batches of other rows (3000 against the split's): up to a CPU matmul's rounding
    np.testing.assert_allclose(
        raw.column("probability")[-n:], split.column("probability"), rtol=0, atol=1e-6
    )
    np.testing.assert_array_equal(raw.column("label")[-n:], split.column("label"))
    lines = (tmp_path / "raw" / "day_0").read_bytes().splitlines(keepends=True)
    (tmp_path / "tail").write_bytes(b"".join(lines[-n:]))
    _scored_in_batches_of_100(tmp_path, ["input=tail", "chunk_bytes=7000"])
    _raw_lists_are_the_processed_lists(tmp_path / "raw" / "day_0", tmp_path / "ds")


def _raw_lists_are_the_processed_lists(raw: Path, ds: Path) -> None:
    """The raw file's last lines, read in many blocks and joined, hold exactly the test split's
    lists (every element mapped to its table row; one-hot features as lists of one)."""
    from dlrm_cache.after.rawbatch import join
    from dlrm_cache.after.rawinput import IdMapper, input_schema, new_bad_line_log, read_schema_rows
    from dlrm_cache.data.lists import Lists
    from dlrm_cache.data.schema import Schema

    m = Manifest.load(ds)
    schema, labelled = input_schema(raw, Schema.load(ds, m.hash_modulus))
    bad = new_bad_line_log("skip", 10)
    blocks = list(
        read_schema_rows(raw, schema, labelled, IdMapper(ds, m, schema.hashes), 20000, bad)
    )
    assert len(blocks) > 10 and not bad.counts
    rows = join(blocks)
    test = pq.read_table(ds / m.splits["test"].shards[0])
    assert isinstance(rows.ids, Lists) and len(rows.lines) == 3000
    tail = rows.ids.rows(3000 - test.num_rows, 3000)
    for f, name in enumerate(m.sparse_names):
        lengths, values = tail.column(f)
        col = test.column(name).combine_chunks()
        if name in m.multi_hot:
            np.testing.assert_array_equal(lengths, np.diff(col.offsets.to_numpy()))
            np.testing.assert_array_equal(values, col.flatten().to_numpy())
            assert lengths.max() > 1
        else:
            np.testing.assert_array_equal(lengths, np.ones(test.num_rows))
            np.testing.assert_array_equal(values, col.to_numpy())
