"""Helpers of the predict/export/tensorboard tests (a module of its own: test modules import it,
and `import conftest` would not say which conftest)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_dir

from dlrm_cache.configstore import config_dir, register_configs


@dataclass
class Run:
    path: Path
    summary: dict


def compose_config(name: str, overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def train_overrides(data: Path, run_dir: Path, extra: list[str]) -> list[str]:
    # eval batches of 1000: the 1715-row test split is 2 batches, the last one partial
    return [
        f"data.path={data}",
        f"run_dir={run_dir}",
        "device=cpu",
        "progress=false",
        "data.batch_size=256",
        "data.eval_batch_size=1000",
        "model.embedding_dim=8",
        "model.bottom_mlp=[16]",
        "model.top_mlp=[16]",
        "max_steps=30",
        "log_every=10",
        "test=true",
        *extra,
    ]


def _train(overrides: list[str]) -> dict:
    from dlrm_cache.train.loop import train

    return train(compose_config("train", overrides))
