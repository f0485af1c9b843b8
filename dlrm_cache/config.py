"""Structured config schemas, registered with Hydra's ConfigStore.

Every yaml file under ``configs/`` names one of these schemas in its defaults list, so a typo'd key
or an ill-typed value fails when the config is composed, before any work starts.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

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
class Precision(str, Enum):
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
    batch_size: int = 2048  # global batch size: split across ranks under torchrun
    eval_batch_size: int = 8192
    prefetch_batches: int = 4  # batches decoded ahead by the background reader thread
    analysis_threads: int = 2  # loader threads for a CPU freq_cache's per-batch dedup (a GPU cache dedups on the device)
    shuffle: bool = True  # shuffle rows within each shard (and shard order) every epoch


@dataclass
class ModelConfig:
    embedding_dim: int = 16
    bottom_mlp: list[int] = field(default_factory=lambda: [512, 256, 64])
    top_mlp: list[int] = field(default_factory=lambda: [512, 256])  # a final 1-unit layer is added


@dataclass
class SparseOptimConfig:
    name: str = "rowwise_adagrad"  # rowwise_adagrad | adagrad | sgd (fused into fbgemm's backward)
    lr: float = 0.05
    eps: float = 1e-8


@dataclass
class DenseOptimConfig:
    name: str = "adagrad"  # sgd | adagrad | adam
    lr: float = 0.01
    weight_decay: float = 0.0
    momentum: float = 0.0  # sgd only


@dataclass
class OptimConfig:
    sparse: SparseOptimConfig = field(default_factory=SparseOptimConfig)
    dense: DenseOptimConfig = field(default_factory=DenseOptimConfig)
    warmup_steps: int = 0  # linear warm-up of both learning rates
    decay_start: int = 0  # step where the polynomial (power 2) decay to 0 starts (MLPerf DLRM schedule)
    decay_steps: int = 0  # steps the decay takes (0: no decay)


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
    cache_ratio: float = 0.015
    algorithm: str = "lru"  # lru | lfu (fbgemm's set-associative cache)
    host_mapped: bool = True  # cudaHostAlloc-mapped host memory rather than CUDA managed memory


@dataclass
class FreqCacheEmbeddingConfig:
    _target_: str = "dlrm_cache.embedding.freq_cache.FreqCacheBackend"
    cache_ratio: float = 0.015  # fraction of all rows held in the device cache, in (0, 1]
    policy: str = "freq"  # freq | lfu | lru
    refresh_counts: bool = False  # freq policy: add observed counts to the dataset counts
    lookahead: int = 2  # batches whose rows are fetched ahead (0 = synchronous)
    static_fraction: float = 0.5  # share of the cache pinned to the hottest rows (never evicted)
    row_map: str = "auto"  # row -> slot lookup: sorted (device memory ~ cache) | dense (per row) | auto


# --------------------------------------------------------------------------- commands
@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    embedding: Any = MISSING  # one of the embedding schemas above
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    epochs: int = 1
    max_steps: int = -1  # stop after this many steps (-1: run all epochs)
    eval_every: int = 0  # evaluate on the validation split every N steps (0: only at the end)
    eval_batches: int = -1  # limit evaluation to N batches (-1: the whole split)
    test: bool = False  # also evaluate on the test split at the end
    log_every: int = 50  # metrics.jsonl train record every N steps
    checkpoint_every: int = 0  # steps between checkpoints (0: only at the end)
    resume: Optional[str] = None  # a checkpoint file, or a run directory (its latest checkpoint)
    run_dir: str = MISSING  # set in train.yaml; every rank of a torchrun job agrees on it
    progress: bool = True  # tqdm progress bar (rank 0 only)
    shard_rows_above: int = 0  # torchrun: split tables with more rows row-wise over all ranks (0: only if too big)
    host_memory_gb: float = 0.0  # host memory per rank for embedding tables (0: MemAvailable / local ranks)
    dist_timeout_s: float = 300.0  # a collective waiting longer than this fails instead of hanging
    precision: Precision = Precision.fp32  # fp32 | tf32 | bf16: the dense part's arithmetic
    compile: bool = False  # torch.compile the dense path (bottom MLP, interaction, top MLP) for training


@dataclass
class PlanConfig:
    data_path: str = "data/synth/processed"  # a processed dataset (its stats/ are read)
    ratios: list[float] = field(default_factory=lambda: [0.001, 0.005, 0.015, 0.05, 0.1])
    embedding_dim: int = 128  # for the memory column
    per_table: bool = False  # also print each table's hit rate
    output: Optional[str] = None  # write the predictions as JSON here


@dataclass
class BenchConfig:
    """`dlrm-cache bench`: embedding layer alone (``kind=embedding``) or a DLRM step (``kind=train``)."""

    kind: str = "embedding"  # embedding | train | planning
    backends: list[str] = field(default_factory=lambda: ["host", "freq_cache"])
    cache_ratios: list[float] = field(default_factory=lambda: [0.015])
    uvm_algorithms: list[str] = field(default_factory=lambda: ["lru", "lfu"])
    lookahead: int = 2
    policy: str = "freq"  # freq_cache eviction policy
    num_tables: int = 26
    rows_per_table: int = 20_000  # embedding kind: every table has this many rows
    cardinality_scale: float = 0.01  # train/planning kinds: Criteo-Kaggle cardinalities times this
    embedding_dim: int = 128
    batch_size: int = 2048
    zipf_alpha: float = 1.05  # id popularity ~ (rank + 1) ** -alpha
    bottom_mlp: list[int] = field(default_factory=lambda: [512, 256])
    top_mlp: list[int] = field(default_factory=lambda: [1024, 1024, 512, 256])
    # train kind: every backend runs once per (precision, compile) pair
    precisions: list[Precision] = field(default_factory=lambda: [Precision.fp32])
    compile: list[bool] = field(default_factory=lambda: [False])
    warmup: int = 10
    iters: int = 30
    distinct_batches: int = 40  # fresh ids every step, cycling through this many generated batches
    lr: float = 0.01
    seed: int = 0
    device: str = "auto"
    output: Optional[str] = None  # JSON results (also printed as a table)


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
