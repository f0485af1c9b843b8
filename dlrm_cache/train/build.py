"""Building a training run from its composed config: the embedding placement (:mod:`.embeddings`),
the model, the dense optimizer, the data streams and the run directory's log; and restoring a
checkpoint into it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from ..console.say import Progress
from ..data.format import Manifest
from ..data.loader import ShardStream, batches_per_epoch, check_batch_split
from ..embedding.base import EmbeddingBackend
from ..files.atomic import one_line
from ..model.dcn import cross_shape
from ..model.dlrm import DLRM
from ..parallel.dist import DistInfo, agree_on_config, agree_on_data
from ..parallel.placement import Shard
from ..rundir.records import CHECKPOINT, EVAL, JsonlLog, open_log
from .best import Tracker
from .checkpoint import checkpoint_meta, save_checkpoint, step_dir
from .claim import claim_run_dir
from .embeddings import build_embeddings
from .evaluate import eval_batches, evaluate
from .optim import build_dense_optimizer, load_dense_state
from .preflight import check_dense_memory
from .resume import check_resume_trains, open_resume, resumed_state
from .saved import Checkpoint
from .signals import StopAgreement
from .step import set_matmul_precision

log = logging.getLogger(__name__)


@dataclass
class TrainingRun:
    """What one training run is made of (built by :func:`build_run`)."""

    cfg: DictConfig
    info: DistInfo
    device: torch.device
    run_dir: Path
    manifest: Manifest
    embeddings: EmbeddingBackend
    model: DLRM
    net: torch.nn.Module  # the model, DDP-wrapped under torchrun
    opt: torch.optim.Optimizer
    train_stream: ShardStream
    val_stream: ShardStream
    total_steps: int
    log: JsonlLog
    resume: Checkpoint | None  # cfg.resume, checked against this run before anything was built
    best: Tracker  # the best val evaluation so far (monitor.*), and the evaluations since it
    evaluations: dict[tuple[int, str], dict[str, float]]  # (step, split) -> result, this run's
    resume_note: str  # which checkpoint of the run resume= named was taken ("last: step 20")
    owned: list[Shard] | None = None  # this rank's embedding shards, which its loader keeps
    # asked after every step and evaluation batch: the stop signal all ranks agree on (set by the
    # training loop, which closes it)
    stop: StopAgreement | None = None
    saved: int = -1  # the step of the newest checkpoint this invocation saved

    def checkpoint(self, step: int, best_only: bool = False) -> None:
        """A checkpoint of ``step`` (collective); ``best_only``: saved for a best evaluation
        alone (:func:`.best.prune` may remove it)."""
        self.embeddings.flush()  # cached rows and their optimizer state back into the full tables
        dense = {"model": self.model.dense_state_dict(), "optimizer": self.opt.state_dict()}
        # recorded first: a run resumed from this checkpoint keeps the records up to this one.  A
        # resume that did no step saves its own checkpoint again (putting an interrupted replace in
        # order): its record is already the last one kept.
        again = (
            self.resume is not None
            and self.resume.step == step
            and self.resume.log_records(self.run_dir) is not None
        )
        if not again:
            only = {"best_only": True} if best_only else {}
            self.log.write(CHECKPOINT, step=step, path=str(step_dir(self.run_dir, step)), **only)
        meta = checkpoint_meta(self.cfg, self.manifest, self.info.world_size, self.log.records)
        save_checkpoint(
            self.run_dir, step, dense, self.embeddings.export_tables(), self.info.rank, meta
        )
        self.saved = step

    def has_checkpoint(self, step: int) -> bool:
        """A complete checkpoint of ``step`` is the run's: saved now, or resumed from here."""
        r = self.resume
        here = r is not None and r.step == step and r.log_records(self.run_dir) is not None
        return self.saved == step or here

    def evaluate(self, step: int, split: str = "val") -> dict[str, float]:
        stream = (
            self.val_stream if split == "val" else self.stream(split, self.cfg.data.eval_batch_size)
        )
        result = evaluate(
            self.net,
            stream,
            self.device,
            self.cfg.eval_batches,
            self.cfg.data.prefetch_batches,
            self.embeddings,
            self.stop.requested if self.stop is not None else None,
            progress=Progress(
                eval_batches(stream, self.cfg.eval_batches),
                f"step {step}: {split} evaluation",
                bar=self.cfg.progress,
                enabled=self.info.is_main,
            ),
        )
        self.log.write(EVAL, step=step, split=split, **result)
        self.evaluations[(step, split)] = result
        return result

    def stream(self, split: str, batch_size: int, shuffle: bool = False) -> ShardStream:
        return make_stream(
            self.cfg, self.manifest, self.info, self.device, split, batch_size, shuffle, self.owned
        )


def make_stream(
    cfg: DictConfig,
    manifest: Manifest,
    info: DistInfo,
    device: torch.device,
    split: str,
    batch_size: int,
    shuffle: bool = False,
    owned: list[Shard] | None = None,
) -> ShardStream:
    """Training batches drop the last partial batch; evaluation keeps every row.  ``owned``: this
    rank's embedding shards when they are sharded (its batches then hold their ids for all rows)."""
    train = split == "train"
    return ShardStream(
        cfg.data.path,
        manifest,
        split,
        batch_size,
        shuffle,
        cfg.seed,
        info.rank,
        info.world_size,
        drop_last=train,
        key="data.batch_size" if train else "data.eval_batch_size",
        pin=device.type == "cuda",
        shards=owned,
    )


def load_dataset(cfg: DictConfig, info: DistInfo) -> Manifest:
    """``data.path``'s manifest, its shards checked; under torchrun every rank's the same
    dataset (its identity and its shards' footers), or every rank fails naming data.path."""
    data_path = Path(cfg.data.path)
    splits = ["train", "val", "test"] if cfg.test else ["train", "val"]
    try:
        manifest = Manifest.load(data_path)
        if cfg.test and "test" not in manifest.splits:  # found now, not silently at the end
            raise ValueError(
                f"test=true: {data_path} has no test split (has {', '.join(manifest.splits)}); "
                "train without test=true, or preprocess the data with one"
            )
        identity: dict[str, Any] | str = {
            **manifest.identity(),
            "shard_footers": manifest.check_shards(data_path, splits),
        }
    except (ValueError, OSError) as e:
        if not info.distributed:
            raise
        identity = one_line(e)
    agree_on_data(identity, "data.path", str(cfg.data.path), info)
    return manifest


def steps_per_epoch(cfg: DictConfig, manifest: Manifest) -> int:
    """Training steps of one epoch: the train stream's batches, known before it is made (it drops
    the last partial one, see :func:`make_stream`)."""
    steps = batches_per_epoch(manifest.splits["train"].rows, cfg.data.batch_size, drop_last=True)
    if steps == 0:
        raise ValueError(
            f"data.batch_size={cfg.data.batch_size}: larger than the training split "
            f"({manifest.splits['train'].rows} rows of {cfg.data.path})"
        )
    return steps


def planned_steps(cfg: DictConfig, manifest: Manifest) -> int:
    """The step the run ends at: ``epochs`` epochs, or ``max_steps`` if it comes first."""
    total = steps_per_epoch(cfg, manifest) * cfg.epochs
    return min(total, cfg.max_steps) if cfg.max_steps >= 0 else total


def build_run(cfg: DictConfig, device: torch.device, info: DistInfo) -> TrainingRun:
    run_dir = Path(agree_on_config(cfg, info))
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    data_path = Path(cfg.data.path)
    manifest = load_dataset(cfg, info)
    check_dense_memory(cfg, manifest, device, info)
    total_steps = planned_steps(cfg, manifest)
    # before the run dir is claimed: a resume into it sets aside what came after its checkpoint
    check_batch_split(cfg.data.batch_size, info.world_size)
    ckpt, chosen = open_resume(cfg, manifest) if cfg.resume else (None, None)
    resumed = resumed_state(cfg, run_dir, ckpt, info)
    if ckpt is not None:
        check_resume_trains(cfg, steps_per_epoch(cfg, manifest), ckpt, total_steps, resumed)
        ckpt.log_records(run_dir)  # checked against the run's log before anything is moved
    claim_run_dir(
        run_dir, ckpt.path if ckpt else None, cfg.overwrite, info, cfg
    )  # one run per run dir
    torch.manual_seed(cfg.seed)
    embeddings, owned = build_embeddings(cfg, manifest, data_path, device, info)
    model = DLRM(
        embeddings,
        num_dense=len(manifest.dense_names),
        embedding_dim=cfg.model.embedding_dim,
        bottom_mlp=list(cfg.model.bottom_mlp),
        top_mlp=list(cfg.model.top_mlp),
        device=device,
        precision=cfg.precision,
        compile=cfg.compile,
        cross=cross_shape(cfg.model),
        pooling=cfg.model.pooling,
    )
    set_matmul_precision(cfg.precision, device)
    opt = build_dense_optimizer(cfg, model.dense_parameters(), device)
    # Dense layers are data-parallel: DDP averages their gradients over ranks every step.
    net: torch.nn.Module = model
    if info.distributed:
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    train_stream = make_stream(
        cfg, manifest, info, device, "train", cfg.data.batch_size, cfg.data.shuffle, owned
    )
    val_stream = make_stream(
        cfg, manifest, info, device, "val", cfg.data.eval_batch_size, owned=owned
    )
    keep = resumed.keep
    from ..rundir.tensorboard import attach as attach_tensorboard
    from ..rundir.tensorboard import cut_back as cut_back_tensorboard

    if keep is not None and info.is_main:  # before the log is cut: its records say what to keep
        cut_back_tensorboard(run_dir, keep)
    log = open_log(run_dir, enabled=info.is_main, keep=keep)
    attach_tensorboard(log, cfg.logger.tensorboard, run_dir)
    return TrainingRun(
        cfg,
        info,
        device,
        run_dir,
        manifest,
        embeddings,
        model,
        net,
        opt,
        train_stream,
        val_stream,
        total_steps,
        log,
        ckpt,
        resumed.tracker,
        resumed.evaluations,
        chosen.note if chosen else "",
        owned,
    )


def restore(run: TrainingRun) -> int:
    """Load the checkpoint ``cfg.resume`` named into the run; the step to continue from (0: a fresh run)."""
    ckpt = run.resume
    if ckpt is None:
        return 0
    run.model.load_dense_state_dict(ckpt.dense["model"])
    load_dense_state(run.opt, ckpt.dense["optimizer"])
    if run.embeddings.state_keys():
        run.embeddings.import_tables(ckpt.tables(run.embeddings.state_keys()))
    if run.info.is_main:
        note = f" ({run.resume_note})" if run.resume_note else ""
        log.info("resumed from %s%s at step %d", ckpt.path, note, ckpt.step)
    return ckpt.step
