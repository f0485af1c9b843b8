"""synth's planted feature cross (``cross_scale``): off by default, with the bytes of the generator
without it; on, the same features with labels drawn from a logit holding a (C1, C2) pair effect."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from dlrm_cache.data.config import SynthConfig
from dlrm_cache.data.synth import synth
from dlrm_cache.data.synthmodel import pair_effect

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
