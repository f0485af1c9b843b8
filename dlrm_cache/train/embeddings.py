"""A training run's embedding placement: whole tables on one process, or sharded over the ranks
under torchrun (:mod:`dlrm_cache.parallel.placement` plans it), with their initial rows; and the
host-memory check before any table is allocated."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from ..data.format import Manifest
from ..embedding.base import EmbeddingBackend, SparseOptim, TableSpec, initial_state
from ..parallel.dist import DistInfo
from ..parallel.placement import Shard, available_host_bytes, plan_placement
from ..parallel.sharded import ShardedEmbeddings

log = logging.getLogger(__name__)


def embedding_factory(cfg: DictConfig, data_path: Path, device: torch.device):
    """``make(tables, shards) -> EmbeddingBackend`` for the configured placement.

    ``shards`` (row ranges of whole tables, see parallel/placement.py) give each local table its slice of
    the frequency statistics; ``None`` means the tables are whole.
    """
    optim = SparseOptim(cfg.optim.sparse.name, cfg.optim.sparse.lr, cfg.optim.sparse.eps)
    backend: type[EmbeddingBackend] = get_class(cfg.embedding._target_)
    wants_counts = backend.uses_counts
    counts = None
    if wants_counts:
        from ..data.stats import counted_samples, load_counts

        counts = load_counts(data_path)
        samples = counted_samples(Manifest.load(data_path, key="data.path"))
    # _partial_: hydra would turn the dataclass arguments into DictConfigs if passed through it
    partial = instantiate(cfg.embedding, _partial_=True)

    def make(tables: list[TableSpec], shards: list[Shard] | None = None) -> EmbeddingBackend:
        extra: dict[str, Any] = {}
        if counts is not None:
            ranges = shards or [Shard(t.name, 0, t.num_rows, t.num_rows) for t in tables]
            extra["counts"] = {s.name: counts[s.table][s.lo : s.hi] for s in ranges}
            extra["counted_samples"] = samples
        return partial(tables=tables, optim=optim, device=device, **extra)

    return make, optim, counts


def host_budget(cfg: DictConfig, local_ranks: int) -> float:
    """Host bytes per rank for embedding tables: host_memory_gb, else MemAvailable shared by the ranks."""
    return (
        cfg.host_memory_gb * 2**30 if cfg.host_memory_gb > 0 else available_host_bytes(local_ranks)
    )


def host_row_overhead(cfg: DictConfig, device: torch.device) -> int:
    """The placement's host bytes per table row besides the row itself (its bookkeeping)."""
    backend: type[EmbeddingBackend] = get_class(cfg.embedding._target_)
    settings = OmegaConf.to_container(cfg.embedding, resolve=True, enum_to_str=True)
    assert isinstance(settings, dict)
    return backend.host_bytes_per_row(device, {str(k): v for k, v in settings.items()})


def check_host_memory(
    cfg: DictConfig, tables: list[TableSpec], optim: SparseOptim, device: torch.device
) -> None:
    """Fail before allocating when the tables cannot fit in host memory (one process).

    Start-up holds the initial rows (built on the host) next to the placement's own host copy
    (every placement but hbm keeps all rows in host memory), plus the placement's per-row
    bookkeeping.
    """
    budget = host_budget(cfg, 1)
    table_bytes = sum(t.num_rows * optim.row_bytes(t.dim) for t in tables)
    extra = sum(t.num_rows for t in tables) * host_row_overhead(cfg, device)
    backend: type[EmbeddingBackend] = get_class(cfg.embedding._target_)
    copies = 2 if backend.keeps_rows_in_host_memory else 1
    if table_bytes * copies + extra > budget:
        raise ValueError(
            f"host_memory_gb: the embedding tables take {table_bytes / 2**30:.2f} GiB "
            f"(x{copies} while they are initialized) and the placement's bookkeeping "
            f"{extra / 2**30:.2f} GiB, but {budget / 2**30:.2f} GiB of host memory are available; use more processes (torchrun shards the tables), a smaller "
            "model.embedding_dim, preprocess with hash_modulus, or set host_memory_gb if the estimate is wrong"
        )


def build_embeddings(
    cfg: DictConfig, manifest: Manifest, data_path: Path, device: torch.device, info: DistInfo
) -> tuple[EmbeddingBackend, list[Shard] | None]:
    """The embeddings, and this rank's shards when they are sharded (its loader needs them)."""
    tables = [
        TableSpec(name, rows, cfg.model.embedding_dim)
        for name, rows in zip(manifest.sparse_names, manifest.table_sizes)
    ]
    make, optim, counts = embedding_factory(cfg, data_path, device)
    if not info.distributed:
        check_host_memory(cfg, tables, optim, device)
        embeddings = make(tables)
        embeddings.import_tables(initial_state(tables, optim, cfg.seed))
        return embeddings, None
    budget = host_budget(cfg, info.local_world_size)
    placement = plan_placement(
        tables,
        info.world_size,
        optim,
        budget,
        cfg.embedding.get("cache_ratio"),
        counts,
        cfg.shard_rows_above,
        host_row_overhead(cfg, device),
    )
    if info.is_main:
        log.info(
            "embedding placement (%d ranks):\n%s",
            info.world_size,
            placement.table(info.world_size, optim.row_bytes(cfg.model.embedding_dim)),
        )
    sharded = ShardedEmbeddings(tables, optim, placement.shards, make, device)
    # the same initial rows as one process would have: whole tables from their seed, then sliced
    mine = placement.owned_by(info.rank)
    full = initial_state(
        [t for t in tables if any(s.table == t.name for s in mine)], optim, cfg.seed
    )
    state = {}
    for s in mine:
        for field in ("weight", "momentum1"):
            if f"{s.table}.{field}" in full:
                state[f"{s.name}.{field}"] = full[f"{s.table}.{field}"][s.lo : s.hi]
    sharded.import_tables(state)
    return sharded, mine
