"""Shared fixtures. A small processed dataset written straight in the on-disk format (no preprocessing involved),
with a planted signal so that a trained model must beat chance."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from launching import ForkedCli
from shards import write_split

from dlrm_cache.data.format import (
    DENSE_NAMES,
    LABEL,
    SCHEMA_VERSION,
    SPARSE_NAMES,
    Manifest,
)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test`'s workers share the cores: one thread of torch's (and of its children's) each,
    # instead of every worker's thread pool spinning against the others'
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def write_dataset(
    root: Path, rows: dict[str, int], table_sizes: list[int], shard_rows: int = 700, seed: int = 0
) -> Manifest:
    rng = np.random.default_rng(seed)
    effects = [rng.normal(0, 1.0, n) for n in table_sizes]
    w = rng.normal(0, 0.5, len(DENSE_NAMES))

    def shard_tables(n: int):
        for lo in range(0, n, shard_rows):
            m = min(shard_rows, n - lo)
            dense = rng.exponential(1.0, (m, len(DENSE_NAMES))).astype(np.float32)
            # power-law ids: rank r drawn with probability ~ 1/(r+1)
            ids = [np.minimum((rng.pareto(1.2, m)).astype(np.int64), t - 1) for t in table_sizes]
            z = dense @ w + sum(e[i] for e, i in zip(effects, ids)) * 0.6 - 0.5
            labels = (rng.random(m) < 1 / (1 + np.exp(-z))).astype(np.float32)
            cols = {LABEL: labels}
            cols.update({n_: dense[:, j] for j, n_ in enumerate(DENSE_NAMES)})
            cols.update(
                {
                    n_: ids[j].astype(np.int32)
                    for j, n_ in enumerate(SPARSE_NAMES[: len(table_sizes)])
                }
            )
            yield cols

    splits = {split: write_split(root, split, shard_tables(n)) for split, n in rows.items()}
    stats = root / "stats"
    stats.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        table_sizes=list(table_sizes),
        splits=splits,
        stats_digest="none",
        min_count=1,
        hash_modulus=0,
        sources=[],
        sparse_names=SPARSE_NAMES[: len(table_sizes)],
    )
    manifest.save(root)
    return manifest


@pytest.fixture(autouse=True)
def _no_forked_cli_left():
    """A test that failed while a ForkedCli ran leaves no child behind (it would hold the worker)."""
    yield
    ForkedCli.end_all()


@pytest.fixture(scope="session")
def dataset_writer():
    """``write_dataset``, for tests that need datasets of their own shape or damage them."""
    return write_dataset


@pytest.fixture
def small_dataset(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    write_dataset(root, {"train": 6000, "val": 2000, "test": 1000}, [50, 200, 1000, 30, 500])
    return root


@pytest.fixture(scope="session")
def shared_small_dataset(tmp_path_factory) -> Path:
    """The small dataset, written once for the tests that only read it."""
    root = tmp_path_factory.mktemp("shared") / "ds"
    write_dataset(root, {"train": 6000, "val": 2000, "test": 1000}, [50, 200, 1000, 30, 500])
    return root


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    """Train 2000 and val 500 rows (no test split), written once, for tests that only read it."""
    root = tmp_path_factory.mktemp("tiny") / "ds"
    write_dataset(root, {"train": 2000, "val": 500}, [50, 200, 1000, 30, 500])
    return root


@pytest.fixture(scope="session")
def processed_synth(tmp_path_factory) -> Path:
    """A real `synth` -> `preprocess` dataset (with frequency statistics and oracle.json)."""
    from dlrm_cache.data.config import PreprocessConfig, SynthConfig
    from dlrm_cache.data.preprocess import preprocess
    from dlrm_cache.data.synth import synth

    root = tmp_path_factory.mktemp("synth")
    synth(
        SynthConfig(
            output=str(root / "raw"),
            lines=24_000,
            cardinality_scale=0.0005,
            min_cardinality=8,
            progress=False,
            seed=3,
        )
    )
    preprocess(
        PreprocessConfig(
            input=str(root / "raw"),
            output=str(root / "processed"),
            rows_per_shard=5000,
            progress=False,
        )
    )
    return root / "processed"


@pytest.fixture(scope="session")
def processed_synth_multi_hot(processed_synth: Path, tmp_path_factory) -> Path:
    """processed_synth with MLPerf DLRM v2's multi-hot list sizes (`preprocess input=<processed_synth>
    multi_hot_sizes=mlperf`), written once, read only."""
    from dlrm_cache.data.config import PreprocessConfig
    from dlrm_cache.data.preprocess import preprocess

    out = tmp_path_factory.mktemp("synth_mh") / "processed"
    preprocess(
        PreprocessConfig(
            input=str(processed_synth), output=str(out), multi_hot_sizes="mlperf", progress=False
        )
    )
    return out


@pytest.fixture(scope="session")
def multi_hot_dataset(tmp_path_factory) -> Path:
    """A small processed multi-hot dataset (tests/multihot_data.py), written once, read only."""
    from multihot_data import write_multi_hot

    root = tmp_path_factory.mktemp("multihot") / "ds"
    write_multi_hot(root, {"train": 3000, "val": 1000, "test": 500})
    return root


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory that takes no new files: mode 0o555, or (root ignores modes) a read-only bind
    mount of it; skipped where neither holds."""
    d = tmp_path / "ro"
    d.mkdir()
    mounted = False
    if os.geteuid() != 0:
        d.chmod(0o555)
    else:
        ok = subprocess.run(["mount", "--bind", str(d), str(d)], capture_output=True).returncode
        mounted = ok == 0
        if mounted:
            subprocess.run(["mount", "-o", "remount,ro,bind", str(d)], capture_output=True)
    try:
        if os.access(d, os.W_OK):
            pytest.skip("no read-only directory can be made here")
        yield d
    finally:
        if mounted:
            subprocess.run(["umount", str(d)], capture_output=True)
        d.chmod(0o755)


# Test modules whose tests train, run the CLI in child processes or torchrun ranks (more than ~6 s
# a module on a 2-core CPU): marked ``slow``, so `make test-quick` (``-m "not slow"``) runs the
# unit-level rest. The whole suite (`make test`, CI) runs everything, these first and the longest
# first (as measured under `make test`, docs/development.md): parallel workers (pytest-xdist, whole
# modules each) then end on short modules instead of one waiting for the other's long one.
SLOW_MODULES = (
    "train/test_integrity.py",
    "train/test_reliability.py",
    "test_config_ranges.py",
    "parallel/test_distributed.py",
    "data/test_bad_input.py",
    "train/test_guard.py",
    "test_report.py",
    "data/test_preprocess_workers.py",
    "test_cli.py",
    "streams/test_stream_discipline.py",
    "embedding/test_freq_cache.py",
    "train/test_signals_everywhere.py",
    "data/test_preprocess.py",
    "parallel/test_rank_data.py",
    "test_bench_plan.py",
    "test_cli_help.py",
    "test_schema_end_to_end.py",
    "data/test_schema.py",
    "train/test_presets.py",
    "test_readme_commands.py",
    "parallel/test_dcn_training.py",
    "after/test_output_safety.py",
    "after/test_predict.py",
    "data/test_multihot.py",
    "train/test_train.py",
    "train/test_preflight.py",
    "test_plan.py",
    "data/test_verify.py",
    "train/test_run_log.py",
    "after/test_export.py",
    "embedding/test_multi_hot.py",
    "parallel/test_sharded_syncs.py",
    "data/test_multihot_checks.py",
    "train/test_multihot_train.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    root = Path(__file__).parent
    rank = {m: k for k, m in enumerate(SLOW_MODULES)}
    for item in items:
        if item.path.relative_to(root).as_posix() in rank:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))
