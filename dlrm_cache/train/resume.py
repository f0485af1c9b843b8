"""``resume=``: the checkpoint a run continues from, checked against the run before anything is built.

A resumed run must share with its checkpoint what its state depends on (the model's shapes, the
optimizers whose state the checkpoint holds, the data position) and its dataset's identity;
everything else may change.  A difference is refused in one line naming every differing key: the
state would not fit, or would silently be dropped or misread.  A resume must train: one that
would not (its checkpoint is the end of a finished run, or past this run's end) is refused in
one line naming the step and the key to raise (:func:`check_resume_trains`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from ..config.choices import Interaction, Pooling
from ..config.schemas import config_dict, flatten
from ..data.format import Manifest
from ..files.layout import CKPT_META
from ..parallel.dist import DistInfo
from ..rundir.records import BEST, EVAL, SUMMARY, logged_records, read_summary
from .best import Chosen, Monitor, Tracker, choose_checkpoint
from .checkpoint import run_and_folder
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


def open_resume(cfg: DictConfig, manifest: Manifest) -> tuple[Checkpoint, Chosen]:
    """The checkpoint ``resume=`` names (of a run directory: its ``resume_which``), opened and
    checked against this run before anything is built: a different model, optimizer, data
    position or dataset is refused, naming every differing key (its state would not fit, or
    would silently be dropped or misread)."""
    chosen = choose_checkpoint(str(cfg.resume), str(cfg.resume_which), "resume", "resume_which")
    ckpt = Checkpoint(chosen.path)
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
    return ckpt, chosen


def _pick(config: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    flat = flatten(config)
    return {k: flat[k] for k in keys if k in flat}


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


@dataclass
class Resumed:
    """What a run continues from, read from its records (rank 0's, the same on every rank)."""

    tracker: Tracker  # the best evaluation so far and the evaluations since (monitor.*)
    keep: int | None = None  # the records its log keeps (None: a new log, or no resume)
    evaluations: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)
    finished: Path | None = None  # the checkpoint's run's summary.json, where it describes it


def resumed_state(
    cfg: DictConfig, run_dir: Path, ckpt: Checkpoint | None, info: DistInfo
) -> Resumed:
    """Rank 0 reads the records a run resumed from ``ckpt`` continues (in its own run directory:
    the records its log keeps, from which the best so far, the evaluations since it and the
    evaluations of the checkpoint's step), and every rank gets them."""
    out = [_read_resumed(cfg, run_dir, ckpt) if info.is_main else None]
    if info.distributed:
        import torch.distributed as dist

        dist.broadcast_object_list(out, src=0)
    assert out[0] is not None
    return out[0]


def _read_resumed(cfg: DictConfig, run_dir: Path, ckpt: Checkpoint | None) -> Resumed:
    monitor = Monitor.of(config_dict(cfg))
    fresh = Tracker(monitor, int(cfg.monitor.patience))
    if ckpt is None:
        return Resumed(fresh)
    finished = _summarized(ckpt)
    keep = ckpt.log_records(run_dir)
    if keep is None:  # a new run from another run's checkpoint: a new log
        return Resumed(fresh, finished=finished)
    records = logged_records(run_dir)
    # the evaluations of the checkpoint's step that followed its save (the final ones) stay
    while keep < len(records) and _evaluates(records[keep], ckpt.step):
        keep += 1
    kept = [r for r in records[:keep] if r is not None]
    evaluations = {
        (int(r["step"]), str(r["split"])): {
            k: v for k, v in r.items() if k not in ("kind", "time", "step", "split")
        }
        for r in kept
        if r.get("kind") == EVAL
    }
    tracker = Tracker.resumed(monitor, fresh.patience, kept, run_and_folder(run_dir)[1])
    return Resumed(tracker, keep, evaluations, finished)


def _evaluates(record: dict[str, Any] | None, step: int) -> bool:
    return record is not None and record.get("kind") in (EVAL, BEST) and record.get("step") == step


def _summarized(ckpt: Checkpoint) -> Path | None:
    """The summary.json of the checkpoint's run when it describes the checkpoint's step (the run
    ended there, evaluated); an unreadable one describes nothing (the resume writes it anew)."""
    run = ckpt.path.parent.parent
    try:
        summary = read_summary(run)
    except (ValueError, OSError):
        return None
    return run / SUMMARY if summary is not None and summary.get("steps") == ckpt.step else None


def check_resume_trains(
    cfg: DictConfig, per_epoch: int, ckpt: Checkpoint, total_steps: int, resumed: Resumed
) -> None:
    """A resume that would train no step is refused, naming the step and the key that ends it:
    a checkpoint past the run's end (the run would report the checkpoint's later step as its own
    end), or the end of a finished run (its final evaluation done: the resume would only move
    its summary aside).  A run stopped before that evaluation (a signal) resumes to do it."""
    epochs = f"epochs={cfg.epochs} ({per_epoch} steps each)"
    limited = 0 <= cfg.max_steps < per_epoch * cfg.epochs
    key = f"max_steps={cfg.max_steps}" if limited else epochs
    if ckpt.step > total_steps:
        raise ValueError(
            f"{key}: this run ends at step {total_steps}, but the checkpoint resume= continues "
            f"from ({ckpt.path}) is at step {ckpt.step}; resume with a run that ends at step "
            f"{ckpt.step} or later"
        )
    if resumed.finished is None:
        return
    head = f"resume={cfg.resume}: nothing to train"
    if ckpt.step == total_steps:
        if limited:
            raise_ = f"raise max_steps (e.g. max_steps={cfg.max_steps + per_epoch})"
        else:
            raise_ = f"raise epochs (e.g. epochs={cfg.epochs + 1})"
            if 0 <= cfg.max_steps <= ckpt.step:
                raise_ += f" and max_steps (now {cfg.max_steps})"
        raise ValueError(
            f"{head}: the run ended at step {ckpt.step}, the end {key} gives, and was evaluated "
            f"({resumed.finished}); {raise_} to train on"
        )
    if resumed.tracker.exhausted:
        raise ValueError(
            f"{head}: the run stopped early at step {ckpt.step} "
            f"({resumed.tracker.why_stopped()}); raise monitor.patience (now "
            f"{cfg.monitor.patience}; 0: no early stopping) to train on"
        )
