"""Backends that hand all rows straight to one fbgemm TBE: ``host``, ``hbm`` and ``uvm_cache``.

They differ only in where fbgemm places the rows.  They are the baselines the freq_cache is measured
against, and ``host`` is what runs on machines without a GPU.
"""

from __future__ import annotations

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
)
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from .base import DeviceUnavailable, EmbeddingBackend, SparseOptim, TableSpec, pooled, shared_dim
from .tbe import CACHE_ALGORITHMS, make_tbe, momentum_view, weights_view


class TbeBackend(EmbeddingBackend):
    tbe: SplitTableBatchedEmbeddingBagsCodegen  # set in __init__, outside the module's registry
    location: EmbeddingLocation = EmbeddingLocation.HOST
    config_name = "host"  # the embedding= option that selects it (for messages)

    def __init__(
        self,
        tables: list[TableSpec],
        optim: SparseOptim,
        device: torch.device | str = "cpu",
        **tbe_kwargs,
    ) -> None:
        super().__init__(tables, optim)
        self.dim = shared_dim(tables, self.config_name)
        self.device = torch.device(device)
        # Not a registered submodule: its fused parameters must stay out of the dense optimizer,
        # and checkpoints go through export_tables() so they do not depend on the placement.
        object.__setattr__(
            self,
            "tbe",
            make_tbe(
                [t.num_rows for t in tables],
                self.dim,
                optim,
                self.device,
                self.location,
                **tbe_kwargs,
            ),
        )
        self._row_offsets = [0]
        for t in tables:
            self._row_offsets.append(self._row_offsets[-1] + t.num_rows)

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        values, offsets = features.values().long(), features.offsets().long()
        device = values.device
        if device != self.device:  # host tables under a GPU model: ids over, pooled rows back
            out = self.tbe(values.to(self.device), offsets.to(self.device)).to(device)
        else:
            out = self.tbe(values, offsets)
        return pooled(features, out, self.dim)

    def set_learning_rate(self, lr: float) -> None:
        self.tbe.set_learning_rate(lr)

    def flush(self) -> None:
        if self.location == EmbeddingLocation.MANAGED_CACHING:
            self.tbe.flush()

    def export_tables(self) -> dict[str, torch.Tensor]:
        w = weights_view(self.tbe, self.dim)
        m = momentum_view(self.tbe, self.optim, self.dim)
        out = {}
        for i, t in enumerate(self.tables):
            lo, hi = self._row_offsets[i], self._row_offsets[i + 1]
            out[f"{t.name}.weight"] = w[lo:hi].cpu().clone()
            if m is not None:
                out[f"{t.name}.momentum1"] = m[lo:hi].cpu().clone()
        return out

    @torch.no_grad()
    def import_tables(self, state: dict[str, torch.Tensor]) -> None:
        if self.location == EmbeddingLocation.MANAGED_CACHING:
            self.tbe.reset_cache_states()
        w = weights_view(self.tbe, self.dim)
        m = momentum_view(self.tbe, self.optim, self.dim)
        for i, t in enumerate(self.tables):
            lo, hi = self._row_offsets[i], self._row_offsets[i + 1]
            w[lo:hi].copy_(state[f"{t.name}.weight"])
            if m is not None:
                m[lo:hi].copy_(state[f"{t.name}.momentum1"])


class HostBackend(TbeBackend):
    """All rows in host memory, computed by fbgemm's CPU kernels (the only placement without CUDA).

    Under a GPU model the ids are copied to the host and the pooled rows back (and their gradients
    the other way): the slow baseline the caches are there to beat."""

    def __init__(self, tables, optim, device="cpu", **kw):
        super().__init__(tables, optim, "cpu", **kw)


class HbmBackend(TbeBackend):
    """All rows in GPU memory: the speed the caches are measured against."""

    location = EmbeddingLocation.DEVICE
    config_name = "hbm"
    keeps_rows_in_host_memory = False

    def __init__(self, tables, optim, device="cuda", **kw):
        super().__init__(tables, optim, _require_cuda(device, "hbm"), **kw)


class UvmCacheBackend(TbeBackend):
    """fbgemm's own set-associative cache over host memory (torchrec's FUSED_UVM_CACHING kernel)."""

    location = EmbeddingLocation.MANAGED_CACHING
    config_name = "uvm_cache"

    def __init__(
        self,
        tables,
        optim,
        device="cuda",
        cache_ratio: float = 0.015,
        algorithm: str = "lru",
        host_mapped: bool = True,
        **kw,
    ):
        if not 0 < cache_ratio <= 1:
            raise ValueError(f"embedding.cache_ratio={cache_ratio}: must be in (0, 1]")
        if algorithm not in CACHE_ALGORITHMS:
            raise ValueError(
                f"embedding.algorithm={algorithm!r}: choose one of {sorted(CACHE_ALGORITHMS)}"
            )
        super().__init__(
            tables,
            optim,
            _require_cuda(device, "uvm_cache"),
            cache_load_factor=cache_ratio,
            cache_algorithm=CACHE_ALGORITHMS[algorithm],
            uvm_host_mapped=host_mapped,
            gather_uvm_cache_stats=True,
            **kw,
        )
        self.cache_ratio = cache_ratio

    def stats(self) -> dict[str, float]:
        """fbgemm's own counters since the last reset (it counts distinct ids per call, not accesses)."""
        s = self.tbe.get_uvm_cache_stats(use_local_cache=False).tolist()
        # UVMCacheStatsIndex: calls, requested, unique, unique misses, conflict unique, conflict misses
        unique, misses = s[2], s[3]
        rb = self.optim.row_bytes(self.dim)
        # fbgemm's LFU path does not update these two counters: no rate, not a made-up one
        rate = {"hit_rate_distinct": 1.0 - misses / unique} if unique else {}
        return {
            **rate,
            "distinct_ids": float(unique),
            "rows_loaded": float(misses),
            "bytes_loaded": float(misses * rb),
            "conflict_misses": float(s[5]),
            "cache_rows": float(self.tbe.lxu_cache_weights.size(0)),
            "cache_bytes": float(
                self.tbe.lxu_cache_weights.numel() * self.tbe.lxu_cache_weights.element_size()
            ),
        }

    def reset_stats(self) -> None:
        self.tbe.reset_uvm_cache_stats()


def _require_cuda(device, name: str) -> torch.device:
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise DeviceUnavailable(
            f"embedding={name} needs a CUDA GPU (device={device}, cuda available: "
            f"{torch.cuda.is_available()}); use embedding=host on machines without one"
        )
    return device
