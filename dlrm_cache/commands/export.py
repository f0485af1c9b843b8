"""`dlrm-cache export`: a trained run as a torchrec DLRM state dict and constructor arguments
(:mod:`dlrm_cache.after.export`)."""

from __future__ import annotations

from omegaconf import DictConfig


def run(cfg: DictConfig) -> None:
    from ..after.export import export

    export(cfg)
