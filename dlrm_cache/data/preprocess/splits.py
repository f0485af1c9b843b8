"""Which split (train, val, test) each line belongs to: by line position or by file.

Split boundaries are physical line positions, so malformed lines still occupy their place; a
header line (``schema.header``) is not a data line and occupies none.  The
plan is made once every file's line count is known (after parsing), so no pass counts lines: within
one file the lines of each split are consecutive, train first (a file is one split, or halved into
val then test; with ``split: fraction`` train is a prefix of all lines).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..format import SPLITS
from .errors import PreprocessError


@dataclass
class SplitPlan:
    """Which split each (file, line) belongs to.

    fraction: by line position over the concatenated files (``bounds`` = train end, val end, total).
    day: per file a split name, or "halve" (first half of its lines val, the rest test).
    Positions count data lines: ``header`` (0 or 1) leading lines of every file are not counted.
    """

    kind: str
    files: list[Path]
    bounds: tuple[int, int, int] = (0, 0, 0)
    file_splits: list[str] = field(default_factory=list)
    halve_at: dict[int, int] = field(default_factory=dict)
    header: int = 0

    def codes(self, i: int, offset: int, lines: np.ndarray) -> np.ndarray:
        """Split index (0 train, 1 val, 2 test) of file-local line indices of file i, whose first
        data line is data line ``offset`` of all files."""
        lines = lines - self.header
        if self.kind == "fraction":
            return np.searchsorted(np.array(self.bounds[:2]), lines + offset, side="right").astype(
                np.int8
            )
        split = self.file_splits[i]
        if split == "halve":
            return np.where(lines < self.halve_at[i], 1, 2).astype(np.int8)
        return np.full(len(lines), SPLITS.index(split), dtype=np.int8)

    def spec(self) -> dict[str, Any]:
        if self.kind == "fraction":
            a, b, n = self.bounds
            lines = {"train": [0, a], "val": [a, b], "test": [b, n]}  # half-open, 0-based
            return {"kind": "fraction", "total_lines": n, "lines": lines}
        out: dict[str, Any] = {"kind": "day", **{s: [] for s in SPLITS}, "halved": {}}
        for i, (p, s) in enumerate(zip(self.files, self.file_splits)):
            if s == "halve":
                out["val"].append(p.name)
                out["test"].append(p.name)
                out["halved"][p.name] = {
                    "val_lines": self.halve_at[i],
                    "test_from_line": self.halve_at[i],
                }
            else:
                out[s].append(p.name)
        return out


def plan_splits(
    cfg: Any, files: list[Path], file_splits: list[str], file_lines: list[int], header: int = 0
) -> SplitPlan:
    """The split plan for files with ``file_lines`` data lines each (``header``: lines before
    them in every file)."""
    if cfg.split == "fraction":
        total = sum(file_lines)
        if int(cfg.total_lines) and int(cfg.total_lines) != total:
            raise PreprocessError(
                f"total_lines={int(cfg.total_lines)} but the inputs have {total} lines; "
                "fix or drop total_lines"
            )
        n_train = int(total * float(cfg.train_fraction))
        n_val = (total - n_train) // 2
        return SplitPlan("fraction", files, bounds=(n_train, n_train + n_val, total), header=header)
    halve_at = {i: file_lines[i] // 2 for i, s in enumerate(file_splits) if s == "halve"}
    return SplitPlan("day", files, file_splits=file_splits, halve_at=halve_at, header=header)
