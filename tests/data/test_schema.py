"""preprocess under a data schema other than Criteo's: CSV/TSV/parquet, transforms, per-column hash
moduli, multi-hot lists, bad lines per reason; Criteo's own output unchanged (golden digests)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from launching import TORCHRUN_2, child_env
from omegaconf import OmegaConf
from schema_inputs import criteo_lines, dataset_digests

import dlrm_cache.data.preprocess as pp
from dlrm_cache.data.config import DenseColumn, SchemaConfig, SparseColumn
from dlrm_cache.data.format import Manifest
from dlrm_cache.data.schema import LIST_SEPARATOR, Schema
from dlrm_cache.data.stats import load_feature_stats

from refdata import pp_config

# sha256 of dataset_digests(...) of main's preprocess (00476da, before schemas) on criteo_lines(3000)
_MAIN_DIGESTS = {
    "plain": ({}, "14717db787823d6bd8b2ba71b211b950c5c2d802e6e11838f48645468ffb128e"),
    "hashed": (
        {"hash_modulus": 50, "min_count": 2},
        "bd2ae33cf53ff978aca8d031bb0610a13f74f2dae2c257f49b6b78c7a62803d2",
    ),
}


@pytest.mark.parametrize("case", sorted(_MAIN_DIGESTS))
def test_criteo_output_byte_identical_to_main(tmp_path: Path, case: str) -> None:
    (tmp_path / "day_0").write_bytes(criteo_lines(3000))
    kw, want = _MAIN_DIGESTS[case]
    out = tmp_path / "ds"
    pp.preprocess(OmegaConf.structured(pp_config(tmp_path / "day_0", out, workers=1, **kw)))
    got = hashlib.sha256(json.dumps(dataset_digests(out), sort_keys=True).encode()).hexdigest()
    assert got == want
    assert "schema" not in json.loads((out / "preprocess.json").read_text())
    assert not (out / "schema.json").exists()


# ------------------------------------------------------------------------- a user's own CSV/TSV
def _schema(fmt: str = "csv", header: bool = True, **kw) -> SchemaConfig:
    return SchemaConfig(
        format=fmt,
        header=header,
        label="clicked",
        dense=[DenseColumn("price", "standardize"), DenseColumn("age", "log1p")],
        sparse=[
            SparseColumn("user"),
            SparseColumn("item", hash=7),
            SparseColumn("tags", multi_hot=True),
        ],
        **kw,
    )


BAD = {  # line -> reason (the text's line, then what the reference expects)
    "1,abc,3,u1,i1,": "non-number in a dense field",
    "2,1,3,u1,i1,": "label not 0/1",
    "1,1,3,u1": "wrong field count",
    "1,1,3,u1,i1,a||b": "empty id in a list",
    '1,1,3,"u1,i1,': "wrong field count",
    "": "wrong field count",
    "1,inf,3,u1,i1,": "non-number in a dense field",
}


def _rows(n: int, seed: int = 1) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        tags = LIST_SEPARATOR.join(f"t{int(x)}" for x in rng.integers(0, 20, rng.integers(0, 4)))
        age = "" if k % 10 == 0 else str(int(rng.integers(-2, 90)))
        user = "" if k % 17 == 0 else f"u{int(rng.zipf(1.5)) % 50}"
        out.append(
            [
                str(int(rng.random() < 0.3)),
                f"{rng.random() * 100:.3f}",
                age,
                user,
                f"i,{int(rng.integers(0, 30))}",
                tags,
            ]  # fmt: skip
        )
    return out


def _write_text(path: Path, rows: list[list[str]], delimiter: str, header: bool) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, delimiter=delimiter, lineterminator="\n")
    if header:
        w.writerow(["clicked", "price", "age", "user", "item", "tags"])
    w.writerows(rows)
    text = buf.getvalue()
    if delimiter == ",":
        text += "\n".join(BAD) + "\n"
    path.write_text(text)


def _fnv(v: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in v:
        h = ((h ^ b) * 0x100000001B3) % (1 << 64)
    return h & ((1 << 63) - 1)


def _reference(rows: list[list[str]], first: int, total: int, frac: float = 6 / 7):
    """Independent recomputation: per split the expected columns (ranks from the train counts)."""
    n_train = int(total * frac)
    n_val = (total - n_train) // 2
    split = ["train" if first + k < n_train else "val" if first + k < n_train + n_val else "test"
             for k in range(len(rows))]  # fmt: skip
    user = [_fnv(r[3].encode()) if r[3] else -1 for r in rows]
    item = [_fnv(r[4].encode()) % 7 for r in rows]
    tags = [[_fnv(t.encode()) for t in r[5].split("|")] if r[5] else [] for r in rows]
    train = [k for k in range(len(rows)) if split[k] == "train"]
    price = [float(np.float32(float(r[1]))) for r in rows]
    xs = [price[k] for k in train]
    mean = math.fsum(xs) / len(xs)
    std = math.sqrt(math.fsum(x * x for x in xs) / len(xs) - mean * mean)

    def ranks(values: list[list[int]]) -> dict[int, int]:
        c = Counter(v for k in train for v in values[k])
        return {v: r for r, (v, _) in enumerate(sorted(c.items(), key=lambda t: (-t[1], t[0])))}

    ru, ri, rt = ranks([[u] for u in user]), ranks([[i] for i in item]), ranks(tags)
    out: dict[str, dict[str, list]] = {}
    for k, r in enumerate(rows):
        d = out.setdefault(split[k], {n: [] for n in ("clicked", "price", "age", "user", "item",
                                                         "tags")})  # fmt: skip
        d["clicked"].append(float(r[0]))
        d["price"].append((price[k] - mean) / std)
        d["age"].append(math.log1p(max(float(r[2] or 0), 0)))
        d["user"].append(ru.get(user[k], len(ru)))
        d["item"].append(ri.get(item[k], len(ri)))
        d["tags"].append([rt.get(t, len(rt)) for t in tags[k]])
    return out, {"user": len(ru) + 1, "item": len(ri) + 1, "tags": len(rt) + 1}


def _read(out: Path, m: Manifest, split: str) -> dict[str, list]:
    t = pa.concat_tables([pq.read_table(out / s) for s in m.splits[split].shards])
    d = t.to_pydict()
    d["clicked"] = d.pop("label")
    return d


def _run(inp: Path, out: Path, schema: SchemaConfig, **kw) -> Manifest:
    cfg = pp_config(inp, out, rows_per_shard=90, schema=schema, **kw)
    return pp.preprocess(OmegaConf.structured(cfg))


@pytest.mark.parametrize("fmt,header", [("csv", True), ("csv", False), ("tsv", False)])
def test_text_exact_against_reference(tmp_path: Path, fmt: str, header: bool) -> None:
    rows = _rows(400)
    delim = "," if fmt == "csv" else "\t"
    _write_text(tmp_path / "data.txt", rows, delim, header)
    schema = _schema(fmt, header, columns=[] if header else
                     ["clicked", "price", "age", "user", "item", "tags"])  # fmt: skip
    m = _run(tmp_path / "data.txt", tmp_path / "ds", schema)
    total = len(rows) + (len(BAD) if fmt == "csv" else 0)  # data lines: not the header
    want, sizes = _reference(rows, 0, total)
    assert m.sparse_names == ["user", "item", "tags"] and m.multi_hot == ["tags"]
    assert m.dense_names == ["price", "age"]
    assert dict(zip(m.sparse_names, m.table_sizes)) == sizes
    for split in ("train", "val", "test"):
        got = _read(tmp_path / "ds", m, split)
        exp = want.get(split, {})
        for name in ("clicked", "user", "item", "tags"):
            assert got[name] == exp[name], (split, name)
        for name in ("price", "age"):
            np.testing.assert_array_equal(
                np.float32(got[name]), np.array(exp[name], dtype=np.float32), err_msg=name
            )
    if fmt == "csv":
        assert m.bad_lines == dict(Counter(BAD.values()))
    assert m.split_spec["total_lines"] == total
    assert Schema.load(tmp_path / "ds").hashes == [0, 7, 0]


def test_workers_two_identical_to_one(tmp_path: Path) -> None:
    _write_text(tmp_path / "data.csv", _rows(3000, seed=3), ",", True)
    digests = []
    for w in (1, 2):
        out = tmp_path / f"ds{w}"
        _run(tmp_path / "data.csv", out, _schema(), workers=w, chunk_bytes=16 << 10)
        digests.append(dataset_digests(out))
    assert digests[0] == digests[1]


def test_parquet_lists_and_integer_ids(tmp_path: Path) -> None:
    rows = _rows(300, seed=5)
    table = pa.table({
        "clicked": pa.array([int(r[0]) for r in rows], pa.int8()),
        "price": [float(r[1]) for r in rows],
        "age": [float(r[2]) if r[2] else None for r in rows],
        "user": [r[3] or None for r in rows],
        "item": pa.array([int(r[4][2:]) for r in rows], pa.int64()),
        "tags": [r[5].split("|") if r[5] else [] for r in rows],
    })  # fmt: skip
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=64)
    m = _run(tmp_path / "a.parquet", tmp_path / "ds", _schema("parquet", False))
    want, sizes = _reference(rows, 0, len(rows))
    # integer ids are their own value: item's ranks come from value % 7, not from a hash
    items = [int(r[4][2:]) % 7 for r in rows]
    train = want["train"]
    got = _read(tmp_path / "ds", m, "train")
    assert got["user"] == train["user"] and got["tags"] == train["tags"]
    c = Counter(items[: len(got["item"])])
    order = sorted(c.items(), key=lambda t: (-t[1], t[0]))
    assert got["item"] == [
        dict((v, r) for r, (v, _) in enumerate(order))[i] for i in items[: len(got["item"])]
    ]
    assert m.table_sizes[2] == sizes["tags"]


def _criteo_line(label: str, c3: str, c5: str, k: int) -> str:
    dense = [str(k % 7)] * 13
    sparse = [f"{(k * 31 + j) % 5:x}" for j in range(26)]
    sparse[2], sparse[4] = c3, c5
    return "\t".join([label, *dense, *sparse])


def test_criteo_layout_multi_hot_fields(tmp_path: Path) -> None:
    """Criteo text whose C3 and C5 hold |-separated hex ids (synth's multi-hot syntax): every
    element is counted, the shards hold the lists, an empty field is an empty list."""
    c3 = ["a1|ff|1", "", "ff", "1|1", "a1"] * 20
    c5 = ["7", "7|8", "", "8", "9|7|8"] * 20
    lines = [_criteo_line(str(k % 2), c3[k], c5[k], k) for k in range(100)]
    lines += [_criteo_line("1", "a1||b", "7", 0), _criteo_line("1", "xyz|1", "7", 0)]
    (tmp_path / "day_0").write_text("\n".join(lines) + "\n")
    schema = SchemaConfig(sparse=[SparseColumn("C3", multi_hot=True), SparseColumn("C5", True)])
    m = _run(tmp_path / "day_0", tmp_path / "ds", schema, train_fraction=1.0)
    assert m.multi_hot == ["C3", "C5"] and m.sparse_names[2] == "C3"
    assert m.bad_lines == {"categorical not 1-8 hex digits": 2}
    stats = dict(zip(m.sparse_names, load_feature_stats(tmp_path / "ds", m)))
    for name, fields in (("C3", c3), ("C5", c5)):
        want = Counter(int(t, 16) for f in fields if f for t in f.split(LIST_SEPARATOR))
        assert dict(zip(stats[name].ids.tolist(), stats[name].counts.tolist())) == want
        order = [v for v, _ in sorted(want.items(), key=lambda t: (-t[1], t[0]))]
        rows = _read(tmp_path / "ds", m, "train")[name]
        assert rows == [
            [order.index(int(t, 16)) for t in f.split("|")] if f else [] for f in fields
        ]


def test_dataset_reused_only_under_its_schema(tmp_path: Path) -> None:
    _write_text(tmp_path / "data.csv", _rows(200), ",", True)
    first = _run(tmp_path / "data.csv", tmp_path / "ds", _schema())
    assert _run(tmp_path / "data.csv", tmp_path / "ds", _schema()) == first  # reused
    other = _schema()
    other.sparse[1].hash = 8
    with pytest.raises(pp.PreprocessError, match=r"other inputs/settings \(schema\)"):
        _run(tmp_path / "data.csv", tmp_path / "ds", other)
    # Criteo's schema records none: the user schema's record is what differs, not "unknown"
    with pytest.raises(pp.PreprocessError, match=r"other inputs/settings \(schema\)"):
        _run(tmp_path / "data.csv", tmp_path / "ds", SchemaConfig())


def test_header_without_a_schema_column_is_one_error(tmp_path: Path) -> None:
    _write_text(tmp_path / "data.csv", _rows(20), ",", True)
    bad = _schema()
    bad.dense[1].name = "height"
    with pytest.raises(pp.PreprocessError, match=r"data.csv:1: the header has no column 'height'"):
        _run(tmp_path / "data.csv", tmp_path / "ds", bad)
    assert not (tmp_path / "ds").exists()


def test_torchrun_two_ranks_identical_to_one_process(tmp_path: Path) -> None:
    """Two ranks under torchrun, through the CLI with a schema file of the user's own."""
    _write_text(tmp_path / "data.csv", _rows(2000, seed=4), ",", True)
    _run(tmp_path / "data.csv", tmp_path / "one", _schema(), workers=1)
    conf = tmp_path / "conf" / "schema"
    conf.mkdir(parents=True)
    conf.joinpath("shop.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(_schema())))
    r = subprocess.run(
        [*TORCHRUN_2, "preprocess", "input=data.csv", "output=two", "schema=shop", "workers=1",
         "chunk_bytes=65536", "rows_per_shard=90", "progress=false",
         f"hydra.searchpath=[file://{tmp_path / 'conf'}]"],  # fmt: skip
        cwd=tmp_path, env=child_env(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 worker(s) x 2 rank(s)" in r.stdout
    assert dataset_digests(tmp_path / "two") == dataset_digests(tmp_path / "one")


def test_parquet_bad_rows_per_reason(tmp_path: Path) -> None:
    """A null or non-0/1 label, a non-finite dense value and a null list element each make their
    row bad (counted per reason, first reason wins); a null list is an empty list."""
    n = 50
    label = [1 if k % 3 == 0 else 0 for k in range(n)]
    price = [float(k) for k in range(n)]
    tags: list = [["a", "b"]] * n
    label[3], label[4] = None, 2
    price[5], price[6] = float("nan"), float("inf")
    tags = list(tags)
    tags[7], tags[8] = ["a", None], None
    price[9], label[9] = float("nan"), None  # two problems: the label is checked first
    table = pa.table({"clicked": pa.array(label, pa.float32()), "price": price,
                      "age": [1.0] * n, "user": ["u"] * n, "item": [1] * n,
                      "tags": pa.array(tags, pa.list_(pa.string()))})  # fmt: skip
    pq.write_table(table, tmp_path / "a.parquet")
    m = _run(tmp_path / "a.parquet", tmp_path / "ds", _schema("parquet", False), train_fraction=1.0)
    assert m.bad_lines == {
        "label not 0/1": 3,
        "non-number in a dense field": 2,
        "empty id in a list": 1,
    }
    got = _read(tmp_path / "ds", m, "train")
    assert len(got["tags"]) == n - 6 and [] in got["tags"]


def test_criteo_format_takes_no_header_or_columns(tmp_path: Path) -> None:
    (tmp_path / "day_0").write_bytes(criteo_lines(10))
    with pytest.raises(pp.PreprocessError, match="format=criteo has no header"):
        _run(tmp_path / "day_0", tmp_path / "ds", SchemaConfig(header=True))


def test_multi_hot_set_of_a_user_schema_dataset_keeps_its_schema(tmp_path: Path) -> None:
    """multi_hot_sizes= on a dataset built under a user schema: the new set holds the same
    schema.json (its transforms, moments and hashes say how raw values became the input's rows;
    export describes the inputs from it) and the same schema digest in its manifest."""
    _write_text(tmp_path / "data.csv", _rows(200), ",", True)
    one_hot = _schema()
    one_hot.sparse[2].multi_hot = False
    src = _run(tmp_path / "data.csv", tmp_path / "ds", one_hot)
    mh = _run(tmp_path / "ds", tmp_path / "mh", SchemaConfig(), multi_hot_sizes=[2, 1, 1])
    assert mh.multi_hot == ["user"] and mh.schema_digest == src.schema_digest != ""
    saved = (tmp_path / "ds" / "schema.json").read_bytes()
    assert (tmp_path / "mh" / "schema.json").read_bytes() == saved
    assert Schema.load(tmp_path / "mh").transforms == ["standardize", "log1p"]
