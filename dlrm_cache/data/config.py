"""Config schemas of the data commands (`dlrm-cache synth`, `dlrm-cache preprocess`).

``configs/synth.yaml`` and ``configs/preprocess.yaml`` name these schemas in their defaults lists, so a
misspelt key, an ill-typed value or an unknown choice fails when Hydra composes the config; ranges
are declared on the fields (:func:`dlrm_cache.ranges.checked`) and checked right after.  The command functions
(:func:`dlrm_cache.data.synth.synth`, :func:`dlrm_cache.data.preprocess.preprocess`) take either the
dataclass itself or an OmegaConf object built from it; they never need Hydra to be initialized.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..ranges import Choice, checked


class Split(Choice):
    fraction = "fraction"  # Kaggle: by line position
    day = "day"  # 1TB: by file


class CrossKind(Choice):
    ids = "ids"  # an effect per (C1 id, C2 id) pair, unrelated to either id's own effects
    dense = "dense"  # the product of I1's and I2's standardized values (DCN-v2's synthetic crosses)


class BadLines(Choice):
    skip = "skip"  # count per reason, report a few
    fail = "fail"  # stop at the first


@dataclass
class SynthConfig:
    """Synthetic Criteo-format click log with a planted (known) click model.

    Output: ``files`` text files ``day_0 … day_{files-1}`` (``.gz`` appended when ``gzip``) in
    ``output``, plus ``oracle.json`` (the generating config, table sizes and the oracle AUC).
    """

    output: str = "data/synth/raw"  # directory of the day_N files (relative to the working dir)
    lines: int = checked(500_000, ge=1)  # total lines over all files (bad lines included)
    files: int = checked(
        1, ge=1
    )  # number of day_N files; lines are split evenly, earlier files get the remainder
    seed: int = checked(0, ge=0)  # same seed and settings -> byte-identical files
    # A preset name ("kaggle": Criteo Kaggle's 26 tables) or an explicit list of 26 ints.
    cardinalities: Any = "kaggle"
    cardinality_scale: float = checked(
        0.01, gt=0
    )  # preset only: table size = min(c, max(min_cardinality, ceil(c * scale)))
    min_cardinality: int = checked(
        16, ge=1
    )  # preset only: floor for scaled tables (never above the preset's size)
    zipf_alpha: float = checked(
        1.1, ge=0
    )  # popularity of the r-th most popular id is proportional to (r + 1) ** -alpha
    missing_rate: float = checked(0.03, ge=0, le=1)  # probability that a categorical field is empty
    dense_missing_rate: float = checked(
        0.1, ge=0, le=1
    )  # probability that an integer field is empty
    bad_line_rate: float = checked(
        0.0, ge=0, lt=1
    )  # fraction of lines replaced by deliberately malformed ones
    # Planted model: logit = bias + dense part + per-id effects + pairwise (FM) id interactions.
    positive_rate: float = checked(
        0.25, gt=0, lt=1
    )  # the bias is calibrated so the mean click probability is about this
    dense_scale: float = checked(0.6, ge=0)  # std of the dense part of the logit
    id_effect_scale: float = checked(
        1.5, ge=0
    )  # std of the summed per-id effects (over the 26 features)
    interaction_scale: float = checked(0.5, ge=0)  # std of the pairwise interaction part
    cross_scale: float = checked(0.0, ge=0)  # std of the planted pairwise cross (0: none)
    cross: CrossKind = CrossKind.ids  # which two features the planted cross multiplies
    logit_noise: float = checked(
        0.0, ge=0
    )  # std of per-line logit noise the features cannot explain
    gzip: bool = False  # write day_N.gz instead of plain text
    force: bool = False  # regenerate even if `output` already holds these exact files
    progress: bool = True  # tqdm progress bar


@dataclass
class PreprocessConfig:
    """Raw Criteo text -> processed dataset (see :mod:`dlrm_cache.data.format`)."""

    # A raw file, or a directory holding day_0, day_1, ... (plain or .gz; read in numeric order)
    # or else a single train.txt[.gz].
    input: str = "data/synth/raw"
    output: str = "data/synth/processed"  # the dataset directory (manifest.json marks it complete)
    split: Split = Split.fraction  # how lines are split into train/val/test (see below)
    # split=fraction: the first floor(total * train_fraction) lines are train, the rest is halved
    # (val gets the smaller half) into val and test.
    train_fraction: float = checked(6 / 7, gt=0, le=1)
    total_lines: int = checked(
        0, ge=0
    )  # split=fraction: total lines if known (skips the counting pass); 0 = count
    # split=day: file names (relative to `input`) or paths.  All empty: every file but the last is
    # train and the last is halved into val then test.  A file listed in both val_files and
    # test_files is halved likewise.
    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)  # split=day: the validation files
    test_files: list[str] = field(default_factory=list)  # split=day: the test files
    min_count: int = checked(
        1, ge=1
    )  # training ids seen fewer times share the rare row (the last row)
    hash_modulus: int = checked(
        0, ge=0
    )  # >0: id := id mod m before counting (the empty value stays MISSING_ID)
    bad_lines: BadLines = BadLines.skip  # a malformed line: skip it (counted, reported) or fail
    bad_line_reports: int = checked(
        10, ge=0
    )  # skip: how many bad lines to print as file:line: reason
    rows_per_shard: int = checked(250_000, ge=1)  # rows of every parquet shard but the last
    chunk_bytes: int = checked(
        32 << 20, ge=1
    )  # raw bytes parsed at a time per worker (memory ~ 10x this)
    workers: int = checked(
        0, ge=0
    )  # processes per machine (0: the cores this process may use); same output for any
    cache_mb: int = checked(
        1024, ge=0
    )  # unused: every line is parsed once, pass 2 reads pass 1's columns
    overwrite: bool = False  # rebuild even if `output` already holds a dataset
    progress: bool = True  # tqdm progress bars
