"""`dlrm-cache report RUN [RUN ...]`: plots and a markdown summary of run directories or a -m
sweep directory (:mod:`dlrm_cache.report.report`)."""

from __future__ import annotations

from omegaconf import DictConfig


def run(cfg: DictConfig, run_dirs: tuple[str, ...] = ()) -> None:
    """``run_dirs``: the directories typed before the overrides (the dispatcher takes them off)."""
    from ..report.report import report

    cfg.runs = [*run_dirs, *cfg.runs]
    report(cfg)
