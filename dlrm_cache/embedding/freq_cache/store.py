"""Host storage: every row of every table, and its optimizer state, in one stacked buffer.

All tables share one embedding dim, so they are kept as one ``[sum(rows), dim]`` tensor (table ``t``
starts at ``row_offsets[t]``); a row is addressed by its *global row id* ``row_offsets[t] + rank``.
That lets the cache dedupe, map and move rows of all tables with one vectorized operation each.
Pinned (page-locked) when CUDA is available, so host<->device copies can run asynchronously.
"""

from __future__ import annotations

import numpy as np
import torch

from ..base import SparseOptim, TableSpec


class HostStore:
    def __init__(self, tables: list[TableSpec], optim: SparseOptim, dim: int, pin: bool) -> None:
        self.tables = tables
        self.dim = dim
        self.optim = optim
        self.row_offsets = np.zeros(len(tables) + 1, dtype=np.int64)
        self.row_offsets[1:] = np.cumsum([t.num_rows for t in tables])
        self.num_rows = int(self.row_offsets[-1])
        self.pinned = pin
        # Zeros, like fbgemm's own TBE buffers at construction: the model initializes the tables
        # through import_tables() whatever the placement.
        self.weight = torch.zeros((self.num_rows, dim), dtype=torch.float32, pin_memory=pin)
        spr = optim.state_per_row
        if spr == 0:
            self.momentum: torch.Tensor | None = None
        else:
            shape = (self.num_rows,) if spr == 1 else (self.num_rows, dim)
            self.momentum = torch.zeros(shape, dtype=torch.float32, pin_memory=pin)

    def table_slice(self, i: int) -> slice:
        return slice(int(self.row_offsets[i]), int(self.row_offsets[i + 1]))

    def export(self) -> dict[str, torch.Tensor]:
        out = {}
        for i, t in enumerate(self.tables):
            s = self.table_slice(i)
            out[f"{t.name}.weight"] = self.weight[s].clone()
            if self.momentum is not None:
                out[f"{t.name}.momentum1"] = self.momentum[s].clone()
        return out

    @torch.no_grad()
    def load(self, state: dict[str, torch.Tensor]) -> None:
        for i, t in enumerate(self.tables):
            s = self.table_slice(i)
            self.weight[s].copy_(state[f"{t.name}.weight"])
            if self.momentum is not None:
                self.momentum[s].copy_(state[f"{t.name}.momentum1"])
