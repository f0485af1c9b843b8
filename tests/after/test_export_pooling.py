"""`dlrm-cache export` of a run with ``model.pooling=mean``: torchrec's DLRM, built from the
exported JSON alone, pools by ``PoolingType.MEAN``, loads with strict=True, reproduces predict,
and gives the run's own model's logits on multi-hot batches (lists of any length, 0 included)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from after_runs import (
    _train,
    assert_reproduces_predict,
    exported_model,
    train_overrides,
)
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm_cache.after.trained import open_trained
from dlrm_cache.cli import main


def test_mean_pooling_exports_as_torchrec_mean(processed_synth: Path, tmp_path: Path):
    run = tmp_path / "run"
    _train(train_overrides(processed_synth, run, ["model.pooling=mean", "max_steps=10"]))
    out = tmp_path / "exported"
    main(["export", f"checkpoint={run}", f"output={out}"])
    args = json.loads((out / "dlrm.json").read_text())["args"]
    assert {t["pooling"] for t in args["embedding_bag_collection"]["tables"]} == {"MEAN"}
    model = exported_model(out)
    assert_reproduces_predict(model, run, processed_synth, tmp_path)
    # multi-hot: the run's model (FrozenTables, the mean taken by pool) and torchrec's MEAN
    trained = open_trained(str(run))
    ours = trained.model(torch.device("cpu"))
    rng = np.random.default_rng(0)
    b, sizes = 64, trained.manifest.table_sizes
    lengths = rng.integers(0, 5, (len(sizes), b))
    values = np.concatenate(
        [rng.integers(0, n, int(lengths[j].sum())) for j, n in enumerate(sizes)]
    )
    kjt = KeyedJaggedTensor.from_lengths_sync(
        trained.manifest.sparse_names, torch.from_numpy(values), torch.from_numpy(lengths.ravel())
    )
    dense = torch.from_numpy(rng.standard_normal((b, len(trained.manifest.dense_names))))
    with torch.no_grad():
        want = ours(dense.float(), kjt)
        got = model.eval()(dense.float(), kjt).squeeze(-1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
