"""Host storage: every row of every table and its optimizer state, in host memory.

All tables share one embedding dim, so they are kept as one ``[sum(rows), dim + state]`` tensor
(table ``t`` starts at ``row_offsets[t]``); a row is addressed by its *global row id*
``row_offsets[t] + rank``, so the cache dedupes, maps and moves rows of all tables with one
vectorized operation each.  A row's weights and optimizer state are one contiguous *record*
(``weight`` and ``momentum`` are column views of ``data``): it is gathered into a staging buffer,
crosses PCIe and is scattered back as one piece.

The store is plain (pageable) host memory, touched by host code only: the planner gathers the
rows a round misses into a pinned staging buffer (``gather``), the device copies them in, and rows
written back arrive in a staging buffer that is scattered here (``scatter``).  No device kernel
ever reads or writes it (the stream harness checks that: ``Streams.host_resident``).  One more
row than the tables have, the *scratch row* (``scratch_row``), receives what an empty way "held"
when it is a victim, so a write-back is never filtered on the host.
"""

from __future__ import annotations

import numpy as np
import torch

from ..base import SparseOptim, TableSpec
from .threads import HostThreads


class HostStore:
    def __init__(
        self,
        tables: list[TableSpec],
        optim: SparseOptim,
        dim: int,
        threads: HostThreads,
    ) -> None:
        self.tables = tables
        self.dim = dim
        self.optim = optim
        self.threads = threads
        self.row_offsets = np.zeros(len(tables) + 1, dtype=np.int64)
        self.row_offsets[1:] = np.cumsum([t.num_rows for t in tables])
        self.num_rows = int(self.row_offsets[-1])
        self.scratch_row = self.num_rows
        self.state_cols = optim.state_floats(dim)
        self.record_cols = dim + self.state_cols
        # Zeros, like fbgemm's own TBE buffers at construction: the model initializes the tables
        # through import_tables() whatever the placement.
        self.data = torch.zeros((self.num_rows + 1, self.record_cols), dtype=torch.float32)
        self._np = self.data.numpy()

    def table_slice(self, i: int) -> slice:
        return slice(int(self.row_offsets[i]), int(self.row_offsets[i + 1]))

    def columns(self, records: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The weight and optimizer-state views of ``[n, dim + state_cols]`` records."""
        if self.state_cols == 0:
            return records[:, : self.dim], None
        if self.optim.state_per_row == 1:  # one value per row (rowwise optimizers)
            return records[:, : self.dim], records[:, self.dim]
        return records[:, : self.dim], records[:, self.dim :]

    def gather(self, rows: np.ndarray, out: torch.Tensor) -> None:
        """``out[i] = record of rows[i]`` (host memory into a staging buffer), on the host threads
        (torch's ``index_select``, each piece on one thread: faster than numpy's ``take`` on rows
        of this size, measured in docs/benchmarks.md)."""
        data, index = self.data, torch.from_numpy(rows)
        self.threads.split(
            len(rows), lambda a, b: torch.index_select(data, 0, index[a:b], out=out[a:b])
        )

    def scatter(self, rows: np.ndarray, records: torch.Tensor) -> None:
        """``record of rows[i] = records[i]`` (distinct rows but the scratch row), on the host
        threads (torch's ``index_copy_``, each piece on one thread: faster than numpy's scatter on
        rows of this size, measured in docs/benchmarks.md)."""
        data, index = self.data, torch.from_numpy(rows)
        self.threads.split(len(rows), lambda a, b: data.index_copy_(0, index[a:b], records[a:b]))

    def export(self) -> dict[str, torch.Tensor]:
        out = {}
        for i, t in enumerate(self.tables):
            weight, state = self.columns(self.data[self.table_slice(i)])
            out[f"{t.name}.weight"] = weight.clone(memory_format=torch.contiguous_format)
            if state is not None:
                out[f"{t.name}.momentum1"] = state.clone(memory_format=torch.contiguous_format)
        return out

    @torch.no_grad()
    def load(self, state: dict[str, torch.Tensor]) -> None:
        for i, t in enumerate(self.tables):
            weight, optim_state = self.columns(self.data[self.table_slice(i)])
            weight.copy_(state[f"{t.name}.weight"])
            if optim_state is not None:
                optim_state.copy_(state[f"{t.name}.momentum1"])
