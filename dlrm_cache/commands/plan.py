"""`dlrm-cache plan`: the predicted cache hit rate per cache ratio, from a dataset's frequency
statistics alone (:mod:`dlrm_cache.report.sizing`)."""

from __future__ import annotations

from omegaconf import DictConfig


def run(cfg: DictConfig) -> None:
    from ..report.sizing import plan

    plan(cfg)
