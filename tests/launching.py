"""Starting several ranks from a test, on the CPU (gloo): in process through torch's elastic
launcher (what torchrun runs), or as the real `torchrun` command line."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from typing import Any

from torch.distributed.launcher.api import LaunchConfig, elastic_launch

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
