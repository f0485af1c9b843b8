"""The training loop: one readable function from a composed config to a trained, evaluated model."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig
from tqdm import tqdm

from ..config import config_dict
from ..data.format import Manifest, atomic_write_text
from ..data.loader import ShardStream
from ..embedding.base import EmbeddingBackend, SparseOptim, TableSpec, initial_state
from ..model.dlrm import DLRM
from ..parallel.dist import DistInfo, agree_on_config, init_distributed, resolve_device, shutdown
from ..parallel.plan import Shard, available_host_bytes, plan_placement
from ..parallel.sharded import ShardedEmbeddings
from .checkpoint import Checkpoint, checkpoint_meta, open_resume, save_checkpoint, step_dir
from .pipeline import Pipeline
from .metrics import EvalMetrics, JsonlLog, StatsTotals, format_table
from .step import dense_optimizer, set_matmul_precision

log = logging.getLogger(__name__)


def embedding_factory(cfg: DictConfig, data_path: Path, device: torch.device):
    """``make(tables, shards) -> EmbeddingBackend`` for the configured placement.

    ``shards`` (row ranges of whole tables, see parallel/plan.py) give each local table its slice of
    the frequency statistics; ``None`` means the tables are whole.
    """
    optim = SparseOptim(cfg.optim.sparse.name, cfg.optim.sparse.lr, cfg.optim.sparse.eps)
    wants_counts = get_class(cfg.embedding._target_).uses_counts
    counts = None
    if wants_counts:
        from ..data.stats import load_counts

        counts = load_counts(data_path)
    # _partial_: hydra would turn the dataclass arguments into DictConfigs if passed through it
    partial = instantiate(cfg.embedding, _partial_=True)

    def make(tables: list[TableSpec], shards: list[Shard] | None = None) -> EmbeddingBackend:
        extra = {}
        if wants_counts:
            ranges = shards or [Shard(t.name, 0, t.num_rows, t.num_rows) for t in tables]
            extra["counts"] = {s.name: counts[s.table][s.lo : s.hi] for s in ranges}
        return partial(tables=tables, optim=optim, device=device, **extra)

    return make, optim, counts


def host_budget(cfg: DictConfig, local_ranks: int) -> float:
    """Host bytes per rank for embedding tables: host_memory_gb, else MemAvailable shared by the ranks."""
    return cfg.host_memory_gb * 2**30 if cfg.host_memory_gb > 0 else available_host_bytes(local_ranks)


def check_host_memory(cfg: DictConfig, tables: list[TableSpec], optim: SparseOptim) -> None:
    """Fail before allocating when the tables cannot fit in host memory (one process).

    Start-up holds the initial rows (built on the host) next to the placement's own host copy
    (every placement but hbm keeps all rows in host memory).
    """
    budget = host_budget(cfg, 1)
    table_bytes = sum(t.num_rows * optim.row_bytes(t.dim) for t in tables)
    copies = 1 if cfg.embedding._target_.endswith("HbmBackend") else 2
    if table_bytes * copies > budget:
        raise ValueError(
            f"host_memory_gb: the embedding tables take {table_bytes / 2**30:.2f} GiB "
            f"(x{copies} while they are initialized) but {budget / 2**30:.2f} GiB of host memory "
            "are available; use more processes (torchrun shards the tables), a smaller "
            "model.embedding_dim, preprocess with hash_modulus, or set host_memory_gb if the estimate is wrong"
        )


def build_embeddings(
    cfg: DictConfig, manifest: Manifest, data_path: Path, device: torch.device, info: DistInfo
) -> tuple[EmbeddingBackend, list[Shard] | None]:
    """The embeddings, and this rank's shards when they are sharded (its loader needs them)."""
    tables = [
        TableSpec(name, rows, cfg.model.embedding_dim)
        for name, rows in zip(manifest.sparse_names, manifest.table_sizes)
    ]
    make, optim, counts = embedding_factory(cfg, data_path, device)
    if not info.distributed:
        check_host_memory(cfg, tables, optim)
        embeddings = make(tables)
        embeddings.import_tables(initial_state(tables, optim, cfg.seed))
        return embeddings, None
    budget = host_budget(cfg, info.local_world_size)
    placement = plan_placement(tables, info.world_size, optim, budget, cfg.embedding.get("cache_ratio"),
                               counts, cfg.shard_rows_above)
    if info.is_main:
        log.info("embedding placement (%d ranks):\n%s", info.world_size,
                 placement.table(info.world_size, optim.row_bytes(cfg.model.embedding_dim)))
    sharded = ShardedEmbeddings(tables, optim, placement.shards, make, device)
    # the same initial rows as one process would have: whole tables from their seed, then sliced
    mine = placement.owned_by(info.rank)
    full = initial_state([t for t in tables if any(s.table == t.name for s in mine)], optim, cfg.seed)
    state = {}
    for s in mine:
        for field in ("weight", "momentum1"):
            if f"{s.table}.{field}" in full:
                state[f"{s.name}.{field}"] = full[f"{s.table}.{field}"][s.lo : s.hi]
    sharded.import_tables(state)
    return sharded, mine


def build_dense_optimizer(cfg: DictConfig, params, device: torch.device) -> torch.optim.Optimizer:
    o = cfg.optim.dense
    return dense_optimizer(o.name, params, device, o.lr, o.weight_decay, o.momentum)


def lr_scale(step: int, warmup_steps: int, decay_start: int = 0, decay_steps: int = 0) -> float:
    """Linear warm-up, constant, then polynomial decay to zero (MLPerf DLRM's schedule)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay_steps > 0 and step >= decay_start:
        return max(0.0, 1.0 - (step - decay_start) / decay_steps) ** 2
    return 1.0


def set_learning_rates(model: DLRM, opt: torch.optim.Optimizer, cfg: DictConfig, step: int) -> None:
    scale = lr_scale(step, cfg.optim.warmup_steps, cfg.optim.decay_start, cfg.optim.decay_steps)
    for group in opt.param_groups:
        group["lr"] = cfg.optim.dense.lr * scale
    model.embeddings.set_learning_rate(cfg.optim.sparse.lr * scale)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, stream: ShardStream, device: torch.device, max_batches: int = -1, depth: int = 4
) -> dict[str, float]:
    """Metrics over one pass of ``stream`` (training's pipeline, without the look-ahead)."""
    model.eval()
    metrics = EvalMetrics(device)
    with Pipeline(stream.batches(), stream.layout, device, depth=depth, train=False) as batches:
        for i, batch in enumerate(batches):
            if 0 <= max_batches <= i:
                break
            metrics.update(model(batch.dense, batch.sparse), batch.labels)
    model.train()
    return metrics.compute()


def find_oracle(manifest: Manifest) -> float | None:
    """The planted model's AUC, when the data came from `dlrm-cache synth`."""
    for src in manifest.sources[:1]:
        p = Path(src).parent / "oracle.json"
        if p.is_file():
            try:
                return float(json.loads(p.read_text())["oracle_auc"])
            except (KeyError, ValueError):
                return None
    return None


def seconds_since_process_start() -> float:
    """Wall time since this process started (the command, interpreter start-up included; 10 ms
    resolution, from the kernel's process start time)."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # no /proc (not Linux)
        return math.nan
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train and evaluate as ``cfg`` says; returns the final summary (also written to the run dir)."""
    # torchrun: one GPU per local rank
    device = resolve_device(cfg.device, int(os.environ.get("LOCAL_RANK", "0")))
    info: DistInfo = init_distributed(device, cfg.dist_timeout_s)
    try:
        return _train(cfg, device, info)
    finally:
        shutdown()


@dataclass
class Run:
    """What one training run is made of (built by :func:`setup`)."""

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
    owned: list[Shard] | None = None  # this rank's embedding shards, which its loader keeps

    def checkpoint(self, step: int) -> None:
        self.embeddings.flush()  # cached rows and their optimizer state back into the full tables
        dense = {"model": self.model.dense_state_dict(), "optimizer": self.opt.state_dict()}
        # recorded first: a run resumed from this checkpoint keeps the records up to this one.  A
        # resume that did no step saves its own checkpoint again (putting an interrupted replace in
        # order): its record is already the last one kept.
        again = self.resume is not None and self.resume.step == step \
            and self.resume.log_records(self.run_dir) is not None
        if not again:
            self.log.write("checkpoint", step=step, path=str(step_dir(self.run_dir, step)))
        meta = checkpoint_meta(self.cfg, self.manifest, self.info.world_size, self.log.records)
        save_checkpoint(self.run_dir, step, dense, self.embeddings.export_tables(), self.info.rank, meta)

    def evaluate(self, step: int, split: str = "val") -> dict[str, float]:
        stream = self.val_stream if split == "val" else self.stream(split, self.cfg.data.eval_batch_size)
        result = evaluate(self.net, stream, self.device, self.cfg.eval_batches, self.cfg.data.prefetch_batches)
        self.log.write("eval", step=step, split=split, **result)
        return result

    def stream(self, split: str, batch_size: int, shuffle: bool = False) -> ShardStream:
        return make_stream(self.cfg, self.manifest, self.info, self.device, split, batch_size,
                           shuffle, self.owned)


def make_stream(cfg: DictConfig, manifest: Manifest, info: DistInfo, device: torch.device, split: str,
                batch_size: int, shuffle: bool = False,
                owned: list[Shard] | None = None) -> ShardStream:
    """Training batches drop the last partial batch; evaluation keeps every row.  ``owned``: this
    rank's embedding shards when they are sharded (its batches then hold their ids for all rows)."""
    train = split == "train"
    return ShardStream(cfg.data.path, manifest, split, batch_size, shuffle, cfg.seed, info.rank, info.world_size,
                       drop_last=train, key="data.batch_size" if train else "data.eval_batch_size",
                       pin=device.type == "cuda", shards=owned)


def setup(cfg: DictConfig, device: torch.device, info: DistInfo) -> Run:
    run_dir = Path(agree_on_config(cfg, info))
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    data_path = Path(cfg.data.path)
    manifest = Manifest.load(data_path)
    manifest.check_shards(data_path, ["train", "val", "test"] if cfg.test else ["train", "val"])
    ckpt = open_resume(cfg, manifest) if cfg.resume else None
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
    )
    set_matmul_precision(cfg.precision, device)
    opt = build_dense_optimizer(cfg, model.dense_parameters(), device)
    # Dense layers are data-parallel: DDP averages their gradients over ranks every step.
    net: torch.nn.Module = model
    if info.distributed:
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    train_stream = make_stream(cfg, manifest, info, device, "train", cfg.data.batch_size,
                               cfg.data.shuffle, owned)
    val_stream = make_stream(cfg, manifest, info, device, "val", cfg.data.eval_batch_size,
                             owned=owned)
    steps_per_epoch = len(train_stream)
    if steps_per_epoch == 0:
        raise ValueError(
            f"data.batch_size={cfg.data.batch_size}: larger than the training split "
            f"({manifest.splits['train'].rows} rows of {data_path})"
        )
    total_steps = steps_per_epoch * cfg.epochs
    if cfg.max_steps >= 0:
        total_steps = min(total_steps, cfg.max_steps)
    log = JsonlLog(run_dir / "metrics.jsonl", enabled=info.is_main,
                   keep=ckpt.log_records(run_dir) if ckpt is not None else None)
    return Run(cfg, info, device, run_dir, manifest, embeddings, model, net, opt, train_stream, val_stream,
               total_steps, log, ckpt, owned)


def restore(run: Run) -> int:
    """Load the checkpoint ``cfg.resume`` named into the run; the step to continue from (0: a fresh run)."""
    ckpt = run.resume
    if ckpt is None:
        return 0
    run.model.load_dense_state_dict(ckpt.dense["model"])
    run.opt.load_state_dict(ckpt.dense["optimizer"])
    if run.embeddings.state_keys():
        run.embeddings.import_tables(ckpt.tables(run.embeddings.state_keys()))
    if run.info.is_main:
        log.info("resumed from %s at step %d", ckpt.path, ckpt.step)
    return ckpt.step


class Throughput:
    """Training samples per second between log lines: only time spent in steps counts.

    The clock is read after the device has finished the steps (the loss readback waits for them);
    evaluation and checkpoints in between are excluded with :meth:`pause`.
    """

    def __init__(self) -> None:
        self.seconds = 0.0  # training time so far
        self.samples = 0  # training samples so far (all ranks)
        self._t0 = time.perf_counter()
        self._samples0 = 0

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """The time spent inside the ``with`` block is not training time."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self._t0 += time.perf_counter() - t

    def lap(self) -> float:
        """Samples/s since the last lap (call after a device sync); adds the interval to ``seconds``."""
        now = time.perf_counter()
        elapsed = now - self._t0
        self.seconds += elapsed
        rate = (self.samples - self._samples0) / max(elapsed, 1e-9)
        self._t0, self._samples0 = now, self.samples
        return rate


def train_steps(run: Run, step: int) -> tuple[int, Throughput, StatsTotals, float]:
    """The step loop, from ``step`` to ``run.total_steps``: returns the last step, the throughput
    clock, the embedding counters and the seconds from the command to the first step."""
    cfg, info, model, embeddings = run.cfg, run.info, run.model, run.embeddings
    steps_per_epoch = len(run.train_stream)
    bar = tqdm(total=run.total_steps, initial=step, disable=not (cfg.progress and info.is_main),
               unit="step", dynamic_ncols=True)
    clock, totals, startup_s = Throughput(), StatsTotals(), math.nan
    interval = StatsTotals()  # the cache's counters since the last train record
    # summed on the device: a .item() per step would make the host wait for every step
    loss_sum, loss_n = torch.zeros((), device=run.device), 0
    model.train()
    while step < run.total_steps:
        epoch, start = divmod(step, steps_per_epoch)
        with Pipeline(run.train_stream.batches(epoch, start), run.train_stream.layout, run.device, embeddings,
                      cfg.data.prefetch_batches, cfg.data.analysis_threads) as pipeline:
            for batch in pipeline:
                if math.isnan(startup_s):
                    startup_s = seconds_since_process_start()
                    run.log.write("first_step", step=step, startup_s=startup_s)
                set_learning_rates(model, run.opt, cfg, step)
                logits = run.net(batch.dense, batch.sparse)
                loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
                run.opt.zero_grad(set_to_none=True)
                loss.backward()
                run.opt.step()
                step += 1
                clock.samples += batch.size * info.world_size
                loss_sum += loss.detach()
                loss_n += 1
                if step % cfg.log_every == 0 or step == run.total_steps:
                    mean_loss = loss_sum.item() / loss_n  # waits for the steps so far: then read the clock
                    rate = clock.lap()
                    interval.add(embeddings.stats())
                    emb_stats, interval = interval.result(), StatsTotals()
                    totals.add(emb_stats)
                    run.log.write("train", step=step, epoch=epoch, loss=mean_loss, samples_per_s=rate, **emb_stats)
                    bar.set_postfix(loss=f"{mean_loss:.4f}", samples_s=f"{rate:,.0f}")
                    loss_sum.zero_()
                    loss_n = 0
                bar.update(1)
                if cfg.eval_every and step % cfg.eval_every == 0 and step < run.total_steps:
                    with clock.pause():
                        # the cache's counters so far are training's; evaluation's lookups are not
                        interval.add(embeddings.stats())
                        result = run.evaluate(step)
                        embeddings.stats()
                    if info.is_main:
                        bar.write(f"step {step}: val auc {result['auc']:.4f} logloss {result['logloss']:.4f}")
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < run.total_steps:
                    with clock.pause():
                        run.checkpoint(step)
                if step >= run.total_steps:
                    break
        if loss_n:  # the tail since the last log line still counts towards throughput
            loss_sum.item()  # the steps have finished on the device
            clock.lap()
            loss_sum.zero_()
            loss_n = 0
    bar.close()
    return step, clock, totals, startup_s


def summarize(run: Run, step: int, clock: Throughput, totals: StatsTotals, startup_s: float) -> dict[str, Any]:
    """Final checkpoint and evaluation; the summary (written to the run dir, printed as a table)."""
    run.checkpoint(step)
    final = run.evaluate(step)
    summary: dict[str, Any] = {
        "steps": step,
        "train_samples": clock.samples,
        "train_seconds": round(clock.seconds, 3),
        "train_samples_per_s": clock.samples / clock.seconds if clock.seconds > 0 else math.nan,
        "startup_s": round(startup_s, 3),
        **{f"val_{k}": v for k, v in final.items()},
    }
    oracle = find_oracle(run.manifest)
    if oracle is not None:
        summary["oracle_auc"] = oracle
    if run.cfg.test and "test" in run.manifest.splits:
        summary.update({f"test_{k}": v for k, v in run.evaluate(step, "test").items()})
    if run.info.distributed:  # every rank's cache serves its own tables: add them up
        everyone: list = [None] * run.info.world_size
        torch.distributed.all_gather_object(everyone, totals)
        totals = totals.combine(everyone)
    summary.update({f"embedding_{k}": v for k, v in totals.result().items()})
    run.log.write("summary", **summary)
    if run.info.is_main:
        atomic_write_text(run.run_dir / "summary.json", json.dumps(summary, indent=2, default=str))
        # per-table hit rates stay in summary.json / metrics.jsonl: too many rows for a table
        shown = [(k, v) for k, v in summary.items() if "/" not in k]
        print(format_table(shown, title=f"dlrm-cache train: {run.run_dir}"))
    return summary


def _train(cfg: DictConfig, device: torch.device, info: DistInfo) -> dict[str, Any]:
    run = setup(cfg, device, info)
    step = restore(run)
    if info.is_main:
        log.info(
            "run dir %s | %d tables, %s rows | %d steps of %d | embedding=%s",
            run.run_dir, len(run.manifest.table_sizes), f"{sum(run.manifest.table_sizes):,}",
            run.total_steps, cfg.data.batch_size, cfg.embedding._target_.rsplit(".", 1)[-1],
        )
    run.log.write("start", step=step, total_steps=run.total_steps, world_size=info.world_size,
                  config=config_dict(cfg))
    step, clock, totals, startup_s = train_steps(run, step)
    return summarize(run, step, clock, totals, startup_s)
