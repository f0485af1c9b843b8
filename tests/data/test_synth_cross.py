"""synth's planted feature cross (``cross_scale``, ``cross``): off by default, with the bytes of the
generator without it; on, the same features with labels drawn from a logit holding a (C1, C2) pair
effect (``ids``) or the product of I1 and I2's standardized values (``dense``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from dlrm_cache.data.config import SynthConfig
from dlrm_cache.data.synth import synth
from dlrm_cache.data.synthmodel import build_model, pair_effect, sample, table_sizes

SMALL = {"lines": 3000, "cardinality_scale": 0.001, "progress": False, "seed": 5}
# day_0 of SMALL as the generator wrote it before the cross existed (GENERATOR_VERSION 1)
DEFAULT_SHA256 = "2f950ed28b28c71874dc2ffcc0cc8578c52bd3977d9d7533321e7ba917d991fd"


def _lines(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in (path / "day_0").read_text().splitlines()]


def test_default_output_is_the_generators_without_a_cross(tmp_path: Path):
    out = synth(SynthConfig(output=str(tmp_path / "plain"), **SMALL))
    assert hashlib.sha256((out / "day_0").read_bytes()).hexdigest() == DEFAULT_SHA256
    assert "cross_scale" not in json.loads((out / "oracle.json").read_text())["settings"]


def test_cross_changes_labels_only_and_is_recorded(tmp_path: Path):
    plain = _lines(synth(SynthConfig(output=str(tmp_path / "plain"), **SMALL)))
    out = synth(SynthConfig(output=str(tmp_path / "cross"), cross_scale=2.0, **SMALL))
    crossed = _lines(out)
    assert [x[1:] for x in crossed] == [x[1:] for x in plain]  # every feature as before
    changed = sum(a[0] != b[0] for a, b in zip(crossed, plain))
    assert 0.05 * len(plain) < changed < 0.5 * len(plain)
    assert json.loads((out / "oracle.json").read_text())["settings"]["cross_scale"] == 2.0


def test_pair_effect_is_a_standard_cross_of_both_ids():
    a, b = np.meshgrid(np.arange(300), np.arange(300), indexing="ij")
    c = pair_effect(a.ravel(), b.ravel(), 7).reshape(300, 300)
    assert abs(c.mean()) < 0.01 and abs(c.std() - 1) < 0.01 and np.abs(c).max() <= 3**0.5
    # not a sum of per-id effects: the double-centred table keeps (nearly) all its variance
    centred = c - c.mean(0) - c.mean(1)[:, None] + c.mean()
    assert centred.var() > 0.98 * c.var()
    assert not np.array_equal(c, pair_effect(a.ravel(), b.ravel(), 8).reshape(300, 300))


def _zscore(raw: np.ndarray) -> np.ndarray:
    """Preprocessing's dense transform (empty -> 0 after log1p(max(x, 0))), standardized."""
    x = np.where(np.isnan(raw), 0.0, np.log1p(np.maximum(np.nan_to_num(raw), 0)))
    return (x - x.mean()) / x.std()


def test_dense_cross_is_the_product_of_the_standardized_values():
    """cross=dense adds cross_scale * z1 * z2 to every example's noise-free logit, z recomputed
    here from the raw integers with the model's standardization."""
    cfg = SynthConfig(cross_scale=1.5, cross="dense", **SMALL)
    plain_model = build_model(SynthConfig(**SMALL), table_sizes(cfg))
    model = build_model(cfg, table_sizes(cfg))
    a = sample(plain_model, cfg, np.random.default_rng(3), 5000, with_bias=False)
    b = sample(model, cfg, np.random.default_rng(3), 5000, with_bias=False)
    np.testing.assert_array_equal(a.dense, b.dense)
    x = np.where(a.dense_missing[:, :2], 0.0, np.log1p(np.maximum(a.dense[:, :2], 0)))
    z = (x - model.dense_mean[:2]) / model.dense_std[:2]
    np.testing.assert_allclose(b.score - a.score, 1.5 * z[:, 0] * z[:, 1], rtol=1e-9, atol=1e-9)
    assert abs(np.mean(z[:, 0] * z[:, 1])) < 0.05 and abs(np.std(z[:, 0] * z[:, 1]) - 1) < 0.1


def test_dense_cross_shows_in_the_written_labels(tmp_path: Path):
    """From the files alone: with cross=dense, lines whose I1 and I2 lie on the same side of their
    means click far more often than lines on opposite sides; without it, about as often."""
    gaps = {}
    for name, extra in {"plain": {}, "dense": {"cross_scale": 3.0, "cross": "dense"}}.items():
        out = synth(SynthConfig(output=str(tmp_path / name), **(SMALL | {"lines": 6000}), **extra))
        rows = _lines(out)
        label = np.array([int(r[0]) for r in rows])
        raw = np.array([[float(r[i]) if r[i] else np.nan for i in (1, 2)] for r in rows])
        prod = _zscore(raw[:, 0]) * _zscore(raw[:, 1])
        gaps[name] = label[prod > 0.5].mean() - label[prod < -0.5].mean()
    assert gaps["dense"] > 0.3 and abs(gaps["plain"]) < 0.1, gaps
    settings = json.loads((tmp_path / "dense" / "oracle.json").read_text())["settings"]
    assert (settings["cross"], settings["cross_scale"]) == ("dense", 3.0)


def test_sample_seed_draws_new_rows_from_the_same_planted_model(tmp_path: Path):
    """sample_seed changes the rows, not the model: the two samples' ids come from one vocabulary
    (random 32-bit spellings per seed: another seed shares none), while their lines differ; unset
    or equal to seed it writes the bytes of seed alone."""

    def sample_of(name: str, **extra) -> Path:
        return synth(SynthConfig(output=str(tmp_path / name), **(SMALL | extra)))

    base, same = sample_of("base"), sample_of("same", sample_seed=SMALL["seed"])
    other, model9 = sample_of("other", sample_seed=9), sample_of("model9", seed=9)
    assert (base / "day_0").read_bytes() == (same / "day_0").read_bytes()
    rows = {p.name: _lines(p) for p in (base, other, model9)}
    assert sum(a != b for a, b in zip(rows["base"], rows["other"])) > 0.9 * SMALL["lines"]
    for col in range(14, 40):
        ids = {name: {r[col] for r in lines if r[col]} for name, lines in rows.items()}
        assert len(ids["base"] & ids["other"]) >= 0.2 * min(len(ids["base"]), len(ids["other"]))
        assert not ids["base"] & ids["model9"], col
    settings = json.loads((other / "oracle.json").read_text())["settings"]
    assert (settings["seed"], settings["sample_seed"]) == (SMALL["seed"], 9)
    assert "sample_seed" not in json.loads((base / "oracle.json").read_text())["settings"]
