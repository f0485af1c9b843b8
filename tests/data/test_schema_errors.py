"""Hostile input under a user schema: values beyond float32, bad schema keys, files the format does
not read, malformed headers and columns of the wrong type -> a bad line or one line naming the
file, column or key (never a traceback, never inf in the shards)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from launching import run_cli
from omegaconf import OmegaConf
from schema_inputs import dataset_digests

import dlrm_cache.data.preprocess as pp
from dlrm_cache.after.rawinput import input_schema
from dlrm_cache.data.config import DenseColumn, SchemaConfig, SparseColumn
from dlrm_cache.data.format import Manifest
from dlrm_cache.data.rawtext import InputError
from dlrm_cache.data.schema import resolve
from dlrm_cache.data.stats import load_feature_stats
from dlrm_cache.data.tabular import standardized

from refdata import pp_config


def _schema(fmt: str = "csv", **kw) -> SchemaConfig:
    return SchemaConfig(
        format=fmt,
        header=fmt != "parquet",
        label="y",
        dense=[DenseColumn("x", "none"), DenseColumn("z", "standardize")],
        sparse=[SparseColumn("u")],
        **kw,
    )


def _run(inp: Path, out: Path, schema: SchemaConfig, **kw) -> Manifest:
    cfg = pp_config(inp, out, schema=schema, train_fraction=1.0, **kw)
    return pp.preprocess(OmegaConf.structured(cfg))


def _train(out: Path, m: Manifest) -> dict[str, list]:
    return pa.concat_tables([pq.read_table(out / s) for s in m.splits["train"].shards]).to_pydict()


_HUGE = ["1e39", "-1e39", "1e308", "3.5e38"]  # finite in float64, beyond float32


def test_dense_beyond_float32_is_a_bad_line(tmp_path: Path) -> None:
    """Values beyond float32 in a ``none`` or a ``standardize`` column are bad lines; the shards
    hold exactly the other rows, and the moments are those of the good rows only."""
    rows = [(k % 2, f"{k}.5", str(k * 3), f"u{k % 5}") for k in range(60)]
    bad = [(1, h, "1", "u1") for h in _HUGE] + [(0, "1", h, "u2") for h in _HUGE]
    lines = ["y,x,z,u"] + [",".join(map(str, r)) for r in rows[:30] + bad + rows[30:]]
    (tmp_path / "a.csv").write_text("\n".join(lines) + "\n")
    m = _run(tmp_path / "a.csv", tmp_path / "ds", _schema())
    assert m.bad_lines == {"non-number in a dense field": len(bad)}
    got = _train(tmp_path / "ds", m)
    assert got["x"] == [float(np.float32(r[1])) for r in rows]
    z = np.array([float(np.float32(r[2])) for r in rows])
    want = ((z - z.mean()) / z.std()).astype(np.float32)
    np.testing.assert_allclose(np.float32(got["z"]), want, rtol=1e-6)
    assert np.isfinite(got["x"]).all() and np.isfinite(got["z"]).all()


def test_parquet_dense_beyond_float32_is_a_bad_row(tmp_path: Path) -> None:
    n = 40
    x = [float(k) for k in range(n)]
    x[3], x[7] = 1e39, -1e300
    table = pa.table({"y": [k % 2 for k in range(n)], "x": x, "z": [1.0] * n,
                      "u": [f"u{k}" for k in range(n)]})  # fmt: skip
    pq.write_table(table, tmp_path / "a.parquet")
    m = _run(tmp_path / "a.parquet", tmp_path / "ds", _schema("parquet"))
    assert m.bad_lines == {"non-number in a dense field": 2}
    assert _train(tmp_path / "ds", m)["x"] == [v for k, v in enumerate(x) if k not in (3, 7)]


@pytest.mark.parametrize(
    "sparse,message",
    [
        ([SparseColumn("u", hash=-5)], r"schema.sparse: 'u' has hash=-5; a modulus is >= 1"),
        ([], r"schema.sparse: format=csv needs at least one sparse column"),
    ],
)
def test_schema_keys_refused_in_one_line(tmp_path: Path, sparse: list, message: str) -> None:
    (tmp_path / "a.csv").write_text("y,x,z,u\n1,1,1,u1\n")
    schema = _schema()
    schema.sparse = sparse
    with pytest.raises(pp.PreprocessError, match=message):
        _run(tmp_path / "a.csv", tmp_path / "ds", schema)
    assert not (tmp_path / "ds").exists()


_CSV = "y,x,z,u\n" + "".join(f"{k % 2},{k},{k},u{k % 3}\n" for k in range(30))


@pytest.mark.parametrize(
    "extra,listed",
    [(["b.parquet"], "b.parquet"), (["b.CSV", "e.csv.bz2", "f.tsv"], "b.CSV, e.csv.bz2, f.tsv")],
)
def test_directory_with_files_the_format_does_not_read_is_refused(
    tmp_path: Path, extra: list[str], listed: str
) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_text(_CSV)
    for name in extra:
        (tmp_path / "in" / name).write_text(_CSV)
    with pytest.raises(pp.PreprocessError, match=rf"holds {listed}, which format=csv does not"):
        _run(tmp_path / "in", tmp_path / "ds", _schema())
    assert not (tmp_path / "ds").exists()


def test_directory_files_not_read_are_named(tmp_path: Path, capsys) -> None:
    (tmp_path / "in").mkdir()
    for name in ("a.csv", "b.csv"):
        (tmp_path / "in" / name).write_text(_CSV)
    for name in ("c.txt", "_SUCCESS", ".a.csv.crc"):
        (tmp_path / "in" / name).write_text("x")
    m = _run(tmp_path / "in", tmp_path / "ds", _schema())
    assert m.splits["train"].rows == 60
    assert "not read (3 file(s) of no input name): .a.csv.crc, _SUCCESS, c.txt" in (
        capsys.readouterr().out
    )


def _pq(path: Path, n: int = 40, **cols) -> Path:
    base = {"y": [k % 2 for k in range(n)], "x": [float(k) for k in range(n)], "z": [1.0] * n,
            "u": [k % 6 if k % 5 else None for k in range(n)]}  # fmt: skip
    pq.write_table(pa.table({**base, **cols}), path)
    return path


def test_parquet_ids_of_integral_floats_and_big_uint64(tmp_path: Path) -> None:
    """Float ids holding integers (pandas' integers with nulls) are the integers' ids; a uint64
    id above int64's max has its top bit cleared like every other id."""
    n = 40
    ints = [k % 6 if k % 5 else None for k in range(n)]
    _run(_pq(tmp_path / "i.parquet"), tmp_path / "ints", _schema("parquet"))
    floats = pa.array([None if v is None else float(v) for v in ints], pa.float64())
    _run(_pq(tmp_path / "f.parquet", u=floats), tmp_path / "floats", _schema("parquet"))
    assert dataset_digests(tmp_path / "floats") == dataset_digests(tmp_path / "ints")
    big = [(1 << 64) - 1 - (k % 3) for k in range(n)]
    m = _run(_pq(tmp_path / "u.parquet", u=pa.array(big, pa.uint64())), tmp_path / "u",
             _schema("parquet"))  # fmt: skip
    stats = load_feature_stats(tmp_path / "u", m)[0]
    want = {v & ((1 << 63) - 1): big.count(v) for v in set(big)}
    assert dict(zip(stats.ids.tolist(), stats.counts.tolist())) == want


@pytest.mark.parametrize(
    "u,message",
    [
        (pa.array([1.5] * 40), r"a.parquet: column 'u': ids are integers or strings, not 1.5"),
        (pa.array([["a"]] * 40), r"a.parquet: column 'u': ids are .*, not list<element: string>"),
    ],
)
def test_parquet_id_column_of_another_type_is_one_error(tmp_path: Path, u, message: str) -> None:
    with pytest.raises((pp.PreprocessError, InputError), match=message):
        _run(_pq(tmp_path / "a.parquet", u=u), tmp_path / "ds", _schema("parquet"))
    assert not (tmp_path / "ds").exists()


def test_parquet_string_label_not_a_number_is_a_bad_row(tmp_path: Path) -> None:
    y = ["1" if k % 3 else "0" for k in range(40)]
    y[4], y[9], y[11] = "yes", None, "1.0"
    m = _run(_pq(tmp_path / "a.parquet", y=y), tmp_path / "ds", _schema("parquet"))
    assert m.bad_lines == {"label not 0/1": 2}
    assert _train(tmp_path / "ds", m)["label"] == [float(v) for v in y if v in ("0", "1", "1.0")]


_HEADERS = {  # first line -> the one-line error, in preprocess and predict alike
    b"y,x,z\r,u\n": r"a.csv:1: not a header line \(new-line character",
    b"y,x,u,z,u\n": r"a.csv:1: the header names column 'u' 2 times",
    b"y\tx\tz\tu\n": r"a.csv:1: the header has no column '[xy]' \(one field: another delimiter\?\)",
    b"PAR1\x00\x15\n": r"a.csv: a parquet file, but the schema's format is csv",
}


@pytest.mark.parametrize("first", sorted(_HEADERS))
def test_bad_header_is_one_error_in_preprocess_and_predict(tmp_path: Path, first: bytes) -> None:
    (tmp_path / "a.csv").write_bytes(first + b"1,2,3,u1\n" * 5)
    with pytest.raises((pp.PreprocessError, InputError), match=_HEADERS[first]):
        _run(tmp_path / "a.csv", tmp_path / "ds", _schema())
    assert not (tmp_path / "ds").exists()
    with pytest.raises(InputError, match=_HEADERS[first]):
        input_schema(tmp_path / "a.csv", resolve(_schema(), 0))


def test_format_mismatch_names_the_file(tmp_path: Path) -> None:
    """A parquet file under a csv schema without header, and text under a parquet schema."""
    _pq(tmp_path / "a.parquet")
    no_header = _schema(columns=["y", "x", "z", "u"])
    no_header.header = False
    message = r"a.parquet: a parquet file, but the schema's format is csv"
    with pytest.raises((pp.PreprocessError, InputError), match=message):
        _run(tmp_path / "a.parquet", tmp_path / "ds", no_header)
    with pytest.raises(InputError, match=message):
        input_schema(tmp_path / "a.parquet", resolve(no_header, 0))
    (tmp_path / "a.csv").write_text(_CSV)
    with pytest.raises(InputError, match=r"a.csv: not a parquet file, the dataset's format"):
        input_schema(tmp_path / "a.csv", resolve(_schema("parquet"), 0))


def test_standardized_value_far_outside_the_training_split_stays_finite() -> None:
    """Training values 0 and 1e-40 (std 5e-41): a later 1.0 would be 2e40, beyond float32."""
    tiny = float(np.float32(5e-41))  # subnormal: the mean as float32 holds it
    got = standardized(np.array([1.0, -1.0, tiny], np.float32), [tiny, tiny])
    big = np.finfo(np.float32).max
    assert got.tolist() == [float(big), -float(big), 0.0]


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("{name: x, transform: sqrt}", "Invalid value 'sqrt', expected one of"),
        ("{name: x, trasform: log1p}", "Key 'trasform' not in 'DenseColumn'"),
    ],
)
def test_a_bad_schema_file_says_which_key_and_why(tmp_path: Path, entry: str, reason: str):
    """Hydra reports a bad schema file's reason on the lines after 'raised while composing
    config:'; the one error line keeps it and the key."""
    (tmp_path / "conf" / "schema").mkdir(parents=True)
    (tmp_path / "conf" / "schema" / "bad.yaml").write_text(
        f"format: csv\nheader: true\nlabel: y\ndense: [{entry}]\nsparse: [{{name: u}}]\n"
    )
    (tmp_path / "in.csv").write_text("y,x,u\n1,2,a\n")
    res = run_cli("preprocess", "input=in.csv", "output=out", "schema=bad",
                  f"hydra.searchpath=[file://{tmp_path / 'conf'}]", cwd=tmp_path,
                  plain_errors=True)  # fmt: skip
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert "In 'schema/bad'" in lines[0] and reason in lines[0] and "full_key:" in lines[0]
    assert not (tmp_path / "out").exists()
