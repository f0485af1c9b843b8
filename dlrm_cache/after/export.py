"""`dlrm-cache export`: a trained run as torchrec's own DLRM, the door to torchrec's sharding,
inference and serving tools.

The output directory holds

* ``state_dict.pt``: a state dict that ``torchrec.models.dlrm.DLRM`` built with an
  ``EmbeddingBagCollection`` of one table per feature (named after the feature, pooled by the run's
  ``model.pooling``: torchrec's ``PoolingType.SUM`` or ``MEAN``) loads with ``strict=True``; plain tensors, so ``torch.load(..., weights_only=True)`` reads it;
* ``dlrm.json``: the constructor arguments (``dense_in_features``, ``dense_arch_layer_sizes``,
  ``over_arch_layer_sizes``, the tables as ``EmbeddingBagConfig`` fields) and what the inputs are
  (feature order, dense transform, ids as frequency ranks of the named dataset).

:func:`load_torchrec_dlrm` builds the model from the directory.  The key names are read off a
torchrec DLRM of the same shape built on the meta device (no memory), so they are whatever the
installed torchrec expects.  dlrm-cache's DLRM is torchrec's DenseArch/OverArch with an interaction
that gives InteractionArch's values, so the exported model's logits are the run's (the dense part
computed in fp32: a run trained with ``precision=bf16`` then differs by bf16 rounding).  A run
with ``model.interaction=dcn`` is written as torchrec's ``DLRM_DCN`` (``dlrm.json`` adds its
``dcn_num_layers`` and ``dcn_low_rank_dim``; the cross network's keys are the same on both sides).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from ..data.schema import LIST_SEPARATOR, Schema
from ..files.atomic import WriteError, file_id, one_line, out_of_room, replace_dir, torch_save
from ..files.outputs import check_output, reported_if_written, stop_on_signals
from ..model.dcn import cross_shape
from .config import require
from .trained import Trained, open_trained

STATE_DICT = "state_dict.pt"
ARGS = "dlrm.json"
_TABLES_PREFIX = "sparse_arch.embedding_bag_collection.embedding_bags."


def constructor_args(trained: Trained) -> dict[str, Any]:
    """``DLRM(...)``'s arguments (the collection as its tables' ``EmbeddingBagConfig`` fields)."""
    dim = int(trained.config["model.embedding_dim"])
    m = trained.manifest
    return {
        "dense_in_features": len(m.dense_names),
        "dense_arch_layer_sizes": [int(x) for x in trained.config["model.bottom_mlp"]] + [dim],
        "over_arch_layer_sizes": [int(x) for x in trained.config["model.top_mlp"]] + [1],
        "embedding_bag_collection": {
            "tables": [
                {
                    "name": name,
                    "embedding_dim": dim,
                    "num_embeddings": rows,
                    "feature_names": [name],
                    "pooling": trained.pooling().value.upper(),
                }
                for name, rows in zip(m.sparse_names, m.table_sizes)
            ],
        },
    }


def build_torchrec_dlrm(
    args: dict[str, Any], device: torch.device | str = "cpu"
) -> torch.nn.Module:
    """torchrec's DLRM from :func:`constructor_args`' dict (on ``meta``: shapes, no memory)."""
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    device = torch.device(device)
    tables = [
        EmbeddingBagConfig(
            name=t["name"],
            embedding_dim=t["embedding_dim"],
            num_embeddings=t["num_embeddings"],
            feature_names=list(t["feature_names"]),
            pooling=PoolingType[t["pooling"]],
        )
        for t in args["embedding_bag_collection"]["tables"]
    ]
    common = {
        "embedding_bag_collection": EmbeddingBagCollection(tables=tables, device=device),
        "dense_in_features": args["dense_in_features"],
        "dense_arch_layer_sizes": list(args["dense_arch_layer_sizes"]),
        "over_arch_layer_sizes": list(args["over_arch_layer_sizes"]),
        "dense_device": device,
    }
    if DCN_ARGS[0] in args:
        return build_torchrec_dlrm_dcn(args, common)
    return DLRM(**common)


# DLRM_DCN's arguments beyond DLRM's (the cross network's shape)
DCN_ARGS = ("dcn_num_layers", "dcn_low_rank_dim")


def dcn_args(trained: Trained) -> dict[str, int]:
    """What a run with the DCN-v2 interaction adds to :func:`constructor_args` (torchrec's
    ``DLRM_DCN`` arguments); nothing for dot interaction."""
    cross = cross_shape(trained.config, "model.")
    if cross is None:
        return {}
    return dict(zip(DCN_ARGS, (cross.num_layers, cross.low_rank_dim), strict=True))


def torchrec_class_name(args: dict[str, Any]) -> str:
    """The torchrec class :func:`build_torchrec_dlrm` builds from ``args``."""
    return "torchrec.models.dlrm." + ("DLRM_DCN" if DCN_ARGS[0] in args else "DLRM")


def build_torchrec_dlrm_dcn(args: dict[str, Any], common: dict[str, Any]) -> torch.nn.Module:
    """torchrec's DLRM_DCN: dlrm-cache's DcnInteraction has its values and state keys
    (``inter_arch.crossnet.*``), so the checkpoint's dense state maps one to one."""
    from torchrec.models.dlrm import DLRM_DCN

    return DLRM_DCN(**common, **{k: int(args[k]) for k in DCN_ARGS})


def torchrec_state_dict(trained: Trained, args: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The checkpoint under the key names of torchrec's DLRM with ``args``, every key filled."""
    ours = {
        k: v
        for k, v in trained.checkpoint.dense["model"].items()
        if DCN_ARGS[0] in args or not k.startswith("inter_arch.")
    }
    ours.update({_TABLES_PREFIX + k: v for k, v in trained.weights().items()})
    wanted = build_torchrec_dlrm(args, "meta").state_dict()
    out: dict[str, torch.Tensor] = {}
    for key, ref in wanted.items():
        if key in ours:
            value = ours.pop(key)
        elif key.endswith(
            "triu_indices"
        ):  # InteractionArch's index buffer (persistent in some versions)
            n = len(args["embedding_bag_collection"]["tables"]) + 1
            value = torch.triu_indices(n, n, offset=1)
        else:
            raise ValueError(f"{trained.checkpoint.path}: has nothing for torchrec's {key}")
        if tuple(value.shape) != tuple(ref.shape):
            raise ValueError(
                f"{trained.checkpoint.path}: {key} has shape {tuple(value.shape)}, "
                f"torchrec's DLRM wants {tuple(ref.shape)}"
            )
        out[key] = value.detach().to("cpu", ref.dtype).contiguous().clone()
    if ours:
        raise ValueError(f"{trained.checkpoint.path}: torchrec's DLRM has no {sorted(ours)[0]}")
    return out


def export(cfg: Any) -> Path:
    """Write ``cfg.output`` (a directory, replaced atomically) from ``cfg.checkpoint`` (and its
    dataset, ``cfg.dataset``); a stop (SIGINT, SIGTERM, an error) leaves no temporary directory."""
    require(cfg, checkpoint="runs/train/DATE/TIME", output="exported")
    made: list[tuple[int, int]] = []  # the temporary directory's device and inode, once made
    with reported_if_written(Path(str(cfg.output)).expanduser(), made), stop_on_signals():
        return _export(cfg, made)


def _export(cfg: Any, made: list[tuple[int, int]]) -> Path:
    trained = open_trained(str(cfg.checkpoint), cfg.dataset, "dataset", str(cfg.which))
    reads = [("checkpoint", trained.checkpoint.path), ("dataset", trained.data_path)]
    out = check_output(str(cfg.output), "output", reads)
    if out.exists() and not (out.is_dir() and set(os.listdir(out)) <= {STATE_DICT, ARGS}):
        raise FileExistsError(
            f"output={out}: exists and is not an export directory; choose another output"
        )
    args = constructor_args(trained)
    args.update(dcn_args(trained))
    meta = {
        "model": torchrec_class_name(args),
        "args": args,
        "inputs": inputs(trained),
        "output": "logits, shape [batch, 1]: probability = sigmoid(logit)",
        "checkpoint": str(trained.checkpoint.path),
        "step": trained.checkpoint.step,
        "which": trained.chosen.which,  # best | last | named
    }
    state = torchrec_state_dict(trained, args)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        raise PermissionError(
            f"output={out}: cannot create files in {out.parent} ({e.strerror})"
        ) from None
    made[:] = [file_id(tmp) or (-1, -1)]
    try:
        torch_save(state, tmp / STATE_DICT)
        (tmp / ARGS).write_text(json.dumps(meta, indent=2))
        replace_dir(tmp, out)
    except OSError as e:  # a full disk, a quota: one line naming the output and the file system
        why = out_of_room(e, out.parent) or one_line(e)
        shutil.rmtree(tmp, ignore_errors=True)
        raise WriteError(f"output={out}: not written ({why}); nothing was replaced") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = (out / STATE_DICT).stat().st_size
    print(
        f"export: {trained.checkpoint.path} (step {trained.checkpoint.step}, "
        f"{trained.chosen.note}) -> {out}/ "
        f"({STATE_DICT}: {size / 2**20:,.1f} MiB, {ARGS})"
    )
    return out


_FORMULAS = {
    "log1p": "log(1 + max(x, 0)), an empty field as 0",
    "none": "x as is, an empty field as 0",
    "standardize": "(x - mean) / std (the training split's, below), an empty field as 0 first",
}
_RAW_IDS = {
    "criteo": "the field's hex digits as a number",
    "text": "64-bit FNV-1a of the value's UTF-8 bytes, top bit cleared",
    "parquet": "a string or binary: 64-bit FNV-1a of its bytes, top bit cleared; an integer: "
    "itself, top bit cleared",
}


def inputs(trained: Trained) -> dict[str, Any]:
    """``dlrm.json``'s ``inputs``: the features in the model's order and how a raw value becomes
    a model input, from the dataset's schema (``schema.json``; Criteo's without one), so a server
    built from the export feeds the model what it was trained on.  Criteo's layout under one
    ``hash_modulus`` keeps its short form (one dense transform, one modulus)."""
    m = trained.manifest
    schema = Schema.load(trained.data_path, m.hash_modulus)
    out: dict[str, Any] = {"dense_features": m.dense_names}
    if schema.is_default:
        out["dense_transform"] = f"{_FORMULAS['log1p']} (as dlrm-cache preprocess)"
    out["sparse_features"] = m.sparse_names
    out["ids"] = (
        "rows of the dataset's frequency ranking (preprocess), any number per sample "
        "and feature (a jagged KeyedJaggedTensor), pooled as the tables' pooling says"
    )
    out["dataset"] = str(trained.data_path)
    out["stats_digest"] = m.stats_digest
    if schema.is_default:
        out["hash_modulus"] = m.hash_modulus
        return out
    out["dense"] = [
        {"name": n, "transform": t, "formula": _FORMULAS[t]}
        | (dict(zip(("mean", "std"), schema.moments[n])) if t == "standardize" else {})
        for n, t in zip(schema.dense, schema.transforms)
    ]
    out["sparse"] = [
        {"name": n, "hash_modulus": h, "multi_hot": n in m.multi_hot}
        for n, h in zip(schema.sparse, schema.hashes)
    ]
    kind = schema.format if schema.format in _RAW_IDS else "text"
    out["raw_ids"] = (
        f"format {schema.format}: {_RAW_IDS[kind]}; then mod the feature's hash_modulus "
        f"(0: none); then its row of the frequency ranking in the dataset's stats (ids below "
        f"min_count={m.min_count} or unseen in training: the table's last row). An empty "
        f"one-hot field (null) is a value of its own, an empty multi-hot field an empty list; "
        f"a multi-hot text field holds its values separated by '{LIST_SEPARATOR}'"
    )
    out["schema_digest"] = m.schema_digest
    return out


def load_torchrec_dlrm(
    directory: str | os.PathLike, device: torch.device | str = "cpu"
) -> torch.nn.Module:
    """torchrec's DLRM from an export directory, loaded with ``strict=True``, in eval mode."""
    d = Path(directory)
    args = json.loads((d / ARGS).read_text())["args"]
    model = build_torchrec_dlrm(args, "meta")
    state = torch.load(d / STATE_DICT, map_location=device, weights_only=True)
    model.load_state_dict(state, strict=True, assign=True)
    on_meta = [k for k, v in [*model.named_parameters(), *model.named_buffers()] if v.is_meta]
    if on_meta:  # a buffer torchrec does not save and builds on the model's device
        raise RuntimeError(f"{d / STATE_DICT}: loaded, but {on_meta[0]} has no value")
    return model.eval()
