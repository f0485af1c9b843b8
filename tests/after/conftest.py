"""Trained runs of the real synth -> preprocess dataset, shared by the predict/export/tensorboard tests.

One host run and one freq_cache run (with ``logger.tensorboard=true``) in this process, a
two-rank row-sharded run under torchrun's launcher (gloo); each with ``test=true``, so the test
split's metrics the run reported are there to compare predict with.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from after_runs import Run, _train, _train_entry, train_overrides


@pytest.fixture(scope="session")
def host_run(processed_synth: Path, tmp_path_factory) -> Run:
    run = tmp_path_factory.mktemp("host") / "run"
    return Run(run, _train(train_overrides(processed_synth, run, [])))


@pytest.fixture(scope="session")
def cached_run(processed_synth: Path, tmp_path_factory) -> Run:
    """freq_cache (a small cache, rows moving) with live TensorBoard scalars and a mid-run evaluation."""
    run = tmp_path_factory.mktemp("cached") / "run"
    extra = ["embedding=freq_cache", "embedding.cache_ratio=0.05", "embedding.lookahead=2", "eval_every=20",
             "logger.tensorboard=true"]
    return Run(run, _train(train_overrides(processed_synth, run, extra)))


@pytest.fixture(scope="session")
def two_rank_run(processed_synth: Path, tmp_path_factory) -> Run:
    """Two ranks, every table over 20 rows split row-wise: the checkpoint holds row-range pieces."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    run = tmp_path_factory.mktemp("two") / "run"
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id=uuid.uuid4().hex,
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                          monitor_interval=0.1, start_method="spawn")
    out = elastic_launch(config, _train_entry)(train_overrides(processed_synth, run, ["shard_rows_above=20"]))
    return Run(run, out[0])


@pytest.fixture(scope="session")
def raw_test_lines(processed_synth: Path) -> list[bytes]:
    """The raw lines that became the processed test split (bad ones included), from the synth file."""
    manifest = json.loads((processed_synth / "manifest.json").read_text())
    (source,) = manifest["sources"]
    lo, hi = manifest["split_spec"]["lines"]["test"]
    return Path(source).read_bytes().split(b"\n")[lo:hi]
