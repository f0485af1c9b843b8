"""`train` on a multi-hot dataset through the real CLI: jagged batches, sum pooling, above chance."""

from __future__ import annotations

import json
from pathlib import Path

from launching import run_cli
from test_train import SMALL


def test_train_on_multi_hot_lists_learns(multi_hot_dataset: Path, tmp_path: Path):
    run = tmp_path / "run"
    args = [f"data.path={multi_hot_dataset}", f"hydra.run.dir={run}", "embedding=host", "epochs=2"]
    done = run_cli("train", *SMALL, *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 * (3000 // 128)
    # well above chance (0.5): the planted signal includes the mean of each list's per-id effects
    assert summary["val_auc"] > 0.75, summary
