"""Raw lines map to exactly what `preprocess` wrote for them: hashed ids, rare and unseen ids on the
shared row, log1p dense values; 39-field lines the same as their 40-field originals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dlrm_cache.after.rawinput import (
    LABELLED,
    UNLABELLED,
    IdMapper,
    detect_width,
    new_bad_line_log,
    read_rows,
)
from dlrm_cache.data.config import PreprocessConfig, SynthConfig
from dlrm_cache.data.format import DENSE_NAMES, LABEL, SPARSE_NAMES, Manifest
from dlrm_cache.data.preprocess import preprocess
from dlrm_cache.data.synth import synth


@pytest.fixture(scope="module")
def hashed(tmp_path_factory) -> tuple[Path, list[bytes]]:
    """A dataset with hash_modulus and min_count > 1, and the raw lines of its test split."""
    root = tmp_path_factory.mktemp("hashed")
    synth(
        SynthConfig(
            output=str(root / "raw"),
            lines=6000,
            cardinality_scale=0.001,
            min_cardinality=8,
            progress=False,
            seed=5,
        )
    )
    preprocess(
        PreprocessConfig(
            input=str(root / "raw"),
            output=str(root / "ds"),
            hash_modulus=97,
            min_count=3,
            progress=False,
        )
    )
    spec = json.loads((root / "ds" / "manifest.json").read_text())["split_spec"]["lines"]["test"]
    lines = (root / "raw" / "day_0").read_bytes().split(b"\n")[spec[0] : spec[1]]
    return root / "ds", lines


def rows_of(path: Path, dataset: Path, chunk_bytes: int = 1 << 20):
    manifest = Manifest.load(dataset)
    bad = new_bad_line_log("skip", 10)
    width = detect_width(path)
    parts = list(read_rows(path, width, IdMapper(dataset, manifest), chunk_bytes, bad))
    return width, parts, bad


def test_raw_lines_map_to_the_processed_split(hashed, tmp_path):
    dataset, lines = hashed
    manifest = Manifest.load(dataset)
    shards = [pq.read_table(dataset / s) for s in manifest.splits["test"].shards]
    ids = np.stack([np.concatenate([t.column(n).to_numpy() for t in shards]) for n in SPARSE_NAMES])
    dense = np.stack(
        [np.concatenate([t.column(n).to_numpy() for t in shards]) for n in DENSE_NAMES]
    )
    labels = np.concatenate([t.column(LABEL).to_numpy() for t in shards])

    for text, width in (
        (lines, LABELLED),
        ([line.split(b"\t", 1)[1] for line in lines], UNLABELLED),
    ):
        path = tmp_path / f"w{width}.txt"
        path.write_bytes(b"\n".join(text) + b"\n")
        found, parts, bad = rows_of(path, dataset, chunk_bytes=4096)  # many blocks
        assert found == width and not bad.counts and len(parts) > 3
        np.testing.assert_array_equal(np.concatenate([p.ids for p in parts], axis=1), ids)
        np.testing.assert_array_equal(np.concatenate([p.dense for p in parts], axis=1), dense)
        if width == LABELLED:
            np.testing.assert_array_equal(np.concatenate([p.labels for p in parts]), labels)
        else:
            assert all(p.labels is None for p in parts)
    # the cases that matter were there: the shared row (rare or unseen ids) and ids past the modulus
    rare = np.array(manifest.table_sizes)[:, None] - 1
    assert (ids == rare).any() and manifest.hash_modulus == 97
    raw_ids = [int(f, 16) for line in lines for f in line.split(b"\t")[14:] if f]
    assert max(raw_ids) >= 97


def test_wrong_width_lines_in_the_files_own_counts(hashed, tmp_path):
    dataset, lines = hashed
    unlabelled = [line.split(b"\t", 1)[1] for line in lines[:20]]
    path = tmp_path / "mixed.txt"
    # a labelled line, an empty one and a cut one among 39-field lines
    path.write_bytes(b"\n".join(unlabelled[:5] + [lines[5], b"", b"1\t2"] + unlabelled[5:]) + b"\n")
    width, parts, bad = rows_of(path, dataset)
    assert width == UNLABELLED
    assert sum(len(p.lines) for p in parts) == 20
    assert bad.reports == [
        f"{path}:6: wrong field count (40 fields, expected 39)",
        f"{path}:7: wrong field count (1 fields, expected 39)",
        f"{path}:8: wrong field count (2 fields, expected 39)",
    ]
