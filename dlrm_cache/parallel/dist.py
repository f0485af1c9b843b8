"""Process-group set-up: one process per GPU (or CPU process with gloo), ranks from torchrun's env."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


class SameOnEveryRank(ValueError):
    """A bad-input error every rank of a job raises alike (decided after a collective): rank 0
    alone prints it (``quiet`` elsewhere), so N ranks say it in one line, not N."""

    def __init__(self, message: str, info: DistInfo) -> None:
        super().__init__(message)
        self.quiet = not info.is_main


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        return (
            torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
        )
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={name}: CUDA is not available on this machine (use device=cpu)"
            )
        if device.index is None:
            device = torch.device(f"cuda:{local_rank}")
    return device


def init_distributed(device: torch.device, timeout_s: float = 300.0) -> DistInfo:
    """Join the torchrun job described by the environment (a no-op for a plain single process)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return DistInfo(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
    )


# Keys that may legitimately differ between the ranks of one job.
_PER_RANK_KEYS = {"run_dir", "progress"}


def agree_on_config(cfg, info: DistInfo) -> str:
    """Fail fast (on every rank, with the differing keys) if ranks composed different configs.

    Returns the run directory every rank uses: rank 0's.
    """
    from ..config.schemas import config_dict, flatten

    if not info.distributed:
        return str(cfg.run_dir)
    mine = {k: v for k, v in flatten(config_dict(cfg)).items() if k not in _PER_RANK_KEYS}
    everyone: list = [None] * info.world_size
    dist.all_gather_object(everyone, (mine, str(cfg.run_dir)))
    base = everyone[0][0]
    for r, (other, _) in enumerate(everyone[1:], start=1):
        diff = sorted(k for k in set(base) | set(other) if base.get(k) != other.get(k))
        if diff:
            k = diff[0]
            raise SameOnEveryRank(
                f"ranks were launched with different configs: {k}={base.get(k)!r} on rank 0 but "
                f"{other.get(k)!r} on rank {r}"
                + (f" (and {len(diff) - 1} more keys)" if len(diff) > 1 else ""),
                info,
            )
    return everyone[0][1]


def agree_on_data(identity: dict[str, Any] | str, key: str, path: str, info: DistInfo) -> None:
    """Fail on every rank, naming ``key=path``, unless every rank found the same dataset there.

    ``identity``: what this rank read of it (the same config need not mean the same data: each
    node may have a copy of its own at that path), or the one-line error it got reading it (the
    other ranks then fail too, instead of waiting for it in the next collective).
    """
    from ..config.schemas import flatten

    if not info.distributed:
        return
    everyone: list = [None] * info.world_size
    dist.all_gather_object(everyone, identity)
    for r, other in enumerate(everyone):
        if isinstance(other, str):
            raise SameOnEveryRank(f"{key}={path}: rank {r} cannot read it ({other})", info)
    base = flatten(everyone[0])
    for r, other in enumerate(everyone[1:], start=1):
        theirs = flatten(other)
        diff = sorted(k for k in set(base) | set(theirs) if base.get(k) != theirs.get(k))
        if diff:
            raise SameOnEveryRank(
                f"{key}={path}: rank {r} reads another dataset there than rank 0 "
                f"({', '.join(diff[:3])} differ{' ...' if len(diff) > 3 else ''}); every rank "
                "must read the same dataset (copy it again, or put it on a shared file system)",
                info,
            )


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
