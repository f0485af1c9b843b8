"""`dlrm-cache predict`: click probabilities of a trained run for raw Criteo lines or a split
(:mod:`dlrm_cache.after.predict`)."""

from __future__ import annotations

from omegaconf import DictConfig


def run(cfg: DictConfig) -> None:
    from ..after.predict import predict

    predict(cfg)
