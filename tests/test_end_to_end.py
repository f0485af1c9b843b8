"""synth -> preprocess -> train, the way a user runs it: planted signal is learned, and the
frequency cache trains exactly the model that host-resident tables train (one and two ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from dlrm_cache.commands.store import config_dir, register_configs
from dlrm_cache.train.loop import train
from dlrm_cache.train.saved import Checkpoint


@pytest.fixture
def dataset(processed_synth: Path) -> Path:
    return processed_synth


def compose_train(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def common(data: Path, run: Path) -> list[str]:
    return [
        f"data.path={data}",
        f"run_dir={run}",
        "device=cpu",
        "progress=false",
        "data.batch_size=256",
        "model.embedding_dim=8",
        "model.bottom_mlp=[32]",
        "model.top_mlp=[32]",
        "log_every=20",
    ]


def tables_and_dense(run: Path, step: int) -> dict[str, torch.Tensor]:
    c = Checkpoint(run / "checkpoints" / f"step_{step:08d}")
    out = {f"dense.{k}": v for k, v in c.dense["model"].items()}
    out.update(c.tables(list(c.meta["tables"])))
    return out


def test_planted_signal_is_learned(dataset: Path, tmp_path: Path):
    summary = train(compose_train(common(dataset, tmp_path / "run") + ["epochs=2"]))
    oracle = json.loads((dataset.parent / "raw" / "oracle.json").read_text())["oracle_auc"]
    assert summary["oracle_auc"] == pytest.approx(oracle)
    assert summary["val_auc"] > 0.62, summary
    assert summary["val_auc"] < oracle + 0.02  # nothing learns better than the planted model
    assert summary["train_samples_per_s"] > 0


@pytest.mark.parametrize("policy, lookahead", [("freq", 2), ("lru", 0)])
def test_freq_cache_trains_the_same_model_as_host(dataset: Path, tmp_path: Path, policy, lookahead):
    steps = ["max_steps=40", "eval_every=20"]
    host = train(compose_train(common(dataset, tmp_path / "host") + steps))
    cached = train(
        compose_train(
            common(dataset, tmp_path / "cache")
            + steps
            + [
                "embedding=freq_cache",
                "embedding.cache_ratio=0.05",
                f"embedding.policy={policy}",
                f"embedding.lookahead={lookahead}",
            ]
        )
    )
    a, b = tables_and_dense(tmp_path / "host", 40), tables_and_dense(tmp_path / "cache", 40)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)
    assert cached["val_auc"] == pytest.approx(host["val_auc"], abs=1e-4)
    # the cache really was small and busy: rows moved in and out
    records = [
        json.loads(l) for l in (tmp_path / "cache" / "metrics.jsonl").read_text().splitlines()
    ]
    train_records = [r for r in records if r["kind"] == "train"]
    assert sum(r["rows_loaded"] for r in train_records) > 0
    assert sum(r["rows_written_back"] for r in train_records) > 0
    assert 0 < train_records[-1]["hit_rate"] < 1
    # every training lookup counted once, evaluation's (at step 20) in none of the train records
    assert (
        sum(r["accesses"] for r in train_records) == cached["embedding_accesses"] == 40 * 256 * 26
    )


def test_freq_cache_overflow_and_deferral_train_host_bit_for_bit(dataset: Path, tmp_path: Path):
    """Without window sizing a small cache sends batches down the deferral and overflow paths.
    With plain Adagrad as the sparse optimizer, freq_cache gives exactly host's parameters and
    metrics (rowwise Adagrad's differ in the last bit from the first step, on the CPU), so exact
    equality is asserted: a tolerance would hide a stale row."""
    steps = ["max_steps=24", "eval_every=10", "eval_batches=2", "optim.sparse.name=adagrad"]
    host = train(compose_train(common(dataset, tmp_path / "host") + steps))
    cache = [
        "embedding=freq_cache",
        "embedding.cache_ratio=0.135",  # on this data: some batches overflow, some do not
        "embedding.batch_size=0",  # no window sizing: the overflow path is taken
        "embedding.lookahead=3",
        "embedding.policy=lru",
    ]
    cached = train(compose_train(common(dataset, tmp_path / "cache") + steps + cache))
    assert cached["embedding_overflow_batches"] > 0 and cached["embedding_deferred_batches"] > 0
    assert cached["embedding_overflow_batches"] < 24  # some batches took the normal path
    a, b = tables_and_dense(tmp_path / "host", 24), tables_and_dense(tmp_path / "cache", 24)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(b[k], a[k]), k
    assert (cached["val_auc"], cached["val_logloss"]) == (host["val_auc"], host["val_logloss"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_training_freq_cache_equals_hbm(dataset: Path, tmp_path: Path):
    steps = ["max_steps=40", "device=cuda"]
    hbm = train(compose_train(common(dataset, tmp_path / "hbm") + steps + ["embedding=hbm"]))
    # 25%: the cache's normal path (smaller caches send every batch of this data to the overflow path)
    cached = train(
        compose_train(
            common(dataset, tmp_path / "cache")
            + steps
            + ["embedding=freq_cache", "embedding.cache_ratio=0.25", "embedding.lookahead=2"]
        )
    )
    a, b = tables_and_dense(tmp_path / "hbm", 40), tables_and_dense(tmp_path / "cache", 40)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)
    assert cached["val_auc"] == pytest.approx(hbm["val_auc"], abs=1e-3)
    assert cached["embedding_overflow_batches"] == 0 and cached["embedding_evictions"] > 0, cached


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_model_with_host_tables_and_uvm_cache_train(dataset: Path, tmp_path: Path):
    """The baselines under a GPU model: host tables (CPU kernels, rows copied over) and fbgemm's
    UVM cache both train the same model as hbm."""
    steps = ["max_steps=20", "device=cuda"]
    hbm = train(compose_train(common(dataset, tmp_path / "hbm") + steps + ["embedding=hbm"]))
    for name in ("host", "uvm_cache"):
        other = train(
            compose_train(common(dataset, tmp_path / name) + steps + [f"embedding={name}"])
        )
        a, b = tables_and_dense(tmp_path / "hbm", 20), tables_and_dense(tmp_path / name, 20)
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-3, atol=1e-4, msg=f"{name} {k}")
        assert other["val_auc"] == pytest.approx(hbm["val_auc"], abs=2e-3)
