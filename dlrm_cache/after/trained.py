"""A trained run's checkpoint as a model for inference (shared by `predict` and `export`).

Checkpoints hold full tables by name whatever the placement or the number of ranks that wrote them
(see :mod:`dlrm_cache.train.checkpoint`), so a model trained with host, hbm, uvm_cache or
freq_cache tables, on one rank or N, is rebuilt the same way here: the run's DLRM with read-only
tables (:class:`FrozenTables`) memory-mapped from the checkpoint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from ..config.choices import Pooling
from ..config.schemas import Precision, flatten
from ..data.format import MANIFEST, Manifest
from ..embedding.base import EmbeddingBackend, SparseOptim, TableSpec, pooled
from ..model.dcn import cross_shape
from ..model.dlrm import DLRM
from ..rundir.records import hydra_cwd
from ..train.best import Chosen, choose_checkpoint
from ..train.saved import Checkpoint


class FrozenTables(EmbeddingBackend):
    """Read-only tables for inference, on the host: each sample's ids of a feature (any number,
    0 included) select rows that are summed (the model's :meth:`~EmbeddingBackend.pool` takes
    the mean where it pools by mean).

    Pooling one row is that row, so one-hot lookups equal every training placement's bit for
    bit; a longer bag equals them up to float32 summation order.
    """

    def __init__(
        self,
        tables: list[TableSpec],
        weights: dict[str, torch.Tensor],
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__(tables, SparseOptim("sgd"))
        self.weights = [weights[f"{t.name}.weight"] for t in tables]  # on the host
        self.dim = tables[0].dim
        self.device = torch.device(device)  # where the pooled rows go (the dense part's device)

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        b, f = features.stride(), len(self.weights)
        values = features.values().to("cpu", torch.long)
        offsets = features.offsets().to("cpu", torch.long)
        if offsets.numel() != b * f + 1:
            raise ValueError(
                f"FrozenTables: a batch of {b} samples of {f} features needs {b * f + 1} "
                f"offsets, got {offsets.numel()}"
            )
        pooled_rows = [
            self._bags(w, values, offsets[j * b : (j + 1) * b + 1])
            for j, w in enumerate(self.weights)
        ]
        return pooled(features, torch.cat(pooled_rows, dim=1).to(self.device), self.dim)

    @staticmethod
    def _bags(weight: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Per bag (``offsets``: its ``B + 1`` bounds in ``values``), the sum of its rows."""
        lo = int(offsets[0])
        ids = values[lo : int(offsets[-1])]
        return torch.nn.functional.embedding_bag(ids, weight, offsets[:-1] - lo, mode="sum")

    def set_learning_rate(self, lr: float) -> None:
        raise RuntimeError("FrozenTables are read-only (inference)")

    def export_tables(self) -> dict[str, torch.Tensor]:
        return {f"{t.name}.weight": w for t, w in zip(self.tables, self.weights)}


@dataclass
class Trained:
    """A checkpoint, the dataset it was trained on, and (after :meth:`model`) the model."""

    checkpoint: Checkpoint
    chosen: Chosen  # which of the run's checkpoints it is (best, last, or the one named)
    config: dict[str, Any]  # the run's config, flattened (``model.embedding_dim``, ...)
    data_path: Path
    manifest: Manifest

    def tables(self) -> list[TableSpec]:
        dim = int(self.config["model.embedding_dim"])
        return [
            TableSpec(n, rows, dim)
            for n, rows in zip(self.manifest.sparse_names, self.manifest.table_sizes)
        ]

    def weights(self) -> dict[str, torch.Tensor]:
        """Full tables (memory-mapped where the checkpoint stores them whole)."""
        return self.checkpoint.tables([f"{t.name}.weight" for t in self.tables()])

    def pooling(self) -> Pooling:
        """The run's ``model.pooling`` (sum for runs made before the option existed)."""
        return Pooling(self.config.get("model.pooling", Pooling.sum.value))

    def model(self, device: torch.device) -> DLRM:
        """The run's DLRM in eval mode, dense part on ``device``, tables on the host."""
        model = DLRM(
            FrozenTables(self.tables(), self.weights(), device),
            num_dense=len(self.manifest.dense_names),
            embedding_dim=int(self.config["model.embedding_dim"]),
            bottom_mlp=list(self.config["model.bottom_mlp"]),
            top_mlp=list(self.config["model.top_mlp"]),
            device=device,
            precision=Precision(self.config.get("precision", "fp32")),
            cross=cross_shape(self.config, "model."),
            pooling=self.pooling(),
        )
        model.load_dense_state_dict(self.checkpoint.dense["model"])
        return model.eval()


def open_trained(
    checkpoint: str, data: str | None = None, data_key: str = "dataset", which: str = "auto"
) -> Trained:
    """The checkpoint ``checkpoint`` names (a run directory: its best or its final one as
    ``which`` says, see :func:`~..train.best.choose_checkpoint`), and the dataset it was trained on.

    ``data`` (default: the run's ``data.path``, see :func:`recorded_dataset`; ``data_key``: the
    option that names it, for messages) must be the dataset the checkpoint was trained on: the
    same statistics, table sizes and splits (its recorded identity), or the rows would mean other
    ids.
    """
    try:
        chosen = choose_checkpoint(checkpoint, which, "checkpoint", "which")
        path = chosen.path
    except FileNotFoundError:
        from ..rundir.records import is_run_dir

        jobs = sorted(p.name for p in Path(checkpoint).glob("*") if is_run_dir(p))
        if jobs:  # a -m sweep directory: which of its runs is for the user to say
            raise FileNotFoundError(
                f"checkpoint={checkpoint}: a sweep directory (runs {', '.join(jobs[:5])}"
                f"{', ...' if len(jobs) > 5 else ''}); name one of its runs, e.g. "
                f"checkpoint={Path(checkpoint) / jobs[0]}"
            ) from None
        raise FileNotFoundError(
            f"checkpoint={checkpoint}: no checkpoint there (a directory with meta.json), "
            "nor a run directory with a complete one"
        ) from None
    ckpt = Checkpoint(path)
    config = flatten(ckpt.config)
    missing = [
        k
        for k in ("model.embedding_dim", "model.bottom_mlp", "model.top_mlp", "data.path")
        if k not in config
    ]
    if missing or "model" not in ckpt.dense:
        raise ValueError(
            f"{path}: not a dlrm-cache training checkpoint "
            f"(no {missing[0] if missing else 'model'})"
        )
    if data is not None:
        data_path, named = Path(data).expanduser(), f"{data_key}={data}"
    else:
        data_path = recorded_dataset(ckpt, str(config["data.path"]), data_key)
        named = f"the run's data.path={config['data.path']} ({data_path})"
    manifest = Manifest.load(data_path, key=data_key)
    trained_on = flatten(ckpt.meta.get("dataset", {}))
    here = flatten(manifest.identity())
    if not trained_on:
        raise ValueError(
            f"{path / 'meta.json'}: records no dataset identity; "
            "not a dlrm-cache training checkpoint"
        )
    # both sides' keys: a key only one side has (the schema digest of a dataset built under a
    # user schema) differs too
    diff = [k for k in {**trained_on, **here} if trained_on.get(k) != here.get(k)]
    if "schema_digest" in diff:
        why = (
            "schema_digest differs: its dense transforms, hashes, multi-hot columns or moments"
            if "schema_digest" in trained_on
            else "the checkpoint records no schema_digest: written before datasets recorded it"
        )
        raise ValueError(
            f"{path}: trained on a dataset built under another schema than {named} ({why}); "
            f"point {data_key}= at the dataset the run was trained on"
        )
    if diff:
        raise ValueError(
            f"{path}: trained on another dataset than {named} ({', '.join(diff[:3])} "
            f"differ); point {data_key}= at the dataset the run was trained on"
        )
    return Trained(ckpt, chosen, config, data_path, manifest)


def recorded_dataset(ckpt: Checkpoint, data_path: str, data_key: str) -> Path:
    """Where the run's ``data.path`` is now: the first of these that holds a dataset.

    1. As the run saw it: an absolute path, or a relative one from the directory the run was
       started in (the checkpoint's recorded ``cwd``, else Hydra's record of the run,
       ``.hydra/hydra.yaml``);
    2. a relative one from here;
    3. where the dataset is if it kept its place relative to the run directory (the two moved or
       were copied together): the recorded path seen from the recorded ``run_dir``, from where
       the run directory is now;
    4. a relative one from the run directory's parent.

    None holds one: a one-line error naming ``data_key=``, where the dataset can be named.
    """
    p = Path(data_path).expanduser()
    run_now = ckpt.path.parent.parent
    cwd = ckpt.meta.get("cwd") or hydra_cwd(run_now)
    then = p if p.is_absolute() else Path(cwd) / p if isinstance(cwd, str) else None
    run_then = ckpt.config.get("run_dir")
    tried = [then]
    if not p.is_absolute():
        tried.append(p)
    if then is not None and isinstance(run_then, str):
        tried.append(Path(os.path.normpath(run_now.absolute() / os.path.relpath(then, run_then))))
    if not p.is_absolute():
        tried.append(run_now.parent / p)
    candidates = list(dict.fromkeys(c for c in tried if c is not None))
    for candidate in candidates:
        if (candidate / MANIFEST).is_file():
            return candidate
    raise FileNotFoundError(
        f"the run's data.path={data_path}: no dataset there (looked in "
        f"{', '.join(str(c) for c in candidates)}); name the dataset the run was trained on "
        f"with {data_key}=PATH"
    )
