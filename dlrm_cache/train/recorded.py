"""What a checkpoint's tensors must be, by its ``meta.json``: the model its config describes
(``model.*``, ``optim.sparse.name``) over the tables of its dataset (``table_sizes``, the names).

Checked as a checkpoint is opened (the dense part) and as its tables are read, so a tensor that
is not the recorded model's (a file swapped from another run, a crafted or cut-down one) is one
line naming the file and the entry, never a ``load_state_dict`` or ``copy_`` traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..config.schemas import flatten
from ..data.format import DENSE_NAMES, SPARSE_NAMES
from ..embedding.base import SparseOptim
from ..files.atomic import one_line
from ..model.dcn import cross_shape
from ..model.dlrm import dense_shapes, dense_state_problem
from ..parallel.placement import parse_key

MODEL_KEYS = ("model.embedding_dim", "model.bottom_mlp", "model.top_mlp", "optim.sparse.name")


@dataclass
class RecordedModel:
    dim: int
    dense: dict[str, tuple[int, ...]]  # the dense state dict's shapes
    sizes: dict[str, int]  # table name -> rows
    optim: SparseOptim

    @classmethod
    def of(cls, meta: dict[str, Any]) -> RecordedModel | None:
        """The model ``meta`` (a schema-checked meta.json) records; None where it records none
        (the commands refuse such a checkpoint, naming what is missing).  ValueError: it records
        one that cannot be (the message says why, for the caller to name the file)."""
        config, dataset = flatten(meta["config"]), meta["dataset"]
        if any(k not in config for k in MODEL_KEYS) or "table_sizes" not in dataset:
            return None
        sizes = dataset["table_sizes"]
        names = dataset.get("sparse_names", SPARSE_NAMES[: len(sizes)])
        try:
            dim = int(config["model.embedding_dim"])
            dense = dense_shapes(
                len(dataset.get("dense_names", DENSE_NAMES)),
                len(names),
                dim,
                list(config["model.bottom_mlp"]),
                list(config["model.top_mlp"]),
                cross_shape(config, "model."),
            )
            return cls(
                dim, dense, dict(zip(names, sizes, strict=True)), SparseOptim(config[MODEL_KEYS[3]])
            )
        except (TypeError, ValueError) as e:
            raise ValueError(f"its config or dataset is not a model's ({one_line(e)})") from None

    def dense_problem(self, state: Any) -> str | None:
        """What keeps ``state`` (dense.pt's ``model``) from being this model's dense part."""
        return dense_state_problem(state, self.dense)

    def table_problem(self, key: str, value: Any) -> str | None:
        """What is wrong with entry ``key`` of a tables file (``C3.weight``, ``C3:0-500.momentum1``)
        holding ``value``: not a float32 tensor of the shape this model gives it; None if right."""
        if not isinstance(value, torch.Tensor):
            return f"holds no tensor {key} though meta.json says so"
        table, lo, hi, field = parse_key(key)
        rows = self.sizes.get(table)
        if rows is None:
            return f"holds {key}, a table meta.json's dataset does not have"
        lo, hi = lo or 0, rows if hi is None else hi
        if not 0 <= lo < hi <= rows:
            return f"holds {key}, rows outside the table's {rows}"
        want = self.optim.field_shapes(hi - lo, self.dim).get(field)
        if want is None:
            return f"holds {key}, an entry optim.sparse.name={self.optim.name} does not have"
        if tuple(value.shape) != want or value.dtype != torch.float32:
            dtype = str(value.dtype).removeprefix("torch.")
            return (
                f"{key} is {dtype} {list(value.shape)} but meta.json makes it float32 {list(want)}"
            )
        return None
