"""Starting the CLI or several ranks from a test, on the CPU (gloo): ``dlrm-cache`` as a child
process, ranks in process through torch's elastic launcher (what torchrun runs), or as the real
`torchrun` command line."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.distributed.launcher.api import LaunchConfig, elastic_launch

REPO = Path(__file__).resolve().parents[1]


def run_cli(
    *args: str,
    cwd: Path,
    env_extra: dict | None = None,
    timeout: float = 300,
    plain_errors: bool = False,
) -> subprocess.CompletedProcess:
    """``python -m dlrm_cache ARGS`` in ``cwd`` with this checkout's package, output captured;
    ``plain_errors``: without ``DLRM_CACHE_TRACEBACK`` (bad input as users see it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    if plain_errors:
        env.pop("DLRM_CACHE_TRACEBACK", None)
    return subprocess.run(
        [sys.executable, "-m", "dlrm_cache", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# `python -m torch.distributed.run ... -m dlrm_cache`: 2 ranks on this machine; the command word
# and its overrides follow
TORCHRUN_2 = [
    sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
    "-m", "dlrm_cache",
]  # fmt: skip


def launch_ranks(nproc: int, entry: Callable[..., Any], *args: Any) -> dict[int, Any]:
    """``entry(*args)`` in ``nproc`` spawned ranks (one process group); each rank's result."""
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    return elastic_launch(config, entry)(*args)
