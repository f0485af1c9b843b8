"""synth: determinism, Zipf skew, oracle record, missing values, malformed lines, re-runs."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from dlrm_cache.data import criteo
from dlrm_cache.data.config import SynthConfig
from dlrm_cache.data.synth import synth, table_sizes

from refdata import ref_parse, tiny_synth


def _bytes(d: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(d.glob("day_*"))]


def test_deterministic_per_seed(tmp_path: Path) -> None:
    a = tiny_synth(tmp_path / "a", lines=4000, files=2, seed=7)
    b = tiny_synth(tmp_path / "b", lines=4000, files=2, seed=7)
    c = tiny_synth(tmp_path / "c", lines=4000, files=2, seed=8)
    assert _bytes(a) == _bytes(b)
    assert _bytes(a)[0] != _bytes(c)[0] and _bytes(a)[1] != _bytes(c)[1]
    assert sorted(p.name for p in a.iterdir()) == ["day_0", "day_1", "oracle.json"]
    assert [f["lines"] for f in json.loads((a / "oracle.json").read_text())["files"]] == [
        2000,
        2000,
    ]


def test_gzip_output_is_deterministic_and_readable(tmp_path: Path) -> None:
    a = tiny_synth(tmp_path / "a", lines=1000, gzip=True)
    b = tiny_synth(tmp_path / "b", lines=1000, gzip=True)
    plain = tiny_synth(tmp_path / "c", lines=1000)
    assert (a / "day_0.gz").read_bytes() == (b / "day_0.gz").read_bytes()
    assert gzip.decompress((a / "day_0.gz").read_bytes()) == (plain / "day_0").read_bytes()


def test_lines_are_valid_criteo_with_missing_values(tmp_path: Path) -> None:
    d = tiny_synth(tmp_path, lines=3000, missing_rate=0.1, dense_missing_rate=0.2)
    per_file, bad, sizes = ref_parse([d / "day_0"])
    assert sizes == [3000] and bad == {} and len(per_file[0]) == 3000
    lines = (d / "day_0").read_text().splitlines()
    cats = [f for ln in lines for f in ln.split("\t")[14:]]
    assert all(len(f) in (0, 8) for f in cats)  # 8 hex digits or empty
    assert 0.08 < sum(f == "" for f in cats) / len(cats) < 0.12
    ints = [f for ln in lines for f in ln.split("\t")[1:14]]
    assert 0.17 < sum(f == "" for f in ints) / len(ints) < 0.23
    assert any(f.startswith("-") for f in ints)  # negative integers occur, as in Criteo


def test_zipf_skew_and_hex_order(tmp_path: Path) -> None:
    cfg = dict(lines=20000, cardinalities=[5000] * 26, zipf_alpha=1.2, missing_rate=0.0)
    d = tiny_synth(tmp_path, **cfg)
    per_file, _, _ = ref_parse([d / "day_0"])
    ids = pd.Series([ln.ids[2] for ln in per_file[0]])
    counts = ids.value_counts()
    top = counts.iloc[: len(counts) // 100].sum() / counts.sum()
    assert top > 0.5  # the top 1% of seen ids take most accesses
    assert counts.iloc[0] > 20 * counts.iloc[len(counts) // 2]
    # Hex order is not popularity order.
    assert (
        not counts.index[:20].is_monotonic_increasing
        and not counts.index[:20].is_monotonic_decreasing
    )
    # A flatter law is less skewed.
    flat = tiny_synth(tmp_path / "flat", **{**cfg, "zipf_alpha": 0.5})
    ids_flat = pd.Series([ln.ids[2] for ln in ref_parse([flat / "day_0"])[0][0]]).value_counts()
    assert ids_flat.iloc[: len(ids_flat) // 100].sum() / ids_flat.sum() < top


def test_oracle_record(tmp_path: Path) -> None:
    d = synth(OmegaConf.structured(SynthConfig(output=str(tmp_path), lines=20000, progress=False)))
    rec = json.loads((d / "oracle.json").read_text())
    assert 0.75 < rec["oracle_auc"] < 0.9
    assert 0.2 < rec["positive_rate"] < 0.3
    assert rec["settings"]["lines"] == 20000 and rec["settings"]["zipf_alpha"] == 1.1
    assert rec["table_sizes"] == table_sizes(SynthConfig())
    assert 200_000 < sum(rec["table_sizes"]) < 500_000  # kaggle preset x 0.01
    # A weaker planted model has a lower ceiling.
    weak = synth(
        SynthConfig(
            output=str(tmp_path / "weak"),
            lines=20000,
            id_effect_scale=0.3,
            dense_scale=0.1,
            interaction_scale=0.0,
            progress=False,
        )
    )
    assert json.loads((weak / "oracle.json").read_text())["oracle_auc"] < rec["oracle_auc"] - 0.1


def test_bad_lines_are_detected(tmp_path: Path) -> None:
    d = tiny_synth(tmp_path, lines=5000, bad_line_rate=0.02)
    rec = json.loads((d / "oracle.json").read_text())
    n_bad = sum(len(p.bad_lines) for _, p in criteo.read_file(d / "day_0", 1 << 16))
    assert n_bad == rec["bad_lines"] and 50 < n_bad < 150
    _, ref_bad, _ = ref_parse([d / "day_0"])
    assert sum(ref_bad.values()) == n_bad and len(ref_bad) == 4  # every kind of reason occurs


def test_rerun_reuses_and_cleans(tmp_path: Path, capsys) -> None:
    d = tiny_synth(tmp_path, lines=1000, files=3)
    mtime = (d / "day_0").stat().st_mtime_ns
    capsys.readouterr()
    tiny_synth(tmp_path, lines=1000, files=3)
    assert "up to date" in capsys.readouterr().out and (d / "day_0").stat().st_mtime_ns == mtime
    tiny_synth(tmp_path, lines=1000, files=2)  # fewer files: the stale day_2 goes away
    assert sorted(p.name for p in d.iterdir()) == ["day_0", "day_1", "oracle.json"]


def test_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="preset"):
        tiny_synth(tmp_path, cardinalities="avazu")
    with pytest.raises(ValueError, match="26"):
        tiny_synth(tmp_path, cardinalities=[3, 4])
    assert table_sizes(SynthConfig(cardinality_scale=1.0)) == table_sizes(
        SynthConfig(cardinality_scale=2.0)
    )
    assert (
        min(table_sizes(SynthConfig())) == 3
    )  # a preset table smaller than the floor keeps its size


def test_output_in_a_dataset_or_run_or_a_file_is_refused(processed_synth, tmp_path: Path) -> None:
    """synth output=<a processed dataset> (or a run's checkpoints/) wrote day_0 and oracle.json among
    its files, and output=<a file> failed with "[Errno 17] File exists" naming no key; each is now
    refused naming output=, and nothing is written."""
    from dlrm_cache.files.outputs import UnsafeOutput

    data = tmp_path / "data"
    shutil.copytree(processed_synth, data)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    afile = tmp_path / "afile"
    afile.write_text("kept")
    before = sorted(p.name for p in data.iterdir())
    with pytest.raises(UnsafeOutput, match=r"^output=.*data: is the dataset directory"):
        tiny_synth(data, lines=100)
    with pytest.raises(UnsafeOutput, match=r"^output=.*checkpoints: lies inside the run directory"):
        tiny_synth(run / "checkpoints", lines=100)
    with pytest.raises(ValueError, match=r"^output=.*afile: is a file; synth writes"):
        tiny_synth(afile, lines=100)
    assert sorted(p.name for p in data.iterdir()) == before
    assert list((run / "checkpoints").iterdir()) == [] and afile.read_text() == "kept"


def test_one_line_of_one_class_has_no_oracle_auc(tmp_path: Path, capsys, recwarn) -> None:
    """Issue 38, target 7.  Before: ``oracle_auc: 0.0`` and a torchmetrics warning."""
    out = tiny_synth(tmp_path / "one", lines=1)
    assert json.loads((out / "oracle.json").read_text())["oracle_auc"] is None
    assert "oracle AUC n/a (the labels are of one class)" in capsys.readouterr().out
    assert not [w for w in recwarn if "torchmetrics" in str(w.filename) + str(w.message)]
