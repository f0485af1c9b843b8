"""The config schemas of the commands: every key, its type, its default and its range.

**Defaults live here, and only here.**  A YAML file under ``configs/`` names its schema in its
defaults list and sets only what a schema cannot say: interpolations (``${data.batch_size}``,
Hydra's output directory), values a schema leaves ``MISSING`` (a dataset path), Hydra's own
settings, and in a config group with several options (``data/``, ``model/``, ``optim/``) the values
that make a non-default option differ.  The option `train` picks by default holds nothing but what
the schema leaves ``MISSING``.  tests/test_config_defaults.py fails when a YAML file restates or
contradicts a default of this module.

Composing a config checks key names, types and choices (:mod:`.choices`); a numeric field declares
its range where it is defined (``checked(default, ge=1)``, see :mod:`.ranges`), and the dispatcher
checks them all right after composition, before any work starts.  This module does not import
Hydra: registering the schemas with it is :mod:`dlrm_cache.commands.store`'s job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from .choices import (
    Backend,
    BenchKind,
    CachePolicy,
    DenseOptimName,
    Hotness,
    Interaction,
    Monitored,
    MonitorMode,
    Pooling,
    Precision,
    SparseOptimName,
    UvmAlgorithm,
    Which,
)
from .ranges import MAX_SEED, checked

DEVICE = r"auto|cpu|cuda(:\d+)?"  # the values of a device field


# --------------------------------------------------------------------------- data / model / optim
@dataclass
class DataConfig:
    path: str = MISSING  # a processed dataset directory (with manifest.json)
    # global batch size: split across ranks under torchrun (the Criteo presets set 16384)
    batch_size: int = checked(1024, ge=1)
    eval_batch_size: int = checked(8192, ge=1)  # global batch size of evaluation (and predict)
    prefetch_batches: int = checked(
        4, ge=1
    )  # batches decoded ahead by the background reader thread
    shuffle: bool = True  # shuffle rows within each shard (and shard order) every epoch


# fbgemm's embedding kernels take rows of a multiple of 4 floats (every placement uses them)
DIM_MULTIPLE = 4


@dataclass
class ModelConfig:
    # width of every embedding row (and bottom MLP output)
    embedding_dim: int = checked(16, ge=1, multiple_of=DIM_MULTIPLE)
    # hidden layer widths of the MLP over the 13 dense features (its output is embedding_dim wide)
    bottom_mlp: list[int] = checked(factory=lambda: [512, 256, 64], ge=1)
    # a final 1-unit layer is added
    top_mlp: list[int] = checked(factory=lambda: [512, 256], ge=1, nonempty=True)
    interaction: Interaction = Interaction.dot  # dot: DLRM's pairwise dots; dcn: DCN-v2 cross net
    dcn_num_layers: int = checked(3, ge=1)  # interaction=dcn: cross layers
    dcn_low_rank_dim: int = checked(512, ge=1)  # interaction=dcn: rank of each layer's cross matrix
    # a sample's ids of one feature pooled by: sum, or mean (the sum over their number; 0 ids: 0)
    pooling: Pooling = Pooling.sum


@dataclass
class SparseOptimConfig:
    name: SparseOptimName = SparseOptimName.rowwise_adagrad  # fused into fbgemm's backward
    lr: float = checked(0.05, ge=0)  # learning rate of the embedding rows
    eps: float = checked(1e-8, gt=0)  # Adagrad's denominator term


@dataclass
class DenseOptimConfig:
    name: DenseOptimName = DenseOptimName.adagrad  # the MLPs' optimizer
    lr: float = checked(0.01, ge=0)  # learning rate of the MLPs
    weight_decay: float = checked(0.0, ge=0)  # L2 penalty on the MLPs' weights
    momentum: float = checked(0.0, ge=0)  # sgd only


@dataclass
class OptimConfig:
    sparse: SparseOptimConfig = field(default_factory=SparseOptimConfig)
    dense: DenseOptimConfig = field(default_factory=DenseOptimConfig)
    # linear warm-up of both learning rates: Adagrad's first steps move every weight by about the
    # rate, whatever its gradient, which diverges wide layers and summed multi-hot lists
    warmup_steps: int = checked(100, ge=0)
    decay_start: int = checked(
        0, ge=0
    )  # step where the polynomial (power 2) decay to 0 starts (MLPerf DLRM schedule)
    decay_steps: int = checked(0, ge=0)  # steps the decay takes (0: no decay)


# --------------------------------------------------------------------------- embedding backends
@dataclass
class EmbeddingConfig:
    """What every placement's schema has: the backend class Hydra instantiates."""

    _target_: str = MISSING


@dataclass
class HostEmbeddingConfig(EmbeddingConfig):
    _target_: str = "dlrm_cache.embedding.direct.HostBackend"


@dataclass
class HbmEmbeddingConfig(EmbeddingConfig):
    _target_: str = "dlrm_cache.embedding.direct.HbmBackend"


@dataclass
class UvmCacheEmbeddingConfig(EmbeddingConfig):
    _target_: str = "dlrm_cache.embedding.direct.UvmCacheBackend"
    cache_ratio: float = checked(0.015, gt=0, le=1)  # fraction of all rows in fbgemm's device cache
    algorithm: UvmAlgorithm = UvmAlgorithm.lru  # fbgemm's set-associative cache
    host_mapped: bool = True  # cudaHostAlloc-mapped host memory rather than CUDA managed memory


@dataclass
class FreqCacheEmbeddingConfig(EmbeddingConfig):
    _target_: str = "dlrm_cache.embedding.freq_cache.FreqCacheBackend"
    cache_ratio: float = checked(0.015, gt=0, le=1)  # fraction of all rows held in the device cache
    policy: CachePolicy = CachePolicy.freq  # eviction: dataset counts, observed counts or last use
    refresh_counts: bool = False  # freq policy: add observed counts to the dataset counts
    # batches whose rows are fetched ahead (0 = synchronous); from 2 on, rounds of two batches
    lookahead: int = checked(3, ge=0)
    static_fraction: float = checked(
        0.5, ge=0, le=1
    )  # share of the cache pinned to the hottest rows (never evicted)
    # host threads splitting the row gathers into staging and the write-backs' scatters (0: 1 on
    # a CPU device, whose step uses every core; up to 4 on a GPU)
    planner_threads: int = checked(0, ge=0)
    # samples per step whose ids the look-ahead window must hold (the trainer's global data.batch_size;
    # 0: no sizing, the window gets what cache_ratio leaves)
    batch_size: int = checked(0, ge=0)


# The backend registry: the name train's embedding=<name> and bench's backends=[...] take, and its
# schema (whose _target_ is the backend class).
EMBEDDING_SCHEMAS: dict[Backend, type[EmbeddingConfig]] = {
    Backend.host: HostEmbeddingConfig,
    Backend.hbm: HbmEmbeddingConfig,
    Backend.uvm_cache: UvmCacheEmbeddingConfig,
    Backend.freq_cache: FreqCacheEmbeddingConfig,
}


def backend_target(name: str) -> str:
    """The class (dotted path) of the backend ``name`` (a :class:`Backend` value)."""
    return EMBEDDING_SCHEMAS[Backend(name)]._target_


def backend_name(target: str) -> str:
    """The name a user types (``embedding=freq_cache``) of the backend class ``target`` (a dotted
    path); a class of no :class:`Backend` (a custom ``_target_``): its class name."""
    names = {schema._target_: backend.value for backend, schema in EMBEDDING_SCHEMAS.items()}
    return names.get(str(target), str(target).rsplit(".", 1)[-1])


# --------------------------------------------------------------------------- commands
@dataclass
class LoggerConfig:
    """Live views of the records train writes to metrics.jsonl (which stays the source of truth)."""

    tensorboard: bool = (
        False  # every record's numbers also as TensorBoard scalars in the run dir (rank 0)
    )


@dataclass
class MonitorConfig:
    """Which checkpoint is the run's best, and when training stops early (Lightning's
    ModelCheckpoint and EarlyStopping); read from the validation evaluations (``eval_every``)."""

    metric: Monitored = Monitored.val_auc  # the validation metric that ranks the checkpoints
    mode: MonitorMode = MonitorMode.auto  # max | min is better (auto: min for val_logloss)
    # an evaluation better than every earlier one saves a checkpoint of its step; the checkpoints
    # saved so are kept while among the save_top_k best evaluated (-1: all kept)
    save_top_k: int = checked(1, ge=1, also=(-1,))
    # stop training after this many evaluations in a row without a better metric (0: never)
    patience: int = checked(0, ge=0)


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    embedding: Any = MISSING  # one of the embedding schemas above
    seed: int = checked(0, ge=0, le=MAX_SEED)  # initial weights and shuffling: same seed, same run
    device: str = checked("auto", pattern=DEVICE)  # auto | cpu | cuda | cuda:N
    epochs: int = checked(1, ge=1)  # passes over the train split
    max_steps: int = checked(
        -1, ge=1, also=(-1,)
    )  # stop after this many steps (-1: run all epochs)
    eval_every: int = checked(
        0, ge=0
    )  # evaluate on the validation split every N steps (0: only at the end)
    eval_batches: int = checked(
        -1, ge=1, also=(-1,)
    )  # limit evaluation to N batches (-1: the whole split)
    test: bool = False  # also evaluate on the test split at the end
    log_every: int = checked(50, ge=1)  # metrics.jsonl train record every N steps
    checkpoint_every: int = checked(0, ge=0)  # steps between checkpoints (0: only at the end)
    resume: str | None = (
        None  # a checkpoint directory (step_N), or a run directory (its newest complete one)
    )
    # resume= names a run directory: take its last checkpoint, or its best (monitor.*; a branch
    # from there), or auto (best where it has one, else last)
    resume_which: Which = Which.last
    overwrite: bool = False  # a run dir holding another run: delete that run's files and start anew
    # stop when the mean loss of the last 1024 samples is more than this many times the larger of
    # ln 2 and the largest such mean of the previous 1000 steps (0: off; train/guard.py); a
    # non-finite loss always stops the run
    loss_spike_factor: float = checked(10.0, gt=1, also=(0.0,))
    run_dir: str = MISSING  # set in train.yaml; every rank of a torchrun job agrees on it
    progress: bool = True  # tqdm progress bar (rank 0 only)
    shard_rows_above: int = checked(
        0, ge=0
    )  # torchrun: split tables with more rows row-wise over all ranks (0: only if too big)
    host_memory_gb: float = checked(
        0.0, ge=0
    )  # host memory per rank for embedding tables (0: MemAvailable / local ranks)
    # A collective waiting longer than this fails instead of hanging (a dead rank ends the job at
    # once: torchrun; this is for a frozen one).  Healthy ranks wait on each other for minutes at
    # start-up (the slowest rank building its tables) and at each checkpoint (the rank with the most
    # rows writing and fsyncing its table file), so a short default would kill large runs.
    dist_timeout_s: float = checked(300.0, gt=0)
    precision: Precision = Precision.fp32  # fp32 | tf32 | bf16: the dense part's arithmetic
    compile: bool = (
        False  # torch.compile the dense path (bottom MLP, interaction, top MLP) for training
    )
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)


@dataclass
class PlanConfig:
    """`dlrm-cache plan`: the freq_cache's hit rate per cache ratio, for the job `train` composes from
    the same groups (``data=``, ``model=``, ``embedding.*``: batch size, dimension, layout)."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    embedding: Any = MISSING  # the freq_cache's settings (plan.yaml: embedding=freq_cache)
    ratios: list[float] = checked(
        factory=lambda: [0.001, 0.005, 0.015, 0.05, 0.1], gt=0, le=1, nonempty=True
    )  # the cache ratios to predict (embedding.cache_ratio values)
    per_table: bool = False  # also print each table's hit rate (and draw it)
    output: str | None = None  # write the predictions as JSON here
    figure: str | None = MISSING  # the hit-rate curve as a PNG (set in plan.yaml; null: none)


@dataclass
class BenchConfig:
    """`dlrm-cache bench`: embedding layer alone (``kind=embedding``), a DLRM step (``kind=train``),
    the freq_cache's planning (``kind=planning``), the input pipeline (``kind=loader``) or
    `dlrm-cache preprocess` itself (``kind=preprocess``)."""

    # what is measured: embedding (the embedding layer alone) | train (a DLRM step) | planning
    # (the freq_cache's planning) | loader (the input pipeline) | preprocess (the command itself)
    kind: BenchKind = BenchKind.embedding
    # the placements compared (the first is the baseline)
    backends: list[Backend] = checked(
        factory=lambda: [Backend.host, Backend.freq_cache], nonempty=True
    )
    # one run of each cached placement per ratio
    cache_ratios: list[float] = checked(factory=lambda: [0.015], gt=0, le=1, nonempty=True)
    # one uvm_cache run per algorithm
    uvm_algorithms: list[UvmAlgorithm] = field(
        default_factory=lambda: [UvmAlgorithm.lru, UvmAlgorithm.lfu]
    )
    lookahead: int = checked(FreqCacheEmbeddingConfig.lookahead, ge=0)  # as embedding.lookahead
    policy: CachePolicy = FreqCacheEmbeddingConfig.policy  # freq_cache eviction policy
    # planning kind: one run per value of embedding.planner_threads (0: auto)
    planner_threads: list[int] = checked(factory=lambda: [0], ge=0, nonempty=True)
    num_tables: int = checked(26, ge=1)  # embedding kind: tables looked up per sample
    rows_per_table: int = checked(20_000, ge=1)  # embedding kind: every table has this many rows
    cardinality_scale: float = checked(
        0.01, gt=0
    )  # train/planning kinds: Criteo-Kaggle cardinalities times this
    # width of every embedding row
    embedding_dim: int = checked(128, ge=1, multiple_of=DIM_MULTIPLE)
    batch_size: int = checked(2048, ge=1)  # samples per step
    zipf_alpha: float = checked(1.05, ge=0)  # id popularity ~ (rank + 1) ** -alpha
    # ids per sample and table: one, or mlperf (MLPerf DLRM v2's multi-hot sizes, cycled over
    # the tables; ~213 ids per sample: 3.5M per batch of 16384)
    hotness: Hotness = Hotness.one
    bottom_mlp: list[int] = checked(
        factory=lambda: [512, 256], ge=1
    )  # train kind: as model.bottom_mlp
    top_mlp: list[int] = checked(
        factory=lambda: [1024, 1024, 512, 256], ge=1, nonempty=True
    )  # train kind: as model.top_mlp
    interaction: Interaction = ModelConfig.interaction  # train kind: as model.interaction
    dcn_num_layers: int = checked(ModelConfig.dcn_num_layers, ge=1)  # train kind: as model.*
    dcn_low_rank_dim: int = checked(ModelConfig.dcn_low_rank_dim, ge=1)  # train kind: as model.*
    # train kind: every backend runs once per (precision, compile) pair
    precisions: list[Precision] = checked(factory=lambda: [Precision.fp32], nonempty=True)
    compile: list[bool] = checked(factory=lambda: [False], nonempty=True)  # train kind: as compile
    warmup: int = checked(10, ge=0)  # untimed steps first
    iters: int = checked(30, ge=1)  # timed steps
    distinct_batches: int = checked(
        40, ge=1
    )  # fresh ids every step, cycling through this many generated batches
    # planning kind: batches run after the timed ones, counting host syncs and aten ops
    sync_count_batches: int = checked(5, ge=0)
    lr: float = checked(0.01, ge=0)  # learning rate of every optimizer
    seed: int = checked(0, ge=0)  # generated ids and weights
    device: str = checked("auto", pattern=DEVICE)  # auto | cpu | cuda | cuda:N
    output: str | None = None  # JSON results (also printed as a table)
    figure: str | None = MISSING  # the results as a PNG (set in bench.yaml; null: none)
    data_path: str | None = None  # loader kind: a processed dataset (its train split is read)
    shuffle: bool = True  # loader kind: shuffled as training reads it
    epochs: int = checked(
        3, ge=1
    )  # loader kind: passes over the train split (the first also warms the page cache)
    prefetch_batches: int = checked(
        4, ge=1
    )  # loader kind: the loader thread's queue, as data.prefetch_batches
    # preprocess kind: `dlrm-cache preprocess` runs in fresh processes on raw Criteo text
    preprocess_input: str | None = None  # a raw file, or a directory of day_N files (required)
    preprocess_baseline: str | None = None  # root of another source tree, run beside this one
    workers: list[int] = checked(
        factory=lambda: [0], ge=0, nonempty=True
    )  # one run of this checkout per value, as preprocess's workers (0: the usable cores)
    repeats: int = checked(2, ge=1)  # rounds of every run, interleaved (A B A B ...)
    peer_lines: int = checked(
        500_000, ge=0
    )  # torchrec's tsv_to_npys on the input's first N lines (0: no peer run)
    work_dir: str | None = None  # the runs' outputs, kept (default: a temp dir, removed)
    preprocess_overrides: dict[str, Any] = field(
        default_factory=dict
    )  # more preprocess settings for every run: +preprocess_overrides.hash_modulus=40000000


@dataclass
class ReportConfig:
    """`dlrm-cache report`: figures of run directories (train's run dir, or a -m sweep directory)."""

    runs: list[str] = field(default_factory=list)  # run directories, or one sweep directory
    output: str | None = (
        None  # directory for report.png/report.md (default: the run or sweep dir; several runs: .)
    )
    worst_tables: int = checked(
        3, ge=0
    )  # per-table hit rates drawn for this many tables with the lowest hit rate


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config as plain data (``OmegaConf.to_container``) keyed by dotted paths (``data.batch_size``)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_dict(cfg: Any) -> dict[str, Any]:
    """A plain-dict copy of a dataclass or OmegaConf config (for JSON records, checkpoints and
    comparisons): interpolations resolved, choices as their string values."""
    import dataclasses

    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    return dict(cfg)
