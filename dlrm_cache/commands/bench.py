"""`dlrm-cache bench`: the benchmarks (:mod:`dlrm_cache.bench`); a failed row is exit status 1."""

from __future__ import annotations

import sys

from omegaconf import DictConfig


def run(cfg: DictConfig) -> None:
    from ..bench import BenchFailed
    from ..bench.run import bench

    try:
        bench(cfg)
    except BenchFailed as e:  # the rows and their tracebacks are printed above
        print(f"dlrm-cache bench: failed: {e}", file=sys.stderr)
        raise SystemExit(1) from None
