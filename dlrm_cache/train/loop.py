"""The training loop: one readable function from a composed config to a trained, evaluated model."""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from ..data.format import Manifest, atomic_write_text
from ..data.loader import Batch, Prefetcher, ShardStream
from ..embedding.base import EmbeddingBackend, SparseOptim, TableSpec, initial_state
from ..model.dlrm import DLRM
from ..parallel.dist import DistInfo, agree_on_config, init_distributed, resolve_device, shutdown
from ..parallel.plan import Shard, available_host_bytes, plan_placement
from ..parallel.sharded import ShardedEmbeddings
from .checkpoint import Checkpoint, find_checkpoint, save_checkpoint
from .metrics import EvalMetrics, JsonlLog, StatsTotals, format_table
from .step import dense_optimizer, set_matmul_precision

log = logging.getLogger(__name__)


def embedding_factory(cfg: DictConfig, data_path: Path, device: torch.device):
    """``make(tables, shards) -> EmbeddingBackend`` for the configured placement.

    ``shards`` (row ranges of whole tables, see parallel/plan.py) give each local table its slice of
    the frequency statistics; ``None`` means the tables are whole.
    """
    optim = SparseOptim(cfg.optim.sparse.name, cfg.optim.sparse.lr, cfg.optim.sparse.eps)
    wants_counts = "counts" in inspect.signature(get_class(cfg.embedding._target_)).parameters
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
) -> EmbeddingBackend:
    tables = [
        TableSpec(name, rows, cfg.model.embedding_dim)
        for name, rows in zip(manifest.sparse_names, manifest.table_sizes)
    ]
    make, optim, counts = embedding_factory(cfg, data_path, device)
    if not info.distributed:
        check_host_memory(cfg, tables, optim)
        embeddings = make(tables)
        embeddings.import_tables(initial_state(tables, optim, cfg.seed))
        return embeddings
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
    return sharded


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


def lookahead_window(
    batches: Iterator[Batch], backend: EmbeddingBackend, depth: int, device: torch.device
) -> Iterator[Batch]:
    """Yield batches in order while the backend already holds the next ``depth`` ones.

    The input pipeline knows the future, so the cache fetches the rows of batch t+depth while
    batch t trains, and rows of batches inside the window are never evicted before their use.
    """
    window: deque[Batch] = deque()
    for batch in batches:
        if depth > 0:
            # the host copy: the cache plans its transfers on the CPU, no device->host sync needed
            backend.prefetch(batch.sparse, batch.analysis)
        window.append(batch.to(device, non_blocking=True))
        if len(window) > depth:
            yield window.popleft()
    while window:
        yield window.popleft()


def analyze_in_loader(backend: EmbeddingBackend, depth: int):
    """The loader thread's share of the cache's work on each batch (None: nothing to do)."""
    if depth <= 0 or type(backend).analyze is EmbeddingBackend.analyze:
        return None

    def transform(batch: Batch) -> Batch:
        batch.analysis = backend.analyze(batch.sparse)
        return batch

    return transform


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, stream: ShardStream, device: torch.device, max_batches: int = -1, depth: int = 4
) -> dict[str, float]:
    model.eval()
    metrics = EvalMetrics(device)
    batches = Prefetcher(stream.batches(), depth=depth, pin=device.type == "cuda")
    try:
        for i, batch in enumerate(batches):
            if 0 <= max_batches <= i:
                break
            batch = batch.to(device, non_blocking=True)
            metrics.update(model(batch.dense, batch.sparse), batch.labels)
    finally:
        batches.close()
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


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train and evaluate as ``cfg`` says; returns the final summary (also written to the run dir)."""
    # torchrun: one GPU per local rank
    device = resolve_device(cfg.device, int(os.environ.get("LOCAL_RANK", "0")))
    info: DistInfo = init_distributed(device, cfg.dist_timeout_s)
    try:
        return _train(cfg, device, info)
    finally:
        shutdown()


def _train(cfg: DictConfig, device: torch.device, info: DistInfo) -> dict[str, Any]:
    run_dir = Path(agree_on_config(cfg, info))
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    data_path = Path(cfg.data.path)
    manifest = Manifest.load(data_path)
    torch.manual_seed(cfg.seed)

    embeddings = build_embeddings(cfg, manifest, data_path, device, info)
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

    train_stream = ShardStream(
        data_path, manifest, "train", cfg.data.batch_size, cfg.data.shuffle, cfg.seed,
        info.rank, info.world_size, drop_last=True,
    )
    val_stream = ShardStream(
        data_path, manifest, "val", cfg.data.eval_batch_size, False, cfg.seed,
        info.rank, info.world_size, drop_last=False, key="data.eval_batch_size",
    )
    steps_per_epoch = len(train_stream)
    if steps_per_epoch == 0:
        raise ValueError(
            f"data.batch_size={cfg.data.batch_size}: larger than the training split "
            f"({manifest.splits['train'].rows} rows of {data_path})"
        )
    total_steps = steps_per_epoch * cfg.epochs
    if cfg.max_steps >= 0:
        total_steps = min(total_steps, cfg.max_steps)

    step = 0
    if cfg.resume:
        ckpt = Checkpoint(find_checkpoint(cfg.resume))
        if ckpt.dense["data"]["batch_size"] != cfg.data.batch_size:
            raise ValueError(
                f"resume={ckpt.path}: written with data.batch_size={ckpt.dense['data']['batch_size']}, "
                f"now {cfg.data.batch_size}; the data position would not match"
            )
        model.load_dense_state_dict(ckpt.dense["model"])
        opt.load_state_dict(ckpt.dense["optimizer"])
        if embeddings.state_keys():
            embeddings.import_tables(ckpt.tables(embeddings.state_keys()))
        step = int(ckpt.dense["step"])
        if info.is_main:
            log.info("resumed from %s at step %d", ckpt.path, step)

    metrics_log = JsonlLog(run_dir / "metrics.jsonl", enabled=info.is_main)
    lookahead = int(getattr(embeddings, "lookahead", 0))
    oracle = find_oracle(manifest)
    if info.is_main:
        log.info(
            "run dir %s | %d tables, %s rows | %d steps of %d | embedding=%s",
            run_dir, len(manifest.table_sizes), f"{sum(manifest.table_sizes):,}",
            total_steps, cfg.data.batch_size, cfg.embedding._target_.rsplit(".", 1)[-1],
        )
    metrics_log.write("start", step=step, total_steps=total_steps, world_size=info.world_size,
                      config=OmegaConf.to_container(cfg, resolve=True))

    def checkpoint(at: int) -> None:
        embeddings.flush()  # cached rows and their optimizer state back into the full tables
        dense = {
            "model": model.dense_state_dict(), "optimizer": opt.state_dict(), "step": at,
            "data": {"batch_size": cfg.data.batch_size, "epoch": at // steps_per_epoch,
                     "batch_in_epoch": at % steps_per_epoch, "seed": cfg.seed},
            "world_size": info.world_size,
            "config": OmegaConf.to_container(cfg, resolve=True),
        }
        path = save_checkpoint(run_dir, at, dense, embeddings.export_tables(), info.rank)
        metrics_log.write("checkpoint", step=at, path=str(path))

    def run_eval(at: int) -> dict[str, float]:
        result = evaluate(net, val_stream, device, cfg.eval_batches, cfg.data.prefetch_batches)
        metrics_log.write("eval", step=at, split="val", **result)
        return result

    bar = tqdm(total=total_steps, initial=step, disable=not (cfg.progress and info.is_main),
               unit="step", dynamic_ncols=True)
    samples, train_time, loss_n = 0, 0.0, 0
    # summed on the device: a .item() per step would make the host wait for every step
    loss_sum = torch.zeros((), device=device)
    emb_totals = StatsTotals()
    last_eval: dict[str, float] = {}
    model.train()
    while step < total_steps:
        epoch, start = divmod(step, steps_per_epoch)
        reader = Prefetcher(train_stream.batches(epoch, start), cfg.data.prefetch_batches,
                            pin=device.type == "cuda", transform=analyze_in_loader(embeddings, lookahead),
                            workers=cfg.data.analysis_threads)
        try:
            t0 = time.perf_counter()
            for batch in lookahead_window(reader, embeddings, lookahead, device):
                set_learning_rates(model, opt, cfg, step)
                logits = net(batch.dense, batch.sparse)
                loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                step += 1
                samples += batch.size * info.world_size
                loss_sum += loss.detach()
                loss_n += 1
                if step % cfg.log_every == 0 or step == total_steps:
                    mean_loss = loss_sum.item() / loss_n  # waits for the steps so far: then read the clock
                    elapsed = time.perf_counter() - t0
                    train_time += elapsed
                    rate = loss_n * batch.size * info.world_size / max(elapsed, 1e-9)
                    emb_stats = embeddings.stats()
                    emb_totals.add(emb_stats)
                    record = {"loss": mean_loss, "samples_per_s": rate, **emb_stats}
                    metrics_log.write("train", step=step, epoch=epoch, **record)
                    bar.set_postfix(loss=f"{record['loss']:.4f}", samples_s=f"{rate:,.0f}")
                    loss_sum.zero_()
                    loss_n, t0 = 0, time.perf_counter()
                bar.update(1)
                if cfg.eval_every and step % cfg.eval_every == 0 and step < total_steps:
                    t_eval = time.perf_counter()
                    last_eval = run_eval(step)
                    if info.is_main:
                        bar.write(f"step {step}: val auc {last_eval['auc']:.4f} "
                                  f"logloss {last_eval['logloss']:.4f}")
                    t0 += time.perf_counter() - t_eval  # evaluation is not training time
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < total_steps:
                    t_ck = time.perf_counter()
                    checkpoint(step)
                    t0 += time.perf_counter() - t_ck
                if step >= total_steps:
                    break
            if loss_n:  # the tail since the last log line still counts towards throughput
                loss_sum.item()  # the steps have finished on the device
                train_time += time.perf_counter() - t0
                loss_sum.zero_()
                loss_n = 0
        finally:
            reader.close()
            embeddings.cancel_prefetch()  # batches fetched ahead past max_steps are never trained
    bar.close()

    checkpoint(step)
    final = run_eval(step)
    summary: dict[str, Any] = {
        "steps": step,
        "train_samples": samples,
        "train_seconds": round(train_time, 3),
        "train_samples_per_s": samples / train_time if train_time > 0 else math.nan,
        **{f"val_{k}": v for k, v in final.items()},
    }
    if oracle is not None:
        summary["oracle_auc"] = oracle
    if cfg.test and "test" in manifest.splits:
        test_stream = ShardStream(data_path, manifest, "test", cfg.data.eval_batch_size, False,
                                  cfg.seed, info.rank, info.world_size, drop_last=False,
                                  key="data.eval_batch_size")
        test = evaluate(net, test_stream, device, cfg.eval_batches, cfg.data.prefetch_batches)
        metrics_log.write("eval", step=step, split="test", **test)
        summary.update({f"test_{k}": v for k, v in test.items()})
    if info.distributed:  # every rank's cache serves its own tables: add them up
        everyone: list = [None] * info.world_size
        torch.distributed.all_gather_object(everyone, emb_totals)
        emb_totals = emb_totals.combine(everyone)
    cache = emb_totals.result()
    summary.update({f"embedding_{k}": v for k, v in cache.items()})
    metrics_log.write("summary", **summary)
    if info.is_main:
        atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, default=str))
        # per-table hit rates stay in summary.json / metrics.jsonl: too many rows for a table
        shown = [(k, v) for k, v in summary.items() if "/" not in k]
        print(format_table(shown, title=f"dlrm-cache train: {run_dir}"))
    return summary
