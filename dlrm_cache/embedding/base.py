"""One interface for every embedding placement.

The model, the trainer and the sharding code only see :class:`EmbeddingBackend`; where the rows live
(host memory, GPU memory, a cache in front of host memory) is the backend's business.  Embedding
updates are fused into the backward pass (fbgemm's table-batched kernels), so backend parameters are
never handed to the dense optimizer: they are kept out of ``Module.parameters()``.
"""

from __future__ import annotations

import os
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from ..config.choices import Pooling


class DeviceUnavailable(ValueError):
    """A placement that cannot run on this machine (e.g. a CUDA-only one without a GPU): callers
    that try several placements (``bench``) skip it with the reason instead of failing."""


@dataclass(frozen=True)
class TableSpec:
    name: str  # the feature name, e.g. "C3"
    num_rows: int
    dim: int


@dataclass(frozen=True)
class SparseOptim:
    """The fused optimizer applied to embedding rows (and to the cached rows identically)."""

    name: str = "rowwise_adagrad"  # rowwise_adagrad | adagrad | sgd
    lr: float = 0.01
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.name not in SPARSE_OPTIMIZERS:
            raise ValueError(
                f"optim.sparse.name={self.name!r}: choose one of {sorted(SPARSE_OPTIMIZERS)}"
            )

    @property
    def state_per_row(self) -> int:
        """Optimizer floats stored per row for a table of dimension 1 (0: none, -1: one per element)."""
        return SPARSE_OPTIMIZERS[self.name]

    def state_floats(self, dim: int) -> int:
        """Optimizer floats stored per row of a table of dimension ``dim``."""
        return {0: 0, 1: 1, -1: dim}[self.state_per_row]

    def field_shapes(self, rows: int, dim: int) -> dict[str, tuple[int, ...]]:
        """The exported entries of ``rows`` rows of a table of ``dim`` (``<table>.<field>``, see
        :meth:`EmbeddingBackend.export_tables`): the rows, and their optimizer state if any."""
        shapes: dict[str, tuple[int, ...]] = {"weight": (rows, dim)}
        if self.state_per_row:
            shapes["momentum1"] = (rows,) if self.state_per_row == 1 else (rows, dim)
        return shapes

    def row_bytes(self, dim: int) -> int:
        """Bytes of one fp32 row of ``dim`` plus its optimizer state (what is stored and moved)."""
        return 4 * (dim + self.state_floats(dim))


# optimizer -> floats of state per row: 1 (rowwise), -1 (one per element), 0 (none)
SPARSE_OPTIMIZERS = {"rowwise_adagrad": 1, "adagrad": -1, "sgd": 0}


class EmbeddingBackend(nn.Module):
    """Pooled embedding lookups for a fixed list of tables, one feature per table.

    Prefetch protocol (FIFO): a backend with ``lookahead > 0`` is handed each batch ``lookahead``
    steps before its forward (:meth:`prefetch`), training batches under grad, evaluation batches
    under ``torch.no_grad()``.  A forward with gradients enabled consumes the oldest prefetched
    batch, which must be that batch; a forward under ``torch.no_grad()`` consumes the oldest batch
    prefetched under no_grad (evaluation between training steps queues behind the training
    window), else it is an ad-hoc batch (see :func:`pop_prefetched`).  ``step_done`` follows each
    step's backward (or each evaluation batch's forward).
    """

    # batches the backend wants to see ahead of their forward (0: it does not prefetch)
    lookahead: int = 0
    # whether the constructor takes ``counts``: the dataset's per-row access counts (stats/)
    uses_counts: bool = False
    # whether every row lives in host memory (all placements but hbm): the host-memory check counts it
    keeps_rows_in_host_memory: bool = True

    @classmethod
    def host_bytes_per_row(cls, device: torch.device, settings: dict[str, Any]) -> int:
        """Host bytes this placement keeps per table row besides the row and its optimizer state
        (counts, a row map), for the host-memory checks; ``settings``: its ``embedding`` config
        as plain values."""
        return 0

    def __init__(self, tables: list[TableSpec], optim: SparseOptim) -> None:
        super().__init__()
        if not tables:
            raise ValueError("an embedding backend needs at least one table")
        self.tables = list(tables)
        self.optim = optim
        self.feature_names = [t.name for t in tables]

    # -- the interface -------------------------------------------------------------------------
    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Sum pooling: each sample's rows of each feature added up (an empty bag: 0), ``[B, F*D]``.

        ``features`` may carry any number of ids per sample and feature (its lengths/offsets)."""
        raise NotImplementedError

    def pool(self, features: KeyedJaggedTensor, pooling: Pooling) -> KeyedTensor:
        """The embeddings of ``features`` pooled by ``pooling`` (what the model consumes).

        Every placement sums (:meth:`forward`; fbgemm's SUM kernels); mean divides each bag's sum
        by its number of ids, read from the KJT's lengths where they are (the device, for a device
        batch), so no step reads anything back; an empty bag stays 0.  One path for every
        placement, because a row-wise shard holds only part of a bag: the mean is taken where
        the shards' sums are added (:class:`~dlrm_cache.parallel.sharded.ShardedEmbeddings`
        overrides this).  Autograd's backward of the division scales each row's gradient by
        1/size, as fbgemm's MEAN does."""
        out = self(features)
        if pooling is Pooling.sum:
            return out
        mean = mean_of_sums(out.values(), bag_sizes(features), self.tables[0].dim)
        return KeyedTensor(keys=out.keys(), length_per_key=out.length_per_key(), values=mean)

    def prefetch(self, features: KeyedJaggedTensor, copied: Any = None) -> None:
        """A future batch: make its rows resident before it is needed (no-op where n/a).
        ``copied``: the event (``Streams.record_event``) after which ``features``' device copy
        is complete; None where it was made on the calling thread's current stream."""

    def step_done(self) -> None:
        """The last forwarded batch's backward has been issued (its cached rows may be released)."""

    def cancel_prefetch(self, grad: bool | None = None) -> None:
        """Forget prefetched batches that will not be forwarded (a loop left early): those
        prefetched under grad (``grad=True``), under no_grad (``False``) or all (``None``)."""

    def set_learning_rate(self, lr: float) -> None:
        """The fused optimizer's learning rate (warm-up and schedules change it between steps)."""
        raise NotImplementedError

    def flush(self) -> None:
        """Make the full tables (and optimizer state) consistent, whatever is cached."""

    def stats(self) -> dict[str, float]:
        """Counters since the last :meth:`reset_stats` (or construction): hit rate, rows/bytes
        moved, stall time, memory.  Reading them changes nothing.

        A rate (a key of ``rates.RATE_WEIGHTS``, or ``<rate>/<table>``) is a fraction of the count
        named there (``hit_rate/C3`` of ``accesses/C3``), which is reported beside it, so that
        rates of several intervals add up weighted by what they count; a rate of nothing (no
        accesses in the interval) is left out, not reported as 0."""
        return {}

    def reset_stats(self) -> None:
        """Start the counters :meth:`stats` reports afresh (sizes such as cache_rows stay); a
        backend with counters overrides it."""

    def take_stats(self) -> dict[str, float]:
        """The counters of one interval: :meth:`stats`, then :meth:`reset_stats`."""
        out = self.stats()
        self.reset_stats()
        return out

    def export_tables(self) -> dict[str, torch.Tensor]:
        """Full tables in row order, on CPU: ``<table>.weight`` and ``<table>.<state>`` entries."""
        raise NotImplementedError

    def import_tables(self, state: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError

    # -- placement-independent checkpoints -----------------------------------------------------
    def _save_to_state_dict(self, destination, prefix, keep_vars):  # torch's hook
        self.flush()
        for key, value in self.export_tables().items():
            destination[prefix + key] = value

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        expected = self.state_keys()
        mine = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
        missing_keys.extend(prefix + k for k in expected if k not in mine)
        unexpected_keys.extend(prefix + k for k in mine if k not in expected and "." in k)
        if all(k in mine for k in expected):
            for t in self.tables:
                w = mine[f"{t.name}.weight"]
                if tuple(w.shape) != (t.num_rows, t.dim):
                    error_msgs.append(
                        f"{prefix}{t.name}.weight: checkpoint has shape {tuple(w.shape)}, "
                        f"this model has ({t.num_rows}, {t.dim})"
                    )
                    return
            self.import_tables({k: mine[k] for k in expected})

    def state_keys(self) -> list[str]:
        keys = []
        for t in self.tables:
            keys.append(f"{t.name}.weight")
            if self.optim.state_per_row:
                keys.append(f"{t.name}.momentum1")
        return keys


def shared_dim(tables: list[TableSpec], backend: str) -> int:
    """The one embedding dim of ``tables`` (fbgemm's stacked buffers need it)."""
    dims = {t.dim for t in tables}
    if len(dims) != 1:
        raise ValueError(
            f"embedding={backend}: all tables must share one embedding dim, got {sorted(dims)}"
        )
    return dims.pop()


def initial_state(
    tables: list[TableSpec], optim: SparseOptim, seed: int
) -> dict[str, torch.Tensor]:
    """Deterministic initial rows per table (uniform in +-1/sqrt(rows), like torchrec), zero state.

    Seeded by table name, not by construction order, so every placement and every sharding of the
    same tables starts from the same parameters.  Each table has its own generator, so the tables
    are filled on parallel threads (a generator is serial; uniform_ releases the interpreter lock).
    """

    def rows(t: TableSpec) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(t.name.encode()))
        bound = t.num_rows**-0.5
        return torch.empty(t.num_rows, t.dim).uniform_(-bound, bound, generator=g)

    # largest first: the longest fills start at once
    order = sorted(tables, key=lambda t: -t.num_rows * t.dim)
    with ThreadPoolExecutor(max(1, min(len(tables), os.cpu_count() or 1))) as pool:
        weights = dict(zip((t.name for t in order), pool.map(rows, order)))
    out = {}
    for t in tables:
        out[f"{t.name}.weight"] = weights[t.name]
        if optim.state_per_row == 1:
            out[f"{t.name}.momentum1"] = torch.zeros(t.num_rows)
        elif optim.state_per_row == -1:
            out[f"{t.name}.momentum1"] = torch.zeros(t.num_rows, t.dim)
    return out


def pooled(features: KeyedJaggedTensor, values: torch.Tensor, dim: int) -> KeyedTensor:
    """Wrap a [B, T*dim] tensor of pooled embeddings as a KeyedTensor in feature order."""
    keys = features.keys()
    return KeyedTensor(keys=keys, length_per_key=[dim] * len(keys), values=values)


def bag_sizes(features: KeyedJaggedTensor) -> torch.Tensor:
    """Ids per sample and feature, ``[B, F]``, from the KJT's lengths on their own device."""
    return features.lengths().view(len(features.keys()), features.stride()).t()


def mean_of_sums(sums: torch.Tensor, sizes: torch.Tensor, dim: int) -> torch.Tensor:
    """Mean pooling ``[B, F*dim]`` from sum pooling ``sums`` and the bags' ``sizes`` ``[B, F]``:
    each sum over its size, an empty bag's sum (0) left 0."""
    b = sums.shape[0]
    div = sizes.to(sums.dtype).clamp(min=1).unsqueeze(-1)
    return (sums.view(b, -1, dim) / div).view(b, -1)


def pop_prefetched(
    queue: deque,
    kjt: KeyedJaggedTensor,
    kjt_of: Callable[[Any], KeyedJaggedTensor],
    grad_of: Callable[[Any], bool],
) -> Any | None:
    """Remove and return the entry of ``queue`` (prefetched batches, oldest first) that a forward of
    ``kjt`` consumes under the FIFO protocol of :class:`EmbeddingBackend`, or None (ad hoc).

    Under grad: the oldest entry.  Under no_grad: the oldest entry prefetched under no_grad.
    What is consumed is chosen by the contract, not by comparing ids (a device copy could not be
    compared without a synchronization); a batch of another shape breaks the contract and fails.
    """
    if torch.is_grad_enabled():
        entry = queue[0] if queue else None
    else:
        entry = next((e for e in queue if not grad_of(e)), None)
    if entry is None:
        return None
    prefetched = kjt_of(entry)
    if kjt is not prefetched and (
        kjt.stride() != prefetched.stride() or list(kjt.keys()) != list(prefetched.keys())
    ):
        raise RuntimeError(
            f"forward of a batch of {kjt.stride()} samples while the prefetched batch it consumes has "
            f"{prefetched.stride()}: batches must be forwarded in the order they were prefetched"
        )
    queue.remove(entry)
    return entry
