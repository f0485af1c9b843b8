"""Host storage: every row of every table, its optimizer state and its counts, in host memory.

All tables share one embedding dim, so they are kept as one ``[sum(rows), dim]`` tensor (table ``t``
starts at ``row_offsets[t]``); a row is addressed by its *global row id* ``row_offsets[t] + rank``.
That lets the cache dedupe, map and move rows of all tables with one vectorized operation each.

Under CUDA the buffers are *host-mapped* (fbgemm's ``new_unified_tensor``: pinned host memory the
GPU addresses directly, what fbgemm's own UVM cache uses with ``uvm_host_mapped``).  They are CUDA
tensors to torch, so the cache gathers missing rows and scatters write-backs with ordinary
``index_select``/``index_copy_`` kernels on a side stream: no CPU copies, no staging buffers, no
host synchronization.  Without CUDA they are ordinary CPU tensors and the same code runs on them.
Per-row data (weights, optimizer state, dataset counts, observed counts) lives here only, so device
memory scales with the cache, not with the tables.
"""

from __future__ import annotations

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm.new_unified_tensor)
import numpy as np
import torch

from ..base import SparseOptim, TableSpec


def host_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros in host memory: host-mapped (addressable by ``device``'s kernels) under CUDA."""
    if device.type != "cuda":
        return torch.zeros(shape, dtype=dtype)
    mapped = torch.ops.fbgemm.new_unified_tensor(
        torch.zeros(1, device=device, dtype=dtype), list(shape), is_host_mapped=True
    )
    return torch.zeros(shape, dtype=dtype, device=device, out=mapped)


class HostStore:
    def __init__(
        self,
        tables: list[TableSpec],
        optim: SparseOptim,
        dim: int,
        device: torch.device,
        counts: np.ndarray | None = None,
        observed: bool = False,
    ) -> None:
        self.tables = tables
        self.dim = dim
        self.optim = optim
        self.mapped = device.type == "cuda"
        self.row_offsets = np.zeros(len(tables) + 1, dtype=np.int64)
        self.row_offsets[1:] = np.cumsum([t.num_rows for t in tables])
        self.num_rows = int(self.row_offsets[-1])
        # Zeros, like fbgemm's own TBE buffers at construction: the model initializes the tables
        # through import_tables() whatever the placement.
        self.weight = host_tensor((self.num_rows, dim), torch.float32, device)
        spr = optim.state_per_row
        if spr == 0:
            self.momentum: torch.Tensor | None = None
        else:
            shape = (self.num_rows,) if spr == 1 else (self.num_rows, dim)
            self.momentum = host_tensor(shape, torch.float32, device)
        self.counts: torch.Tensor | None = None
        if counts is not None:
            self.counts = host_tensor((self.num_rows,), torch.float64, device)
            self.counts.copy_(torch.from_numpy(np.ascontiguousarray(counts, dtype=np.float64)))
        self.observed = host_tensor((self.num_rows,), torch.int64, device) if observed else None

    def table_slice(self, i: int) -> slice:
        return slice(int(self.row_offsets[i]), int(self.row_offsets[i + 1]))

    def export(self) -> dict[str, torch.Tensor]:
        def copy(t: torch.Tensor) -> torch.Tensor:
            return t.cpu() if self.mapped else t.clone()

        out = {}
        for i, t in enumerate(self.tables):
            s = self.table_slice(i)
            out[f"{t.name}.weight"] = copy(self.weight[s])
            if self.momentum is not None:
                out[f"{t.name}.momentum1"] = copy(self.momentum[s])
        return out

    @torch.no_grad()
    def load(self, state: dict[str, torch.Tensor]) -> None:
        for i, t in enumerate(self.tables):
            s = self.table_slice(i)
            self.weight[s].copy_(state[f"{t.name}.weight"])
            if self.momentum is not None:
                self.momentum[s].copy_(state[f"{t.name}.momentum1"])
