"""Checkpoints: dense model + optimizer + data position, and the full embedding tables.

A checkpoint is a directory ``checkpoints/step_<N>/``: ``dense.pt`` (written by rank 0), one
``tables-rank<R>.pt`` per rank that owns tables (full tables in row order, whatever their placement
or cache state) and ``meta.json`` (which file holds which table), written last.  Tables are found by
name, so a checkpoint written by N ranks can be resumed by M ranks with any table placement.
Everything is written under a temporary name and renamed into place once complete.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..data.format import atomic_write_text

CKPT_DIR = "checkpoints"


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_checkpoint(
    run_dir: Path, step: int, dense: dict[str, Any], tables: dict[str, torch.Tensor], rank: int
) -> Path:
    """Collective under torchrun: every rank calls it with its own tables."""
    root = Path(run_dir) / CKPT_DIR
    final = root / f"step_{step:08d}"
    tmp = root / f".step_{step:08d}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    files: dict[str, list[str]] = {}
    if tables:
        name = f"tables-rank{rank}.pt"
        torch.save(tables, tmp / name)
        files[name] = sorted(tables)
    if dist.is_initialized():
        gathered: list[dict[str, list[str]]] = [None] * dist.get_world_size()  # type: ignore[list-item]
        dist.all_gather_object(gathered, files)
        files = {k: v for g in gathered for k, v in g.items()}
    if rank == 0:
        torch.save(dense, tmp / "dense.pt")
        meta = {"step": step, "tables": {k: f for f, keys in files.items() for k in keys}}
        atomic_write_text(tmp / "meta.json", json.dumps(meta, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        atomic_write_text(root / "latest", final.name + "\n")
    _barrier()
    return final


def find_checkpoint(resume: str) -> Path:
    """A checkpoint directory, or a run directory / its checkpoints folder (then its latest)."""
    p = Path(resume).expanduser()
    if (p / "meta.json").is_file():
        return p
    for d in (p / CKPT_DIR, p):
        if (d / "latest").is_file():
            return d / (d / "latest").read_text().strip()
    raise FileNotFoundError(f"resume={resume}: no checkpoint there, nor a run directory with one")


class Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.meta = json.loads((path / "meta.json").read_text())
            self.dense = torch.load(path / "dense.pt", map_location="cpu", weights_only=False)
        except Exception as e:  # a truncated or foreign checkpoint
            raise ValueError(f"resume={path}: not a readable dlrm-cache checkpoint ({e})") from None

    def tables(self, keys: list[str]) -> dict[str, torch.Tensor]:
        """The requested table entries, reading only the files that hold them."""
        missing = [k for k in keys if k not in self.meta["tables"]]
        if missing:
            raise ValueError(
                f"resume={self.path}: the checkpoint has no {', '.join(missing[:4])} (written with "
                "another model or optimizer?)"
            )
        out: dict[str, torch.Tensor] = {}
        for f in sorted({self.meta["tables"][k] for k in keys}):
            data = torch.load(self.path / f, map_location="cpu", mmap=True, weights_only=True)
            out.update({k: v for k, v in data.items() if k in keys})
        return out
