"""`dlrm-cache export` of a DLRM-DCN run (model=dcn): torchrec's own DLRM_DCN, built on the CPU
from the exported JSON alone, loads the state dict with strict=True and gives predict's
probabilities."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from after_runs import _train, compose_config, train_overrides
from torchrec.models.dlrm import DLRM_DCN
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dlrm_cache.cli import main
from dlrm_cache.data.format import Manifest
from dlrm_cache.data.loader import ShardStream
from dlrm_cache.predict import predict

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
    tables = [
        EmbeddingBagConfig(
            name=t["name"],
            embedding_dim=t["embedding_dim"],
            num_embeddings=t["num_embeddings"],
            feature_names=t["feature_names"],
        )
        for t in args["embedding_bag_collection"]["tables"]
    ]
    model = DLRM_DCN(
        EmbeddingBagCollection(tables=tables, device=torch.device("cpu")),
        args["dense_in_features"],
        args["dense_arch_layer_sizes"],
        args["over_arch_layer_sizes"],
        args["dcn_num_layers"],
        args["dcn_low_rank_dim"],
    )
    model.load_state_dict(torch.load(out / "state_dict.pt", weights_only=True), strict=True)
    model.eval()

    predicted = tmp_path / "p.parquet"
    predict(
        compose_config(
            "predict",
            [
                "progress=false",
                f"checkpoint={run}",
                f"input={processed_synth}",
                f"output={predicted}",
            ],
        )
    )
    expected = pd.read_parquet(predicted)["probability"].to_numpy()
    manifest = Manifest.load(processed_synth)
    stream = ShardStream(processed_synth, manifest, "test", 1000, shuffle=False, drop_last=False)
    with torch.no_grad():
        probs = torch.cat(
            [torch.sigmoid(model(b.dense, b.sparse)).squeeze(-1) for b in stream.batches()]
        )
    np.testing.assert_allclose(probs.numpy(), expected, rtol=0, atol=1e-6)
