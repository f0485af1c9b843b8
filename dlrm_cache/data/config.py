"""Config schemas of the data commands (`dlrm-cache synth`, `dlrm-cache preprocess`).

``configs/synth.yaml`` and ``configs/preprocess.yaml`` name these schemas in their defaults lists, so a
misspelt key, an ill-typed value or an unknown choice fails when Hydra composes the config; ranges
are declared on the fields (:func:`dlrm_cache.config.ranges.checked`) and checked right after.  The command functions
(:func:`dlrm_cache.data.synth.synth`, :func:`dlrm_cache.data.preprocess.preprocess`) take either the
dataclass itself or an OmegaConf object built from it; they never need Hydra to be initialized.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config.ranges import MAX_SEED, Choice, checked


class Split(Choice):
    fraction = "fraction"  # Kaggle: by line position
    day = "day"  # 1TB: by file


class ListLengths(Choice):
    fixed = "fixed"  # every present field holds exactly its size's ids (MLPerf's synthetic set)
    uniform = "uniform"  # uniform on 1 .. 2*size-1 ids (mean: the size)


class MultiHotDistribution(Choice):
    uniform = "uniform"  # MLPerf's: extra ids uniform over the table
    pareto = "pareto"  # MLPerf's: Pareto(a=0.25) offsets, modulo the table size


class Format(Choice):
    criteo = "criteo"  # label, I1..I13 (integers), C1..C26 (hex ids), tab-separated, no header
    tsv = "tsv"  # tab-separated text, no quoting
    csv = "csv"  # comma-separated text, fields may be "quoted" (never across lines)
    parquet = "parquet"  # parquet files; list columns are multi-hot features


class Transform(Choice):
    log1p = "log1p"  # log(1 + max(x, 0)) (Criteo's)
    none = "none"  # x as is
    standardize = "standardize"  # (x - mean) / std over the training split


@dataclass
class DenseColumn:
    """A dense input column: its name (in the header, the parquet schema or ``columns``)."""

    name: str = checked("", pattern=r"[^\s|]+")
    transform: Transform = Transform.log1p  # applied by preprocess (empty -> 0 first)


@dataclass
class SparseColumn:
    """A categorical input column: one id per sample, or (``multi_hot``) a list of them."""

    name: str = checked("", pattern=r"[^\s|]+")
    multi_hot: bool = False  # text: ids separated by schema.LIST_SEPARATOR; parquet: a list column
    hash: int = checked(0, ge=0)  # >0: id := id mod hash (0: preprocess's hash_modulus)


@dataclass
class SchemaConfig:
    """The raw data's layout (:mod:`dlrm_cache.data.schema`); the default is Criteo's.

    ``format: criteo`` keeps Criteo's columns (``dense`` must stay empty); ``sparse`` may then list
    some of C1..C26 to make them multi-hot or give them their own ``hash``.  Any other format
    names every column it uses.
    """

    format: Format = Format.criteo  # criteo | tsv | csv | parquet (the input files' format)
    header: bool = False  # text: the first line of every file names the columns
    # text without a header: the file's columns in order (empty: label, dense..., sparse...)
    columns: list[str] = field(default_factory=list)
    label: str = "label"  # the 0/1 click column
    dense: list[DenseColumn] = field(default_factory=list)  # [{name, transform}], in model order
    # [{name, multi_hot, hash}], in model order (the embedding tables' order)
    sparse: list[SparseColumn] = field(default_factory=list)


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
    # Seeds the rows drawn from the planted model (null: ``seed``'s rows).  ``seed`` alone fixes
    # the planted model (ids, effects, the cross), so two sets of one ``seed`` and different
    # ``sample_seed`` are independent samples of one model: tune on one, measure on the other.
    sample_seed: int | None = checked(None, ge=0)
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
    # Multi-hot features (data/synthlists.py): mean ids per sample of each of the 26 features
    # (1: one-hot), or "mlperf" (MLPerf DLRM v2's sizes); empty: every feature one-hot.  A
    # multi-hot field's ids are written hex, separated by "|"; a missing field is an empty list.
    multi_hot_sizes: Any = field(default_factory=list)
    multi_hot_lengths: ListLengths = ListLengths.fixed  # how many ids a present field holds
    gzip: bool = False  # write day_N.gz instead of plain text
    force: bool = False  # regenerate even if `output` already holds these exact files
    progress: bool = True  # tqdm progress bar


@dataclass
class PreprocessConfig:
    """Raw data (Criteo text, or any ``schema``) -> processed dataset (:mod:`dlrm_cache.data.format`)."""

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
    overwrite: bool = False  # rebuild even if `output` already holds a dataset
    progress: bool = True  # tqdm progress bars
    # MLPerf DLRM v2's synthetic multi-hot set (data/multihot.py): with `input` a processed
    # one-hot dataset, ids per sample of each feature ("mlperf": MLPerf's 26 sizes, or one int
    # >= 1 per feature); each one-hot id x becomes [x, *T[x]] with MLPerf's lookup tables T.
    multi_hot_sizes: Any = field(default_factory=list)
    multi_hot_distribution: MultiHotDistribution = MultiHotDistribution.uniform  # T's ids
    # seeds T as MLPerf's np.random.seed (0 in MLPerf)
    multi_hot_seed: int = checked(0, ge=0, le=MAX_SEED)
    # the raw data's layout: a config group (schema=criteo, the default; your own file through
    # hydra.searchpath), see docs/data.md, "Your own dataset"
    schema: SchemaConfig = field(default_factory=SchemaConfig)
