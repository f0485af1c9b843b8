"""`dlrm-cache export` of a DLRM-DCN run (model=dcn): torchrec's own DLRM_DCN, built on the CPU
from the exported JSON alone, loads the state dict with strict=True and gives predict's
probabilities."""

from __future__ import annotations

import json
from pathlib import Path

from after_runs import (
    _train,
    assert_reproduces_predict,
    exported_model,
    train_overrides,
)

from dlrm_cache.cli import main

DCN = ["model=dcn", "model.dcn_num_layers=2", "model.dcn_low_rank_dim=4"]


def test_torchrec_dlrm_dcn_reproduces_predict(processed_synth: Path, tmp_path: Path):
    run = tmp_path / "run"
    _train(train_overrides(processed_synth, run, DCN))
    out = tmp_path / "exported"
    main(["export", f"checkpoint={run}", f"output={out}"])
    meta = json.loads((out / "dlrm.json").read_text())
    assert meta["model"] == "torchrec.models.dlrm.DLRM_DCN"
    args = meta["args"]
    assert (args["dcn_num_layers"], args["dcn_low_rank_dim"]) == (2, 4)
    model = exported_model(out)
    assert_reproduces_predict(model, run, processed_synth, tmp_path)
