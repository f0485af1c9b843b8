"""`dlrm-cache preprocess`: raw Criteo logs -> frequency statistics and parquet shards
(:mod:`dlrm_cache.data.preprocess`)."""

from __future__ import annotations

from omegaconf import DictConfig


def run(cfg: DictConfig) -> None:
    from ..data.preprocess import preprocess

    preprocess(cfg)
