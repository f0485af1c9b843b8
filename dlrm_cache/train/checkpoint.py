"""Checkpoints: model (full embedding tables, whatever their placement) + optimizer + data position."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

CKPT_DIR = "checkpoints"


def save_checkpoint(run_dir: Path, step: int, payload: dict[str, Any]) -> Path:
    """Write ``checkpoints/step_<N>.pt`` atomically and point ``latest`` at it."""
    d = Path(run_dir) / CKPT_DIR
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"step_{step:08d}.pt"
    fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    latest = d / "latest"
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".latest.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(path.name + "\n")
    os.replace(tmp, latest)
    return path


def find_checkpoint(resume: str) -> Path:
    """A checkpoint file, or a run directory / its checkpoints folder (then its latest checkpoint)."""
    p = Path(resume).expanduser()
    if p.is_file():
        return p
    for d in (p / CKPT_DIR, p):
        if (d / "latest").is_file():
            return d / (d / "latest").read_text().strip()
    raise FileNotFoundError(f"resume={resume}: no checkpoint file there, nor a run directory with one")


def load_checkpoint(path: Path) -> dict[str, Any]:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a truncated or foreign file
        raise ValueError(f"resume={path}: not a readable dlrm-cache checkpoint ({e})") from None
