"""Structured config schemas, registered with Hydra's ConfigStore.

Every yaml file under ``configs/`` names one of these schemas in its defaults list, so a typo'd key,
an ill-typed value or a choice not in its Enum fails when the config is composed.  A numeric field
declares its range where it is defined (``checked(default, ge=1)``, see :mod:`.ranges`); the
dispatcher checks them all right after composition, before any work starts.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from .ranges import Choice, checked

DEVICE = r"auto|cpu|cuda(:\d+)?"  # the values of a device field


class SparseOptimName(Choice):
    rowwise_adagrad = "rowwise_adagrad"
    adagrad = "adagrad"
    sgd = "sgd"


class DenseOptimName(Choice):
    sgd = "sgd"
    adagrad = "adagrad"
    adam = "adam"


class UvmAlgorithm(Choice):
    lru = "lru"
    lfu = "lfu"


class CachePolicy(Choice):
    freq = "freq"
    lfu = "lfu"
    lru = "lru"


class RowMap(Choice):
    auto = "auto"
    sorted = "sorted"
    dense = "dense"


class Backend(Choice):
    host = "host"
    hbm = "hbm"
    uvm_cache = "uvm_cache"
    freq_cache = "freq_cache"


class BenchKind(Choice):
    embedding = "embedding"
    train = "train"
    planning = "planning"
    loader = "loader"


def config_dir() -> str:
    """Absolute path of the shipped configs, whatever the working directory or install mode.

    Installed (wheel or editable) they are the package ``dlrm_cache.configs``; from a plain source
    tree on PYTHONPATH (the GPU machine's offline bundle installs nothing) they are ``configs/``
    next to the package.
    """
    try:
        import dlrm_cache.configs as pkg
    except ModuleNotFoundError:
        tree = Path(__file__).resolve().parent.parent / "configs"
        if (tree / "train.yaml").is_file():
            return str(tree)
        raise
    return str(Path(pkg.__file__).resolve().parent)


# --------------------------------------------------------------------------- data / model / optim
class Precision(Choice):
    """Arithmetic of the dense part (MLPs, interaction); weights and optimizer state stay fp32.

    fp32: plain float32.  tf32: float32 tensors, matrix products on TensorFloat-32 tensor cores
    (CUDA only: on the CPU it is fp32).  bf16: the dense part under bfloat16 autocast (CPU and
    CUDA), with TF32 for the products autocast leaves in float32.
    """

    fp32 = "fp32"
    tf32 = "tf32"
    bf16 = "bf16"


@dataclass
class DataConfig:
    path: str = MISSING  # a processed dataset directory (with manifest.json)
    batch_size: int = checked(2048, ge=1)  # global batch size: split across ranks under torchrun
    eval_batch_size: int = checked(8192, ge=1)
    prefetch_batches: int = checked(4, ge=1)  # batches decoded ahead by the background reader thread
    analysis_threads: int = checked(2, ge=1)  # loader threads for a CPU freq_cache's per-batch dedup (a GPU cache dedups on the device)
    shuffle: bool = True  # shuffle rows within each shard (and shard order) every epoch


@dataclass
class ModelConfig:
    embedding_dim: int = checked(16, ge=1)
    bottom_mlp: list[int] = checked(factory=lambda: [512, 256, 64], ge=1)
    top_mlp: list[int] = checked(factory=lambda: [512, 256], ge=1)  # a final 1-unit layer is added


@dataclass
class SparseOptimConfig:
    name: SparseOptimName = SparseOptimName.rowwise_adagrad  # fused into fbgemm's backward
    lr: float = checked(0.05, ge=0)
    eps: float = checked(1e-8, gt=0)


@dataclass
class DenseOptimConfig:
    name: DenseOptimName = DenseOptimName.adagrad
    lr: float = checked(0.01, ge=0)
    weight_decay: float = checked(0.0, ge=0)
    momentum: float = checked(0.0, ge=0)  # sgd only


@dataclass
class OptimConfig:
    sparse: SparseOptimConfig = field(default_factory=SparseOptimConfig)
    dense: DenseOptimConfig = field(default_factory=DenseOptimConfig)
    warmup_steps: int = checked(0, ge=0)  # linear warm-up of both learning rates
    decay_start: int = checked(0, ge=0)  # step where the polynomial (power 2) decay to 0 starts (MLPerf DLRM schedule)
    decay_steps: int = checked(0, ge=0)  # steps the decay takes (0: no decay)


# --------------------------------------------------------------------------- embedding backends
@dataclass
class HostEmbeddingConfig:
    _target_: str = "dlrm_cache.embedding.direct.HostBackend"


@dataclass
class HbmEmbeddingConfig:
    _target_: str = "dlrm_cache.embedding.direct.HbmBackend"


@dataclass
class UvmCacheEmbeddingConfig:
    _target_: str = "dlrm_cache.embedding.direct.UvmCacheBackend"
    cache_ratio: float = checked(0.015, gt=0, le=1)
    algorithm: UvmAlgorithm = UvmAlgorithm.lru  # fbgemm's set-associative cache
    host_mapped: bool = True  # cudaHostAlloc-mapped host memory rather than CUDA managed memory


@dataclass
class FreqCacheEmbeddingConfig:
    _target_: str = "dlrm_cache.embedding.freq_cache.FreqCacheBackend"
    cache_ratio: float = checked(0.015, gt=0, le=1)  # fraction of all rows held in the device cache
    policy: CachePolicy = CachePolicy.freq
    refresh_counts: bool = False  # freq policy: add observed counts to the dataset counts
    lookahead: int = checked(2, ge=0)  # batches whose rows are fetched ahead (0 = synchronous)
    static_fraction: float = checked(0.5, ge=0, le=1)  # share of the cache pinned to the hottest rows (never evicted)
    row_map: RowMap = RowMap.auto  # row -> slot lookup: sorted (device memory ~ cache) | dense (per row)
    # samples per step whose ids the look-ahead window must hold (the trainer's global data.batch_size;
    # 0: no sizing, the window gets what cache_ratio leaves)
    batch_size: int = checked(0, ge=0)


# --------------------------------------------------------------------------- commands
@dataclass
class LoggerConfig:
    """Live views of the records train writes to metrics.jsonl (which stays the source of truth)."""

    tensorboard: bool = False  # every record's numbers also as TensorBoard scalars in the run dir (rank 0)


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    embedding: Any = MISSING  # one of the embedding schemas above
    seed: int = checked(0, ge=0)
    device: str = checked("auto", pattern=DEVICE)  # auto | cpu | cuda | cuda:N
    epochs: int = checked(1, ge=1)
    max_steps: int = checked(-1, ge=1, also=(-1,))  # stop after this many steps (-1: run all epochs)
    eval_every: int = checked(0, ge=0)  # evaluate on the validation split every N steps (0: only at the end)
    eval_batches: int = checked(-1, ge=1, also=(-1,))  # limit evaluation to N batches (-1: the whole split)
    test: bool = False  # also evaluate on the test split at the end
    log_every: int = checked(50, ge=1)  # metrics.jsonl train record every N steps
    checkpoint_every: int = checked(0, ge=0)  # steps between checkpoints (0: only at the end)
    resume: Optional[str] = None  # a checkpoint directory (step_N), or a run directory (its newest complete one)
    run_dir: str = MISSING  # set in train.yaml; every rank of a torchrun job agrees on it
    progress: bool = True  # tqdm progress bar (rank 0 only)
    shard_rows_above: int = checked(0, ge=0)  # torchrun: split tables with more rows row-wise over all ranks (0: only if too big)
    host_memory_gb: float = checked(0.0, ge=0)  # host memory per rank for embedding tables (0: MemAvailable / local ranks)
    # A collective waiting longer than this fails instead of hanging (a dead rank ends the job at
    # once: torchrun; this is for a frozen one).  Healthy ranks wait on each other for minutes at
    # start-up (the slowest rank building its tables) and at each checkpoint (the rank with the most
    # rows writing and fsyncing its table file), so a short default would kill large runs.
    dist_timeout_s: float = checked(300.0, gt=0)
    precision: Precision = Precision.fp32  # fp32 | tf32 | bf16: the dense part's arithmetic
    compile: bool = False  # torch.compile the dense path (bottom MLP, interaction, top MLP) for training
    logger: LoggerConfig = field(default_factory=LoggerConfig)


@dataclass
class PlanConfig:
    data_path: str = "data/synth/processed"  # a processed dataset (its stats/ are read)
    ratios: list[float] = checked(factory=lambda: [0.001, 0.005, 0.015, 0.05, 0.1], gt=0, le=1, nonempty=True)
    embedding_dim: int = checked(128, ge=1)  # for the memory column
    per_table: bool = False  # also print each table's hit rate (and draw it)
    output: Optional[str] = None  # write the predictions as JSON here
    figure: Optional[str] = MISSING  # the hit-rate curve as a PNG (set in plan.yaml; null: none)
    static_fraction: float = checked(FreqCacheEmbeddingConfig.static_fraction, ge=0, le=1)  # as embedding.static_fraction
    lookahead: int = checked(FreqCacheEmbeddingConfig.lookahead, ge=0)  # as embedding.lookahead: batches fetched ahead
    # as data.batch_size: the window region must hold lookahead+1 of them (0: no sizing)
    batch_size: int = checked(16384, ge=0)


@dataclass
class BenchConfig:
    """`dlrm-cache bench`: embedding layer alone (``kind=embedding``), a DLRM step (``kind=train``),
    the freq_cache's planning (``kind=planning``) or the input pipeline (``kind=loader``)."""

    kind: BenchKind = BenchKind.embedding
    backends: list[Backend] = checked(factory=lambda: [Backend.host, Backend.freq_cache], nonempty=True)
    cache_ratios: list[float] = checked(factory=lambda: [0.015], gt=0, le=1, nonempty=True)
    uvm_algorithms: list[UvmAlgorithm] = field(default_factory=lambda: [UvmAlgorithm.lru, UvmAlgorithm.lfu])
    lookahead: int = checked(FreqCacheEmbeddingConfig.lookahead, ge=0)  # as embedding.lookahead
    policy: CachePolicy = FreqCacheEmbeddingConfig.policy  # freq_cache eviction policy
    num_tables: int = checked(26, ge=1)
    rows_per_table: int = checked(20_000, ge=1)  # embedding kind: every table has this many rows
    cardinality_scale: float = checked(0.01, gt=0)  # train/planning kinds: Criteo-Kaggle cardinalities times this
    embedding_dim: int = checked(128, ge=1)
    batch_size: int = checked(2048, ge=1)
    zipf_alpha: float = checked(1.05, ge=0)  # id popularity ~ (rank + 1) ** -alpha
    bottom_mlp: list[int] = checked(factory=lambda: [512, 256], ge=1)
    top_mlp: list[int] = checked(factory=lambda: [1024, 1024, 512, 256], ge=1)
    # train kind: every backend runs once per (precision, compile) pair
    precisions: list[Precision] = checked(factory=lambda: [Precision.fp32], nonempty=True)
    compile: list[bool] = checked(factory=lambda: [False], nonempty=True)
    warmup: int = checked(10, ge=0)
    iters: int = checked(30, ge=1)
    distinct_batches: int = checked(40, ge=1)  # fresh ids every step, cycling through this many generated batches
    # planning kind: batches run after the timed ones, counting host syncs and aten ops
    sync_count_batches: int = checked(5, ge=0)
    lr: float = checked(0.01, ge=0)
    seed: int = checked(0, ge=0)
    device: str = checked("auto", pattern=DEVICE)
    output: Optional[str] = None  # JSON results (also printed as a table)
    figure: Optional[str] = MISSING  # the results as a PNG (set in bench.yaml; null: none)
    data_path: Optional[str] = None  # loader kind: a processed dataset (its train split is read)
    shuffle: bool = True  # loader kind: shuffled as training reads it
    epochs: int = checked(3, ge=1)  # loader kind: passes over the train split (the first also warms the page cache)
    prefetch_batches: int = checked(4, ge=1)  # loader kind: the loader thread's queue, as data.prefetch_batches


@dataclass
class ReportConfig:
    """`dlrm-cache report`: figures of run directories (train's run dir, or a -m sweep directory)."""

    runs: list[str] = field(default_factory=list)  # run directories, or one sweep directory
    output: Optional[str] = None  # directory for report.png/report.md (default: the run or sweep dir; several runs: .)
    worst_tables: int = checked(3, ge=0)  # per-table hit rates drawn for this many tables with the lowest hit rate


def _run_id() -> str:
    """One id per job: torchrun's run id when set, else a timestamp.

    Each torchrun rank composes its own config, so a per-process ``${now:}`` would split one job
    over several run directories.
    """
    rid = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if rid and rid != "none":
        return f"{time.strftime('%Y-%m-%d')}/{rid}"
    if "MASTER_PORT" in os.environ and "LOCAL_WORLD_SIZE" in os.environ:
        # torchrun without --rdzv-id: every rank sees the same master address/port and group.
        key = "|".join(os.environ.get(k, "") for k in ("MASTER_ADDR", "MASTER_PORT", "GROUP_WORLD_SIZE"))
        return f"{time.strftime('%Y-%m-%d')}/torchrun-{hashlib.sha1(key.encode()).hexdigest()[:10]}"
    return time.strftime("%Y-%m-%d/%H-%M-%S")


def _is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def register_configs() -> None:
    if not OmegaConf.has_resolver("dlrm_run_id"):
        OmegaConf.register_new_resolver("dlrm_run_id", _run_id, use_cache=True)
        # Only rank 0 writes Hydra's .hydra/ snapshot into the shared run directory.
        OmegaConf.register_new_resolver(
            "dlrm_hydra_subdir", lambda: ".hydra" if _is_rank0() else None, use_cache=True
        )
        # ...and every rank logs to its own file there: train.log, train-rank1.log, ...
        OmegaConf.register_new_resolver(
            "dlrm_rank_suffix", lambda: "" if _is_rank0() else f"-rank{os.environ['RANK']}", use_cache=True
        )
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="plan_schema", node=PlanConfig)
    cs.store(name="bench_schema", node=BenchConfig)
    cs.store(name="report_schema", node=ReportConfig)
    cs.store(group="data", name="data_schema", node=DataConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="optim", name="optim_schema", node=OptimConfig)
    for name, node in [
        ("host_schema", HostEmbeddingConfig),
        ("hbm_schema", HbmEmbeddingConfig),
        ("uvm_cache_schema", UvmCacheEmbeddingConfig),
        ("freq_cache_schema", FreqCacheEmbeddingConfig),
    ]:
        cs.store(group="embedding", name=name, node=node)
    from .data.config import register as register_data_commands

    register_data_commands(cs)
    from .after_config import register as register_after_training

    register_after_training(cs)


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
    if dataclasses.is_dataclass(cfg):
        return dataclasses.asdict(cfg)
    return dict(cfg)
