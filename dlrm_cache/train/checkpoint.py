"""Checkpoints: dense model + optimizer, the full embedding tables, and what they were trained on.

A checkpoint is a directory ``checkpoints/step_<N>/``: ``dense.pt`` (written by rank 0), one
``tables-rank<R>.pt`` per rank that owns tables (full tables in row order, whatever their placement
or cache state) and ``meta.json``, written last: the step, which file holds which table, every
file's size and sha256 (``files``, ``digests``), the run's config and the identity of its dataset.
Tables are found by name, so a checkpoint written by N ranks can be resumed by M ranks with any
table placement.

Crash safety: everything is written (and fsync'ed) into ``.step_<N>.tmp/``, which replaces
``step_<N>/`` by :func:`~dlrm_cache.files.atomic.replace_dir`, so a kill at any point leaves every
earlier checkpoint complete; :func:`final_checkpoint` takes the newest complete one that the run's
log records (a resume from an older checkpoint first sets the later ones aside: :mod:`.branch`).

Reading one back, checked, with ``torch.load(weights_only=True)`` (no code runs): :mod:`.saved`;
checking it against a resumed run: :mod:`.resume`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from ..config.schemas import config_dict
from ..data.format import Manifest
from ..files.atomic import (
    WriteError,
    atomic_write_text,
    fsync_path,
    one_line,
    recover_dir,
    replace_dir,
    torch_save,
)
from ..files.layout import CKPT_DENSE, CKPT_META
from ..rundir.records import CKPT_DIR, recorded_checkpoints

_STEP_DIR = re.compile(r"step_(\d+)")
_LEFT_BEHIND = re.compile(r"\.(step_\d+)\.(tmp|old)")  # by a save that was killed


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_checkpoint(
    run_dir: Path,
    step: int,
    dense: dict[str, Any],
    tables: dict[str, torch.Tensor],
    rank: int,
    meta: dict[str, Any],
) -> Path:
    """Collective under torchrun: every rank calls it with its own tables; rank 0's ``dense`` and
    ``meta`` (JSON-able: config, dataset identity, ...) are stored."""
    final = step_dir(run_dir, step)
    root = final.parent
    tmp = root / f".{final.name}.tmp"
    if rank == 0:
        _clean_left_behind(root)
        tmp.mkdir(parents=True)
    _barrier()
    files: dict[str, tuple[list[str], int, str]] = {}  # file -> (its entries, size, sha256)
    try:
        if tables:
            name = f"tables-rank{rank}.pt"
            files[name] = (sorted(tables), *torch_save(tables, tmp / name))
        if dist.is_initialized():
            gathered: list[dict] = [None] * dist.get_world_size()  # type: ignore[list-item]
            dist.all_gather_object(gathered, files)
            files = {k: v for g in gathered for k, v in g.items()}
        if rank == 0:
            files[CKPT_DENSE] = ([], *torch_save(dense, tmp / CKPT_DENSE))
            record = {
                **meta,
                "step": step,
                "tables": {k: f for f, (keys, _, _) in files.items() for k in keys},
                "files": {f: size for f, (_, size, _) in files.items()},
                "digests": {f: digest for f, (_, _, digest) in files.items()},  # saved.py checks
            }
            atomic_write_text(tmp / CKPT_META, json.dumps(record, indent=1))
            fsync_path(tmp / CKPT_META)
            replace_dir(tmp, final)
    except OSError as e:  # disk full, quota, permissions: the earlier checkpoints stay as they were
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise WriteError(
            e.errno,
            f"checkpoint step {step} not written ({e.strerror or one_line(e)}); "
            "the earlier checkpoints are intact",
            str(e.filename or tmp),
        ) from None
    _barrier()
    return final


def step_dir(run_dir: Path, step: int) -> Path:
    """Where :func:`save_checkpoint` puts the checkpoint of ``step``."""
    return Path(run_dir) / CKPT_DIR / f"step_{step:08d}"


def _clean_left_behind(root: Path) -> None:
    """Temporary directories of killed saves go; a checkpoint left aside by one goes back."""
    if not root.is_dir():
        return
    for p in root.iterdir():
        m = _LEFT_BEHIND.fullmatch(p.name)
        if m and m[2] == "tmp":
            shutil.rmtree(p)
        elif m:
            recover_dir(root / m[1])


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Every directory of a step in ``root``, by step: ``step_N`` (complete or not) and what a
    killed save of it left (``.step_N.tmp``, ``.step_N.old``)."""
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.fullmatch(p.name) or _LEFT_BEHIND.fullmatch(p.name)
        if m and p.is_dir():
            found.append((int(m[1].removeprefix("step_")), p))
    return sorted(found)


def complete_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``directory`` by step: ``step_N`` with its meta.json, or the old
    ``step_N`` a killed save had set aside (before its replacement arrived)."""
    found: dict[int, Path] = {}
    if not directory.is_dir():
        return []
    for p in directory.iterdir():
        step = _STEP_DIR.fullmatch(p.name)
        aside = _LEFT_BEHIND.fullmatch(p.name)
        if not (p / CKPT_META).is_file():
            continue
        if step:
            found[int(step[1])] = p
        elif aside and aside[2] == "old" and not (directory / aside[1]).exists():
            found[int(_STEP_DIR.fullmatch(aside[1])[1])] = p  # type: ignore[index]
    return sorted(found.items())


def final_checkpoint(run_dir: Path, folder: Path | None = None) -> Path | None:
    """The run's final checkpoint: the newest complete one that its log records.

    The one function that chooses "the run's last checkpoint" (predict, export and
    ``resume=RUN`` come here through :func:`find_checkpoint` for their ``which=last``, and through
    :func:`.best.choose_checkpoint`, which also knows the best; train's refusal message too).  The log's
    checkpoint records are the run's account of itself (a resume cuts them back to its
    checkpoint's), so a checkpoint they do not name is not the run's: one of a branch a resume
    abandoned (normally set aside, see :mod:`.branch`), or one copied in.  Without a log, or with
    a log that records none (checkpoints only), the newest complete one.  ``folder``: where the
    ``step_N`` directories are (default ``run_dir/checkpoints``).
    """
    found = complete_checkpoints(folder if folder is not None else run_dir / CKPT_DIR)
    recorded = recorded_checkpoints(run_dir)
    if recorded:
        found = [(step, p) for step, p in found if step in recorded]
    return found[-1][1] if found else None


def find_checkpoint(resume: str) -> Path:
    """A checkpoint directory, or a run directory / its checkpoints folder / a folder of
    ``step_N`` directories: then its :func:`final_checkpoint`."""
    p = Path(resume).expanduser()
    if (p / CKPT_META).is_file():
        return p
    final = final_checkpoint(*run_and_folder(p))
    if final is None:
        raise FileNotFoundError(
            f"resume={resume}: no checkpoint there (a directory with {CKPT_META}), nor a run directory with a complete one"
        )
    return final


def run_and_folder(p: Path) -> tuple[Path, Path]:
    """The run directory whose log describes the checkpoints of ``p`` (a run directory, its
    checkpoints folder, or a folder of ``step_N`` directories), and the folder that holds them."""
    if (p / CKPT_DIR).is_dir():
        return p, p / CKPT_DIR
    if p.name == CKPT_DIR:
        return p.parent, p
    return p, p


def remove_checkpoint(path: Path) -> None:
    """Remove a complete checkpoint: first renamed to what a killed save leaves (``.step_N.tmp``,
    which the next save removes), so no kill leaves a part of it under its name."""
    m = _STEP_DIR.fullmatch(path.name) or _LEFT_BEHIND.fullmatch(path.name)
    assert m is not None, path
    aside = path.parent / f".step_{m[1].removeprefix('step_')}.tmp"
    shutil.rmtree(aside, ignore_errors=True)
    path.rename(aside)
    shutil.rmtree(aside)


def checkpoint_meta(
    cfg: DictConfig, manifest: Manifest, world_size: int, log_records: int
) -> dict[str, Any]:
    """What :func:`save_checkpoint` records beside the tensors (the other half of a resume check)."""
    return {
        "config": config_dict(cfg),
        "cwd": os.getcwd(),  # where a relative data.path is (trained.recorded_dataset)
        "dataset": manifest.identity(),
        "world_size": world_size,
        "log_records": log_records,
    }
