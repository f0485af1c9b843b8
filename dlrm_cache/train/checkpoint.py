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
from ..parallel.plan import parse_key

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
        """The requested entries, reading only the files that hold them.

        A key may name a whole table (``C3.weight``) or a row range (``C3:0-500.weight``); it is
        assembled from whatever pieces the writer's sharding produced, so N-rank checkpoints
        resume on M ranks.
        """
        stored: dict[str, str] = self.meta["tables"]
        pieces: dict[tuple[str, str], list[tuple[int | None, int | None, str]]] = {}
        for k in stored:
            table, lo, hi, field = parse_key(k)
            pieces.setdefault((table, field), []).append((lo, hi, k))
        files: dict[str, dict[str, torch.Tensor]] = {}

        def load(k: str) -> torch.Tensor:
            f = stored[k]
            if f not in files:
                files[f] = torch.load(self.path / f, map_location="cpu", mmap=True, weights_only=True)
            return files[f][k]

        out: dict[str, torch.Tensor] = {}
        for key in keys:
            if key in stored:
                out[key] = load(key)
                continue
            table, lo, hi, field = parse_key(key)
            have = pieces.get((table, field))
            if not have:
                raise ValueError(
                    f"resume={self.path}: the checkpoint has no {key} (written with another model or "
                    "optimizer?)"
                )
            spans = [(plo or 0, phi if phi is not None else load(k).shape[0], k) for plo, phi, k in have]
            lo = lo or 0
            hi = hi if hi is not None else max(s[1] for s in spans)
            first = load(spans[0][2])
            result = first.new_empty((hi - lo, *first.shape[1:]))
            filled = 0
            for plo, phi, k in spans:
                a, b = max(lo, plo), min(hi, phi)
                if a < b:
                    result[a - lo : b - lo] = load(k)[a - plo : b - plo]
                    filled += b - a
            if filled != hi - lo:
                raise ValueError(f"resume={self.path}: rows {lo}-{hi} of {table}.{field} are not all there")
            out[key] = result
        return out
