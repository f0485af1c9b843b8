"""How much of a planted (C1, C2) id-pair cross a trained model's logit carries.

    python scripts/cross_probe.py SYNTH_DIR RUN_DIR [RUN_DIR ...]

``SYNTH_DIR``: the output of ``dlrm-cache synth cross=ids cross_scale=...`` (one-hot C1 and C2;
its ``oracle.json`` rebuilds the planted model); ``RUN_DIR``: ``train`` runs on that set,
preprocessed.  Per run, the logit's mean over the first ``--samples`` validation samples is taken
with C1 and C2 set to every pair of their kept rows (a ``[n1, n2]`` table ``L``); ``L`` and the
planted ``cross_scale * c[id1, id2]`` (``C``) are double-centred (row and column means removed:
what no sum of per-id terms expresses, i.e. the cross part).  Printed: their correlation, the
slope of ``L`` on ``C`` (1: the cross at its planted strength) and ``1 - |L - C|^2 / |C|^2``, the
share of the planted cross the logit reproduces (1: all of it, 0: none; the rare row left out).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from omegaconf import OmegaConf
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm_cache.after.trained import open_trained
from dlrm_cache.data.config import SynthConfig
from dlrm_cache.data.stats import COUNTS
from dlrm_cache.data.synth import ORACLE
from dlrm_cache.data.synthmodel import build_model, pair_effect, table_sizes


def model_index(processed: Path, feature: str, hex_ids: list[str]) -> np.ndarray:
    """Per kept row of ``feature`` (rank order), the planted model's index (the empty value: n)."""
    counts = pq.read_table(processed / COUNTS).to_pandas()
    rank_of = {int(h, 16): r for r, h in enumerate(hex_ids)}
    ids = counts[counts.feature == feature].id.to_numpy()
    return np.array([len(hex_ids) if i == -1 else rank_of[int(i)] for i in ids])


def centred(x: np.ndarray) -> np.ndarray:
    return x - x.mean(0, keepdims=True) - x.mean(1, keepdims=True) + x.mean()


def probe(run: str, planted, samples: int) -> dict[str, float]:
    trained = open_trained(run)
    model = trained.model(torch.device("cpu"))
    names = trained.manifest.sparse_names
    rows = [
        model_index(trained.data_path, f, planted.hex_ids[j].to_pylist())
        for j, f in enumerate(names[:2])
    ]
    a, b = np.meshgrid(rows[0], rows[1], indexing="ij")
    planted_cross = planted.cross_scale * pair_effect(a, b, planted.cross_seed)
    val = pq.read_table(trained.data_path / "val").slice(0, samples).to_pandas()
    dense = torch.tensor(val[trained.manifest.dense_names].to_numpy(), dtype=torch.float32)
    ids = torch.tensor(val[names].to_numpy().astype(np.int64))
    lengths = torch.ones(len(names) * len(val), dtype=torch.int64)
    logits = np.zeros(a.shape)
    with torch.no_grad():
        for i in range(a.shape[0]):
            for j in range(a.shape[1]):
                ids[:, 0], ids[:, 1] = i, j
                kjt = KeyedJaggedTensor.from_lengths_sync(names, ids.T.reshape(-1), lengths)
                logits[i, j] = model(dense, kjt).mean().item()
    got, want = centred(logits), centred(planted_cross)
    return {
        "corr": float((got * want).sum() / np.sqrt((got**2).sum() * (want**2).sum())),
        "slope": float((got * want).sum() / (want**2).sum()),
        "explained": float(1 - ((got - want) ** 2).sum() / (want**2).sum()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("synth", type=Path, help="the synth output directory (its oracle.json)")
    p.add_argument("runs", nargs="+", help="train run directories on that set")
    p.add_argument("--samples", type=int, default=256, help="validation samples averaged over")
    a = p.parse_args()
    settings = json.loads((a.synth / ORACLE).read_text())["settings"]
    if settings.get("cross") != "ids" or not settings.get("cross_scale"):
        raise SystemExit(f"{a.synth / ORACLE}: no planted id-pair cross (synth cross=ids)")
    known = {k: v for k, v in settings.items() if k in SynthConfig.__dataclass_fields__}
    cfg = OmegaConf.merge(OmegaConf.structured(SynthConfig), known)
    planted = build_model(cfg, table_sizes(cfg))
    torch.set_num_threads(1)
    for run in a.runs:
        r = probe(run, planted, a.samples)
        print(
            f"{run}: corr {r['corr']:.3f}, slope {r['slope']:.3f}, explained {r['explained']:.3f}"
        )


if __name__ == "__main__":
    main()
