"""``resume=``: the checkpoint a run continues from, checked against the run before anything is built.

A resumed run must share with its checkpoint what its state depends on (the model's shapes, the
optimizers whose state the checkpoint holds, the data position) and its dataset's identity;
everything else may change.  A difference is refused in one line naming every differing key: the
state would not fit, or would silently be dropped or misread.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from ..choices import Interaction, Pooling
from ..config import config_dict, flatten
from ..data.format import Manifest
from ..layout import CKPT_META
from .checkpoint import find_checkpoint
from .optim import MOMENTUM_OPTIMIZERS
from .saved import Checkpoint

# What a resumed run must share with its checkpoint: the model (its shapes, and what it computes
# from them: the interaction, the pooling of a feature's ids), the optimizers whose state it holds
# (and the dense optimizer's settings, which loading its state restores; momentum where it takes
# one), and what fixes the data position (global batch k of epoch e).  Everything else (learning
# rates, schedules, embedding placement, number of ranks, evaluation, logging) may change on resume.
RESUME_KEYS = (
    "model.embedding_dim",
    "model.bottom_mlp",
    "model.top_mlp",
    "model.interaction",
    "model.dcn_num_layers",
    "model.dcn_low_rank_dim",
    "model.pooling",
    "optim.sparse.name",
    "optim.dense.name",
    "optim.dense.weight_decay",
    "optim.dense.momentum",
    "data.batch_size",
    "data.shuffle",
    "seed",
)

# the cross network's shape: compared only between two DCN models
CROSS_KEYS = ("model.dcn_num_layers", "model.dcn_low_rank_dim")
# keys a checkpoint written before they existed lacks: the value such a checkpoint was trained
# with (None: compared only where it records them)
LATER_KEYS = {
    "model.interaction": Interaction.dot.value,
    CROSS_KEYS[0]: None,
    CROSS_KEYS[1]: None,
    "model.pooling": Pooling.sum.value,
}

# ...and what must be recorded of its dataset (newer identity keys may be absent from older checkpoints)
REQUIRED_DATASET_KEYS = ("dataset.table_sizes", "dataset.stats_digest")


def open_resume(cfg: DictConfig, manifest: Manifest) -> Checkpoint:
    """The checkpoint ``resume=`` names, opened and checked against this run before anything is
    built: a different model, optimizer, data position or dataset is refused, naming every
    differing key (its state would not fit, or would silently be dropped or misread)."""
    ckpt = Checkpoint(find_checkpoint(str(cfg.resume)))
    ckpt.check_tables()
    ckpt.check_optimizer()
    now = {**_pick(config_dict(cfg), RESUME_KEYS), **flatten(manifest.identity(), "dataset.")}
    then = {**_pick(ckpt.config, RESUME_KEYS), **flatten(ckpt.meta["dataset"], "dataset.")}
    for k, before in LATER_KEYS.items():  # written before the key: trained with its value then
        if before is not None:
            then.setdefault(k, before)
    if Interaction.dot.value in (now.get("model.interaction"), then["model.interaction"]):
        for k in CROSS_KEYS:  # nothing to compare without a cross network
            now.pop(k, None), then.pop(k, None)
    required = [k for k in RESUME_KEYS if k not in LATER_KEYS]
    unknown = [k for k in (*required, *REQUIRED_DATASET_KEYS) if k not in then]
    if unknown:  # nothing to compare: the resume could not be checked
        raise ValueError(
            f"{ckpt.path / CKPT_META}: records no {unknown[0]} (of the run's config or its dataset); "
            "it cannot be checked against this run, resume from another checkpoint"
        )
    if not {now["optim.dense.name"], then["optim.dense.name"]} & {*MOMENTUM_OPTIMIZERS}:
        del now["optim.dense.momentum"], then["optim.dense.momentum"]  # neither one takes it
    if "dataset.schema_digest" in then:  # trained under a user schema: this dataset must be too
        now.setdefault("dataset.schema_digest", "")
    diff = [k for k in now if k in then and then[k] != now[k]]
    if diff:
        raise ValueError(
            f"resume={ckpt.path}: the checkpoint was written with "
            + ", ".join(f"{k}={_short(then[k])} (now {_short(now[k])})" for k in diff)
            + "; resume with the same values, or start a new run"
        )
    return ckpt


def _pick(config: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    flat = flatten(config)
    return {k: flat[k] for k in keys if k in flat}


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."
