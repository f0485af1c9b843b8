"""The values of the configs' choice fields, as enums: importable without Hydra (the model, bench
and the embedding backends use them).  See :class:`dlrm_cache.config.ranges.Choice`."""

from __future__ import annotations

from .ranges import Choice


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
    preprocess = "preprocess"


class Interaction(Choice):
    """How the model crosses the bottom MLP's output with the pooled embeddings.

    dot: DLRM's pairwise dot products (torchrec's InteractionArch).  dcn: DCN-v2's low-rank cross
    network over their concatenation (torchrec's InteractionDCNArch, MLPerf DLRM v2).
    """

    dot = "dot"
    dcn = "dcn"


class Pooling(Choice):
    """How a feature's ids in one sample become one vector (its *bag*: one id when one-hot).

    sum: the sum of their rows.  mean: that sum divided by the number of ids of the bag; an
    empty bag pools to 0, as fbgemm's and torchrec's MEAN pooling do.
    """

    sum = "sum"
    mean = "mean"


class Hotness(Choice):
    """Ids per sample and table of the bench's generated batches: one (Criteo one-hot), or
    mlperf (MLPerf DLRM v2's multi-hot sizes, ``data.format.MLPERF_MULTI_HOT_SIZES``)."""

    one = "one"
    mlperf = "mlperf"


class Precision(Choice):
    """Arithmetic of the dense part (MLPs, interaction); weights and optimizer state stay fp32.

    fp32: plain float32.  tf32: float32 tensors, matrix products on TensorFloat-32 tensor cores
    (CUDA only: on the CPU it is fp32).  bf16: the dense part under bfloat16 autocast (CPU and
    CUDA), with TF32 for the products autocast leaves in float32.
    """

    fp32 = "fp32"
    tf32 = "tf32"
    bf16 = "bf16"


class Monitored(Choice):
    """The validation metric that ranks a run's checkpoints (``monitor.metric``): the one its
    evaluations of the val split record (``val_auc``: the ``auc`` of an ``eval`` record)."""

    val_auc = "val_auc"
    val_logloss = "val_logloss"
    val_accuracy = "val_accuracy"


class MonitorMode(Choice):
    """Whether a larger or a smaller monitored value is better; auto: max for val_auc and
    val_accuracy, min for val_logloss."""

    auto = "auto"
    max = "max"
    min = "min"


class Which(Choice):
    """Which checkpoint of a run directory a command takes: last (its final checkpoint, the one
    its summary describes), best (the best evaluated by the run's ``monitor.*``), or auto (best
    where the run has one, else last)."""

    auto = "auto"
    best = "best"
    last = "last"
