"""`dlrm-cache plan` predicts the job `train` runs: the same groups' settings, and per-table hit
rates of the pooled cache as built, checked against a measured run (through the real CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from launching import run_cli
from omegaconf import OmegaConf
from tiny import TINY_MODEL

from dlrm_cache.commands.store import config_dir, register_configs
from dlrm_cache.config.schemas import FreqCacheEmbeddingConfig
from dlrm_cache.embedding.freq_cache.layout import pinned_batches

# the measured run starts from a cold cache (its hottest dynamic rows are loaded once) and draws
# 80 batches: it measures a little below the steady state plan predicts (0.952 against 0.957)
OVERALL_TOLERANCE = 0.01
PER_TABLE_TOLERANCE = 0.03
SMALL = TINY_MODEL


def _cfg_job(command: str, *overrides: str) -> dict:
    """What `dlrm-cache COMMAND OVERRIDES --cfg job` prints, as data (Hydra's composition)."""
    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(command, overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=False)


def test_plan_takes_the_batch_dimension_and_layout_train_uses():
    """No setting of its own: `plan` composes data, model and embedding as `train
    embedding=freq_cache` does (the default job's batch of 1024, not 16384), overrides included."""
    for extra in ([], ["data=criteo_kaggle", "model=mlperf", "embedding.lookahead=1"]):
        planned = _cfg_job("plan", *extra)
        trained = _cfg_job("train", "embedding=freq_cache", *extra)
        for group in ("data", "model", "embedding"):
            assert planned[group] == trained[group], group
    assert planned["data"]["batch_size"] == 16384 and planned["model"]["embedding_dim"] == 128
    assert _cfg_job("plan")["data"]["batch_size"] == 1024


def test_plan_predicts_the_measured_hit_rate_per_table(processed_synth: Path, tmp_path: Path):
    ratio, batch = 0.05, 256
    run = tmp_path / "run"
    common = [f"data.path={processed_synth}", f"data.batch_size={batch}", *SMALL]
    res = run_cli(
        "train",
        *common,
        "embedding=freq_cache",
        f"embedding.cache_ratio={ratio}",
        "device=cpu",
        "progress=false",
        "eval_batches=1",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    measured = json.loads((run / "summary.json").read_text())
    out = tmp_path / "plan.json"
    res = run_cli(
        "plan", *common, f"ratios=[{ratio}]", f"output={out}", "figure=null", cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr
    assert (
        f"window: {pinned_batches(FreqCacheEmbeddingConfig.lookahead)} batches of {batch}"
        in res.stdout
    )
    (predicted,) = json.loads(out.read_text())
    # the cache plan describes is the one the run built
    assert predicted["cache_rows"] == measured["embedding_cache_rows"]
    assert predicted["static_rows"] == measured["embedding_static_rows"]
    assert predicted["hit_rate"] == pytest.approx(
        measured["embedding_hit_rate"], abs=OVERALL_TOLERANCE
    )
    per_table = predicted["per_table"]
    assert len(per_table) == 26
    for name, rate in per_table.items():
        assert rate == pytest.approx(
            measured[f"embedding_hit_rate/{name}"], abs=PER_TABLE_TOLERANCE
        ), name
    # the pooled cache ranks the tables as the run measured them: the worst three agree
    worst = sorted(per_table, key=per_table.get)[:3]
    measured_worst = sorted(per_table, key=lambda n: measured[f"embedding_hit_rate/{n}"])[:3]
    assert set(worst) == set(measured_worst)
