"""synth's multi-hot features (``multi_hot_sizes``): lists written as hex ids joined by "|", a
click model that uses every id of a list, deterministic bytes, defaults unchanged."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from dlrm_cache.data.config import SynthConfig
from dlrm_cache.data.format import MLPERF_MULTI_HOT_SIZES, NUM_DENSE
from dlrm_cache.data.synth import _make_chunk, synth
from dlrm_cache.data.synthmodel import build_model, pair_effect, table_sizes

SMALL = {"lines": 3000, "cardinality_scale": 0.001, "progress": False, "seed": 5}
SIZES = [3, 2] + [1] * 8 + [5] + [1] * 15  # C1, C2 (the crossed pair) and C11 multi-hot


def _fields(out: Path) -> list[list[str]]:
    return [line.split("\t") for line in (out / "day_0").read_text().splitlines()]


def test_lists_are_written_as_their_sizes_say_and_deterministic(tmp_path: Path):
    cfg = dict(SMALL, multi_hot_sizes=SIZES, missing_rate=0.1)
    out = synth(SynthConfig(output=str(tmp_path / "a"), **cfg))
    again = synth(SynthConfig(output=str(tmp_path / "b"), **cfg))
    assert (out / "day_0").read_bytes() == (again / "day_0").read_bytes()
    lines = _fields(out)
    assert len(lines) == 3000 and {len(f) for f in lines} == {40}
    for j, size in enumerate(SIZES):
        col = [f[1 + NUM_DENSE + j] for f in lines]
        lists = [c.split("|") for c in col if c]
        assert 0.05 < col.count("") / len(col) < 0.15  # missing: an empty field
        assert {len(x) for x in lists} == {size}  # fixed: every present list holds `size` ids
        assert all(len(i) == 8 and int(i, 16) >= 0 for x in lists for i in x)
    settings = json.loads((out / "oracle.json").read_text())["settings"]
    assert settings["multi_hot_sizes"] == SIZES and settings["multi_hot_lengths"] == "fixed"
    # the default still writes one id per field and records no list settings
    plain = synth(SynthConfig(output=str(tmp_path / "plain"), **SMALL))
    assert "|" not in (plain / "day_0").read_text()
    assert "multi_hot_sizes" not in json.loads((plain / "oracle.json").read_text())["settings"]


def test_uniform_lengths_have_the_size_as_mean(tmp_path: Path):
    out = synth(
        SynthConfig(
            output=str(tmp_path / "u"),
            **dict(SMALL, missing_rate=0.0),
            multi_hot_sizes="mlperf",
            multi_hot_lengths="uniform",
        )
    )
    lines = _fields(out)
    for j, size in enumerate(MLPERF_MULTI_HOT_SIZES):
        lengths = np.array([len(f[1 + NUM_DENSE + j].split("|")) for f in lines])
        assert lengths.min() >= 1 and lengths.max() <= max(1, 2 * size - 1)
        assert abs(lengths.mean() - size) < 0.1 * size + 0.05


def test_the_oracle_score_uses_every_id_of_a_list(tmp_path: Path):
    """The oracle's logit recomputed from the written text alone (ids parsed back to ranks) with
    the click model spelled out: mean effect and mean latent vector per list, mean pair effect
    over the crossed lists."""
    cfg = SynthConfig(output=str(tmp_path), **SMALL, multi_hot_sizes=SIZES, cross_scale=1.0)
    model = build_model(cfg, table_sizes(cfg))
    text, score, _, _ = _make_chunk(model, cfg, 5, 0, 0, 300)
    rank = [{h: r for r, h in enumerate(m.to_pylist())} for m in model.hex_ids]
    for line, want in zip(text.decode().splitlines(), score):
        f = line.split("\t")
        dense = np.array([math.log1p(max(int(x), 0)) if x else 0.0 for x in f[1 : 1 + NUM_DENSE]])
        logit = model.bias + ((dense - model.dense_mean) / model.dense_std) @ model.dense_w
        ids = []
        for j, field in enumerate(f[1 + NUM_DENSE :]):
            empty = len(model.cdfs[j])  # the empty value's index
            ids.append([rank[j][h] for h in field.split("|")] if field else [empty])
            logit += np.mean([model.effects[j][i] for i in ids[j]])
        means = [np.mean([model.latents[j][i] for i in x], axis=0) for j, x in enumerate(ids)]
        logit += sum(means[a] @ means[b] for a in range(26) for b in range(a + 1, 26))
        pairs = [(a, b) for a in ids[0] for b in ids[1]]
        cross = pair_effect(np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]), 5)
        logit += 1.0 * cross.mean()
        assert logit == pytest.approx(float(want), abs=1e-4)


def test_bad_sizes_are_refused(tmp_path: Path):
    for sizes, says in [
        ("tpu", "only preset is 'mlperf'"),
        ([2] * 25, "need 26 ints >= 1"),
        ([2.5] + [1] * 25, r"multi_hot_sizes\[0\]=2.5: not an integer"),
        ([100_000_000] + [1] * 25, "100,000,025 ids a line make lines of about 900,000,225 bytes"),
    ]:
        with pytest.raises(ValueError, match=says):
            synth(SynthConfig(output=str(tmp_path), **SMALL, multi_hot_sizes=sizes))


def test_default_bytes_unchanged(tmp_path: Path):
    from test_synth_cross import DEFAULT_SHA256

    out = synth(SynthConfig(output=str(tmp_path), **SMALL, multi_hot_sizes=[]))
    assert hashlib.sha256((out / "day_0").read_bytes()).hexdigest() == DEFAULT_SHA256


def test_synth_multi_hot_output_preprocesses_as_it_is(tmp_path: Path, capsys):
    """``synth multi_hot_sizes=mlperf`` then ``preprocess`` stopped at "categorical not 1-8 hex
    digits" until the user wrote a 15-column schema: synth writes it (schema.yaml beside its
    output) and preprocess reads it; without it, the error names ``schema=``."""
    from dlrm_cache.data.config import PreprocessConfig
    from dlrm_cache.data.format import Manifest
    from dlrm_cache.data.preprocess import PreprocessError, preprocess

    raw = synth(SynthConfig(output=str(tmp_path / "raw"), **SMALL, multi_hot_sizes="mlperf"))
    pp = dict(input=str(raw), progress=False, workers=1)
    preprocess(PreprocessConfig(output=str(tmp_path / "ds"), **pp))
    multi = [f"C{j + 1}" for j, s in enumerate(MLPERF_MULTI_HOT_SIZES) if s > 1]
    assert len(multi) == 15 and Manifest.load(tmp_path / "ds").multi_hot == multi
    assert f"schema from {raw / 'schema.yaml'}" in capsys.readouterr().out
    (raw / "schema.yaml").unlink()
    with pytest.raises(PreprocessError, match=r"a multi-hot list: .*\(schema=") as err:
        preprocess(PreprocessConfig(output=str(tmp_path / "no_schema"), **pp))
    assert "\n" not in str(err.value) and not (tmp_path / "no_schema").exists()
    # one-hot again: synth removes the schema it wrote, its text is Criteo's
    synth(SynthConfig(output=str(raw), **SMALL, multi_hot_sizes="mlperf"))
    synth(SynthConfig(output=str(raw), **SMALL))
    assert not (raw / "schema.yaml").exists()
