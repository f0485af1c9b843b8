"""The bench and plan commands run end to end (tiny sizes: timings are not asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from dlrm_cache.bench.run import bench
from dlrm_cache.config import BenchConfig, PlanConfig
from dlrm_cache.data.stats import load_counts
from dlrm_cache.embedding.freq_cache import plan_table
from dlrm_cache.plan import plan


def _cfg(**kw):
    return OmegaConf.structured(BenchConfig(warmup=2, iters=3, distinct_batches=4, batch_size=64,
                                            embedding_dim=8, device="cpu", figure=None, **kw))


def test_bench_embedding_compares_backends_in_one_run(tmp_path: Path):
    out = tmp_path / "b.json"
    res = bench(_cfg(kind="embedding", num_tables=3, rows_per_table=500,
                     backends=["host", "hbm", "freq_cache"], cache_ratios=[0.05, 0.2], output=str(out)))
    by = {r["variant"]: r for r in json.loads(out.read_text())}
    assert set(by) == {"host", "hbm", "freq_cache 5.0%", "freq_cache 20.0%"}
    if not torch.cuda.is_available():
        assert "needs a CUDA GPU" in by["hbm"]["error"]
    for name in ("host", "freq_cache 5.0%", "freq_cache 20.0%"):
        assert by[name]["ms_per_iter"] > 0 and by[name]["speed_vs_host"] > 0
    assert by["freq_cache 20.0%"]["hit_rate"] > by["freq_cache 5.0%"]["hit_rate"] > 0
    assert len(res) == 4


def test_bench_train_and_planning_kinds():
    res = bench(_cfg(kind="train", cardinality_scale=0.0002, backends=["host", "freq_cache"],
                     bottom_mlp=[16], top_mlp=[16]))
    assert all(r["ms_per_iter"] > 0 for r in res)
    res = bench(_cfg(kind="planning", cardinality_scale=0.0002, cache_ratios=[0.05]))
    assert res[0]["analyze_ms"] > 0 and res[0]["prefetch_ms"] > 0 and 0 < res[0]["hit_rate"] <= 1


def test_plan_predicts_from_the_stats(processed_synth: Path, tmp_path: Path):
    out = tmp_path / "plan.json"
    rows = plan(OmegaConf.structured(PlanConfig(data_path=str(processed_synth), ratios=[0.01, 0.05, 0.2],
                                                output=str(out), figure=None)))
    assert json.loads(out.read_text()) == json.loads(json.dumps(rows))
    hits = [r["hit_rate"] for r in rows]
    assert hits == sorted(hits) and 0 < hits[0] and hits[-1] <= 1
    expected = plan_table(load_counts(processed_synth), [0.01, 0.05, 0.2])
    np.testing.assert_allclose(hits, [r["hit_rate"] for r in expected])
