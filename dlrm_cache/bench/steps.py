"""``bench kind=embedding`` (the embedding layer alone: forward + backward + fused row update) and
``bench kind=train`` (a whole DLRM training step, train/step.py's, once per backend and
(precision x compile) setting, then split into phases: bench/breakdown.py).

Every variant runs in the same process on the same batches, through training's Pipeline (a
loader thread hands batches over; the device copy and the look-ahead prefetch happen in this
thread).
Timings are wall-clock around a device synchronize, after ``warmup`` untimed iterations.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from hydra.utils import get_class
from omegaconf import DictConfig

from ..config.choices import Precision
from ..config.schemas import backend_target
from ..data.batch import Batch, OneIdPerSample
from ..data.format import NUM_DENSE
from ..embedding.base import EmbeddingBackend, SparseOptim, TableSpec
from ..model.dcn import cross_shape
from ..model.dlrm import DLRM
from ..train.optim import dense_optimizer
from ..train.pipeline import Pipeline
from ..train.step import set_matmul_precision, train_step
from .breakdown import PhaseClock, split_step
from .inputs import COUNTED_SAMPLES, copy_batch, host_batches, init_device, sync


@dataclass
class Variant:
    label: str
    backend: str
    kwargs: dict[str, Any]
    precision: Precision = Precision.fp32  # train kind: the dense part's arithmetic
    compile: bool = False  # train kind: torch.compile of the dense path


def variants(cfg: DictConfig) -> list[Variant]:
    out = []
    for name in cfg.backends:
        if name == "uvm_cache":
            for algo in cfg.uvm_algorithms:
                for r in cfg.cache_ratios:
                    out.append(
                        Variant(
                            f"uvm_cache {algo} {r:.1%}", name, {"cache_ratio": r, "algorithm": algo}
                        )
                    )
        elif name == "freq_cache":
            for r in cfg.cache_ratios:
                out.append(
                    Variant(
                        f"freq_cache {r:.1%}",
                        name,
                        {
                            "cache_ratio": r,
                            "lookahead": cfg.lookahead,
                            "policy": cfg.policy,
                            "batch_size": cfg.batch_size,
                        },
                    )
                )
        else:
            out.append(Variant(name, name, {}))
    if cfg.kind != "train":
        return out
    # every backend in every setting; labels keep the plain backend name for fp32 eager
    return [
        Variant(v.label + setting_label(p, c), v.backend, v.kwargs, p, c)
        for p in cfg.precisions
        for c in cfg.compile
        for v in out
    ]


def setting_label(precision: Precision, compile: bool) -> str:
    return (
        ""
        if (precision, compile) == (Precision.fp32, False)
        else f" {precision.value}{' compiled' * compile}"
    )


def _build(
    v: Variant, tables: list[TableSpec], optim: SparseOptim, device, counts
) -> EmbeddingBackend:
    cls = get_class(backend_target(v.backend))
    kwargs = dict(v.kwargs)
    if v.backend == "freq_cache":
        kwargs["counts"] = counts
        kwargs["counted_samples"] = COUNTED_SAMPLES
    # Row values do not change the timings; skipping initial_state() saves building every table
    # twice in host memory (26 x 2M x 128 floats is 27 GB).
    return cls(tables=tables, optim=optim, device=device, **kwargs)


def run_one(cfg: DictConfig, v: Variant, tables, batches, device, counts) -> dict[str, Any]:
    optim = SparseOptim("rowwise_adagrad", cfg.lr)
    # a compiled model refers to itself (model -> compiled method -> model): only the cycle
    # collector frees the previous variant's tables, and it does not count device memory
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        init_device(device)  # the allocator must exist before its stats are reset
        torch.cuda.reset_peak_memory_stats(device)
    emb = _build(v, tables, optim, device, counts)
    keys = [t.name for t in tables]
    b = cfg.batch_size
    gen = torch.Generator().manual_seed(cfg.seed)
    dense = torch.rand(b, NUM_DENSE, generator=gen)
    labels = (torch.rand(b, generator=gen) < 0.25).float()
    clock = PhaseClock(device)
    if cfg.kind == "train":
        model = DLRM(
            emb,
            NUM_DENSE,
            cfg.embedding_dim,
            list(cfg.bottom_mlp),
            list(cfg.top_mlp),
            device=device,
            precision=v.precision,
            compile=v.compile,
            cross=cross_shape(cfg),
        )
        set_matmul_precision(v.precision, device)
        opt = dense_optimizer("adagrad", model.dense_parameters(), device, cfg.lr)

        def split(batch: Batch) -> None:
            split_step(model, opt, batch, clock)

        def step(batch: Batch) -> None:
            train_step(model, opt, batch)
    else:
        grad = torch.randn(b, len(tables) * cfg.embedding_dim, generator=gen).to(device)

        def step(batch: Batch) -> None:
            emb(batch.sparse).values().backward(grad)

        split = step  # never called: the embedding kind has no breakdown

    layout = OneIdPerSample(keys)
    hosts = host_batches(layout, dense, batches, labels, pin=device.type == "cuda")
    # train kind: after the timed steps, warmup + iters steps split into phases (the breakdown)
    split_iters = cfg.warmup + cfg.iters if cfg.kind == "train" else 0
    timed_end = cfg.warmup + cfg.iters
    total = timed_end + split_iters
    # As in training (the same Pipeline): a loader thread hands batches over, the device copy and
    # the look-ahead prefetch happen in this thread.  The stream runs ``lookahead`` batches past
    # the last step, so that every step also pays for one prefetch (their rows are loaded, never
    # trained on).
    stream = (copy_batch(hosts[i % len(hosts)]) for i in range(total + emb.lookahead))
    t0, elapsed, stats = 0.0, 0.0, {}
    with Pipeline(stream, device, emb) as pipeline:
        for i, batch in enumerate(pipeline):
            if i == cfg.warmup:
                sync(device)
                emb.reset_stats()  # report the timed iterations only
                t0 = time.perf_counter()
            if i == timed_end:  # the split steps that follow are the breakdown, not the timing
                sync(device)
                elapsed, stats = time.perf_counter() - t0, emb.take_stats()
            if i == timed_end + cfg.warmup:
                clock.reset()
            (step if i < timed_end else split)(batch)
            if i == total - 1:
                break
        sync(device)
        if not split_iters:
            elapsed, stats = time.perf_counter() - t0, emb.take_stats()
    result = {
        "variant": v.label,
        "iters": cfg.iters,
        "ms_per_iter": 1000 * elapsed / cfg.iters,
        "samples_per_s": cfg.iters * b / elapsed,
        "hit_rate": stats.get("hit_rate", math.nan),  # accesses served by the cache (freq_cache)
        "hit_rate_distinct": stats.get(
            "hit_rate_distinct", math.nan
        ),  # distinct ids (uvm_cache counts these)
        "peak_gpu_mib": torch.cuda.max_memory_allocated(device) / 2**20
        if device.type == "cuda"
        else math.nan,
        "stats": stats,
    }
    if split_iters:
        result.update(precision=v.precision.value, compile=v.compile, breakdown_ms=clock.result())
    return result
