"""`dlrm-cache train`: train and evaluate a DLRM (:mod:`dlrm_cache.train.loop`), then say where the
run's files are and how to look at them."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from omegaconf import DictConfig

from ..console.say import say
from ..console.typed import invocation


def run(cfg: DictConfig) -> None:
    from ..train.loop import train

    train(cfg)
    if int(os.environ.get("RANK", "0")) == 0:  # torchrun: every rank ran this job, one tells
        say(epilogue(cfg.run_dir))


def epilogue(run_dir: str) -> str:
    """Where the run's files are and how to look at them (and at the whole sweep, under -m)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from ..rundir.records import METRICS, SUMMARY

    me = invocation()
    lines = [
        f"run files: {run_dir}/ ({METRICS}, {SUMMARY}, checkpoints/, .hydra/)",
        f"plots:     {me} report {shlex.quote(run_dir)}",
    ]
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        sweep_dir = Path(hc.runtime.cwd) / hc.sweep.dir  # as absolute as run_dir
        lines.append(
            f"sweep:     {me} report {shlex.quote(str(sweep_dir))}   (once every job has finished)"
        )
    return "\n".join(lines)
