"""`dlrm-cache verify DATASET`: read every shard of a processed dataset and check it against its
manifest (:mod:`dlrm_cache.data.verify`)."""

from __future__ import annotations

from omegaconf import DictConfig


def run(cfg: DictConfig, paths: tuple[str, ...] = ()) -> None:
    """``paths``: the dataset directory typed before the overrides, if any."""
    from ..data.verify import verify

    if len(paths) > 1:
        raise ValueError(f"verify takes one dataset directory, not {len(paths)}: {' '.join(paths)}")
    if paths:
        cfg.data_path = paths[0]
    verify(cfg)
