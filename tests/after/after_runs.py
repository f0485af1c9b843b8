"""Helpers of the predict/export/tensorboard tests (a module of its own: test modules import it,
and `import conftest` would not say which conftest)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from hydra import compose, initialize_config_dir
from tiny import TINY_MODEL
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dlrm_cache.commands.store import config_dir, register_configs


@dataclass
class Run:
    path: Path
    summary: dict


def compose_config(name: str, overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def train_overrides(data: Path, run_dir: Path, extra: list[str]) -> list[str]:
    # eval batches of 1000: the 1715-row test split is 2 batches, the last one partial
    return [
        f"data.path={data}",
        f"run_dir={run_dir}",
        "device=cpu",
        "progress=false",
        "data.batch_size=256",
        "data.eval_batch_size=1000",
        *TINY_MODEL,
        "max_steps=30",
        "log_every=10",
        "test=true",
        *extra,
    ]


def _train(overrides: list[str]) -> dict:
    from dlrm_cache.train.loop import train

    return train(compose_config("train", overrides))


def exported_tables(args: dict) -> EmbeddingBagCollection:
    """The embedding tables an export's ``dlrm.json`` arguments describe, as torchrec builds
    them (from the JSON alone, not through dlrm_cache.after.export's own builder)."""
    tables = [
        EmbeddingBagConfig(
            name=t["name"],
            embedding_dim=t["embedding_dim"],
            num_embeddings=t["num_embeddings"],
            feature_names=t["feature_names"],
            pooling=PoolingType[t["pooling"]],
        )
        for t in args["embedding_bag_collection"]["tables"]
    ]
    return EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))


def exported_model(out: Path) -> torch.nn.Module:
    """torchrec's model of an export in ``out``, built from its ``dlrm.json`` alone (the class it
    names: ``DLRM`` or ``DLRM_DCN``) and loaded from ``state_dict.pt`` with ``strict=True``."""
    from torchrec.models.dlrm import DLRM, DLRM_DCN

    meta = json.loads((out / "dlrm.json").read_text())
    args = meta["args"]
    shape = (
        exported_tables(args),
        args["dense_in_features"],
        args["dense_arch_layer_sizes"],
        args["over_arch_layer_sizes"],
    )
    if meta["model"] == "torchrec.models.dlrm.DLRM_DCN":
        model: torch.nn.Module = DLRM_DCN(*shape, args["dcn_num_layers"], args["dcn_low_rank_dim"])
    else:
        assert meta["model"] == "torchrec.models.dlrm.DLRM", meta["model"]
        model = DLRM(*shape)
    model.load_state_dict(torch.load(out / "state_dict.pt", weights_only=True), strict=True)
    return model


def assert_reproduces_predict(
    model: torch.nn.Module, checkpoint: Path, data: Path, tmp_path: Path
) -> None:
    """``model`` (an exported state dict loaded into torchrec's model) gives ``predict``'s
    probabilities for ``checkpoint`` over ``data``'s test split, to 1e-6."""
    from dlrm_cache.after.predict import predict
    from dlrm_cache.data.format import Manifest
    from dlrm_cache.data.loader import ShardStream

    model.eval()
    predicted = tmp_path / "p.parquet"
    predict(
        compose_config(
            "predict",
            [
                "progress=false",
                f"checkpoint={checkpoint}",
                f"input={data}",
                f"output={predicted}",
            ],
        )
    )
    expected = pd.read_parquet(predicted)["probability"].to_numpy()
    stream = ShardStream(data, Manifest.load(data), "test", 1000, shuffle=False, drop_last=False)
    with torch.no_grad():
        probs = torch.cat(
            [torch.sigmoid(model(b.dense, b.sparse)).squeeze(-1) for b in stream.batches()]
        )
    np.testing.assert_allclose(probs.numpy(), expected, rtol=0, atol=1e-6)
