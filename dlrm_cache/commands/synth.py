"""`dlrm-cache synth`: Criteo-format lines from a planted model, and its oracle AUC
(:mod:`dlrm_cache.data.synth`)."""

from __future__ import annotations

from omegaconf import DictConfig


def run(cfg: DictConfig) -> None:
    from ..data.synth import synth

    synth(cfg)
