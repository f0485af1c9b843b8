"""Host storage: every row of every table, its optimizer state and its counts, in host memory.

All tables share one embedding dim, so they are kept as one ``[sum(rows), dim]`` tensor (table ``t``
starts at ``row_offsets[t]``); a row is addressed by its *global row id* ``row_offsets[t] + rank``.
That lets the cache dedupe, map and move rows of all tables with one vectorized operation each.

Weights and optimizer state share one ``[rows + 1, dim + state]`` tensor (``data``; ``weight`` and
``momentum`` are column views of it), so a row moves as one contiguous record.

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
        # One row per table row holds its weights and then its optimizer state, so a row moves
        # between host and device as one contiguous read or write (one kernel per direction, not
        # one for the weights and one for the state).  One scratch row at the end (``scratch_row``)
        # takes the writes that need not happen, so the cache never has to count them on the host.
        # Zeros, like fbgemm's own TBE buffers at construction: the model initializes the tables
        # through import_tables() whatever the placement.
        self.state_cols = optim.state_floats(dim)
        self.scratch_row = self.num_rows
        self.data = host_tensor((self.num_rows + 1, dim + self.state_cols), torch.float32, device)
        self.weight, self.momentum = self._columns(self.data[: self.num_rows])
        self.counts: torch.Tensor | None = None
        if counts is not None:
            self.counts = host_tensor((self.num_rows,), torch.float64, device)
            self.counts.copy_(torch.from_numpy(np.ascontiguousarray(counts, dtype=np.float64)))
        self.observed = host_tensor((self.num_rows,), torch.int64, device) if observed else None

    def table_slice(self, i: int) -> slice:
        return slice(int(self.row_offsets[i]), int(self.row_offsets[i + 1]))

    def _columns(self, records: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The weight and optimizer-state views of ``[n, dim + state_cols]`` records."""
        if self.state_cols == 0:
            return records[:, : self.dim], None
        if self.optim.state_per_row == 1:  # one value per row (rowwise optimizers)
            return records[:, : self.dim], records[:, self.dim]
        return records[:, : self.dim], records[:, self.dim :]

    def export(self) -> dict[str, torch.Tensor]:
        # Each table's records leave the store in one contiguous copy (host-mapped memory is a CUDA
        # tensor to torch: copying a column view out of it would stage the table in device memory).
        out = {}
        for i, t in enumerate(self.tables):
            records = self.data[self.table_slice(i)]
            records = records.cpu() if self.mapped else records
            weight, state = self._columns(records)
            out[f"{t.name}.weight"] = weight.clone(memory_format=torch.contiguous_format)
            if state is not None:
                out[f"{t.name}.momentum1"] = state.clone(memory_format=torch.contiguous_format)
        return out

    @torch.no_grad()
    def load(self, state: dict[str, torch.Tensor]) -> None:
        for i, t in enumerate(self.tables):
            s = self.table_slice(i)
            records = torch.empty((s.stop - s.start, self.data.shape[1]), dtype=torch.float32)
            weight, optim_state = self._columns(records)
            weight.copy_(state[f"{t.name}.weight"])
            if optim_state is not None:
                optim_state.copy_(state[f"{t.name}.momentum1"])
            self.data[s].copy_(records)  # one contiguous copy into the store, as in export
