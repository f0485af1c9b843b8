"""Config schemas of the commands that use a trained run: `dlrm-cache predict` and `export`.

Kept apart from :mod:`dlrm_cache.config.schemas` (and free of torch imports, so registering them costs the
dispatcher nothing); ``configs/predict.yaml`` and ``configs/export.yaml`` name these schemas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from ..config.choices import Which
from ..config.ranges import Choice, checked
from ..config.schemas import DEVICE
from ..data.config import BadLines, PreprocessConfig


class OutputFormat(Choice):
    auto = "auto"  # by the output's extension: .csv -> csv, anything else -> parquet
    parquet = "parquet"
    csv = "csv"


@dataclass
class TrainedConfig:
    """What `predict` and `export` read: a trained run, and the dataset it was trained on."""

    # a run directory (its best or its final checkpoint, as `which` says; final: the newest its
    # metrics.jsonl records) or one checkpoint (checkpoints/step_N)
    checkpoint: str = MISSING
    # checkpoint= names a run directory: its best checkpoint (by its monitor.*), its last, or auto
    # (best where the run has one, else last); the output says which it took
    which: Which = Which.auto
    # the processed dataset the checkpoint was trained on (its statistics map raw ids to rows,
    # its features name the model's inputs); null: the run's data.path (a relative one: from where
    # the run was started, else beside the run directory)
    dataset: str | None = None


@dataclass
class PredictConfig(TrainedConfig):
    """`dlrm-cache predict`: click probabilities of a trained model for new lines."""

    # raw Criteo text (plain or .gz; 40 fields with the label, or 39 without it like Kaggle's
    # test.txt), or a processed dataset directory (then `split` names the split to score)
    input: str = MISSING
    # the processed dataset the checkpoint was trained on; null: a processed input itself, else
    # the run's data.path (a relative one: from where the run was started, else beside the run)
    dataset: str | None = None
    split: str = "test"  # input is a processed dataset: train | val | test
    output: str = MISSING  # predictions file, replaced atomically
    format: OutputFormat = OutputFormat.auto  # auto: csv for a name ending in .csv, else parquet
    batch_size: int = checked(
        0, ge=0
    )  # 0: the run's data.eval_batch_size (what `train test=true` used)
    bad_lines: BadLines = BadLines.skip  # as preprocess: skip (count, report a few) | fail
    bad_line_reports: int = checked(PreprocessConfig.bad_line_reports, ge=0)  # as preprocess's
    chunk_bytes: int = checked(
        PreprocessConfig.chunk_bytes, ge=1
    )  # raw bytes parsed at a time (memory ~ 10x)
    device: str = checked("cpu", pattern=DEVICE)  # auto | cpu | cuda | cuda:N
    progress: bool = True  # tqdm progress bar


@dataclass
class ExportConfig(TrainedConfig):
    """`dlrm-cache export`: a checkpoint as a torchrec DLRM state dict + constructor arguments."""

    output: str = MISSING  # a directory: state_dict.pt + dlrm.json (replaced atomically)


def require(cfg: Any, **examples: str) -> None:
    """A ValueError naming the first of these keys that was not given (Hydra's own error for a
    missing value comes after a line of its own), with an example value."""
    for key, example in examples.items():
        missing = (
            OmegaConf.is_missing(cfg, key)
            if isinstance(cfg, DictConfig)
            else getattr(cfg, key) == MISSING
        )
        if missing:
            raise ValueError(f"{key}: required, e.g. {key}={example}")
