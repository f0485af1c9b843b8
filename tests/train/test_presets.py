"""Every model preset trains at its own defaults (configs/model/<m>.yaml with configs/optim/<m>.yaml):
no loss-guard stop, and above chance after a few steps.

The presets' first steps are the risk: at Adagrad's rates without a warm-up, the 1024-wide MLPs of
``mlperf`` and ``dcn`` and sum-pooled multi-hot lists (from a batch of 512 up) jumped the loss to
many times chance's at step 2-4, and the loss guard stopped the run. These runs keep each preset's
whole model and optimizer, changing only the batch (small data) and the number of steps; the AUCs
the presets reach on 500k lines are in docs/presets.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_train import compose_train

from dlrm_cache.train.loop import train

STEPS = 12


@pytest.mark.parametrize(
    ("model", "multi_hot", "batch"),
    [("small", True, 512), ("mlperf", False, 256), ("dcn", False, 256)],
    ids=["small-multi-hot", "mlperf", "dcn"],
)
def test_each_preset_trains_at_its_defaults(
    model: str,
    multi_hot: bool,
    batch: int,
    processed_synth: Path,
    processed_synth_multi_hot: Path,
    tmp_path: Path,
):
    data = processed_synth_multi_hot if multi_hot else processed_synth
    overrides = [
        f"data.path={data}",
        f"run_dir={tmp_path / 'run'}",
        f"model={model}",
        "device=cpu",
        "progress=false",
        f"data.batch_size={batch}",
        "data.eval_batch_size=2048",
        f"max_steps={STEPS}",
    ]
    summary = train(compose_train(overrides))
    assert summary["steps"] == STEPS
    assert summary["val_auc"] > 0.55, summary
