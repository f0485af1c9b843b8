"""`dlrm-cache plan`: size the cache before training, from the frequency statistics alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from ..console.readable import natural_key
from ..data.format import Manifest
from ..data.stats import counted_samples, load_counts
from ..embedding.base import SparseOptim
from ..embedding.freq_cache.layout import pinned_batches, plan_table
from ..files.atomic import atomic_write_text
from ..files.outputs import check_files
from ..train.metrics import format_table


def plan_series(
    rows: list[dict], bytes_per_row: int, embedding_dim: int, per_table: bool
) -> dict[str, Any]:
    """What the plan figure draws: hit rates per ratio, the cache's MiB, per-table rates by table."""
    out: dict[str, Any] = {
        "ratio": [r["ratio"] for r in rows],
        "hit_rate": [r["hit_rate"] for r in rows],
        "hit_rate_per_table_caches": [r["hit_rate_per_table_caches"] for r in rows],
        "cache_mib": [cache_mib(r["cache_rows"], bytes_per_row) for r in rows],
        "embedding_dim": embedding_dim,
    }
    if per_table:
        out["per_table"] = {
            name: [r["per_table"][name] for r in rows] for name in rows[0]["per_table"]
        }
    return out


def cache_mib(cache_rows: int, bytes_per_row: int) -> float:
    """Device memory of the cache's rows and their optimizer state."""
    return cache_rows * bytes_per_row / 2**20


def plan(cfg: DictConfig) -> list[dict]:
    """Predicted hit rate (share of lookups served by the device cache) for each cache ratio, for
    the freq_cache ``cfg.embedding`` at the batch size of ``cfg.data`` (the job `train` runs)."""
    from ..config.schemas import backend_target

    emb = cfg.embedding
    if emb._target_ != backend_target("freq_cache"):
        raise ValueError(f"embedding={emb._target_.rsplit('.', 1)[-1]}: plan predicts freq_cache")
    data = Path(cfg.data.path)
    check_files(cfg, ("output", "figure"), [("dataset", data)])
    manifest = Manifest.load(data, key="data.path")
    counts = load_counts(data)
    rows = plan_table(
        counts,
        list(cfg.ratios),
        emb.static_fraction,
        emb.lookahead,
        emb.batch_size,
        counted_samples(manifest),
    )
    dim = cfg.model.embedding_dim
    bytes_per_row = SparseOptim("rowwise_adagrad").row_bytes(dim)
    total_rows = sum(manifest.table_sizes)

    def mib(n: int) -> float:
        return cache_mib(n, bytes_per_row)

    print(
        f"dlrm-cache plan: {data} ({len(counts)} tables, {total_rows:,} rows, "
        f"{mib(total_rows):,.1f} MiB of rows+state at dim {dim}); "
        f"window: {pinned_batches(emb.lookahead)} batches of {emb.batch_size}"
    )
    print(
        f"{'ratio':>8} {'cache rows':>12} {'cache MiB':>10} {'static rows':>12} {'static MiB':>10} "
        f"{'window rows':>12} {'window MiB':>10} {'added rows':>11} {'hit rate':>9} {'per-table caches':>17}"
    )
    for r in rows:
        print(
            f"{r['ratio']:>8.4f} {r['cache_rows']:>12,} {mib(r['cache_rows']):>10.1f} {r['static_rows']:>12,} "
            f"{mib(r['static_rows']):>10.1f} {r['window_rows']:>12,} {mib(r['window_rows']):>10.1f} "
            f"{r['added_rows']:>11,} {r['hit_rate']:>9.4f} {r['hit_rate_per_table_caches']:>17.4f}"
        )
    if cfg.per_table:
        for r in rows:
            print(
                format_table(
                    sorted(r["per_table"].items(), key=lambda kv: natural_key(kv[0])),
                    title=f"per-table hit rate at ratio {r['ratio']} (one pooled cache)",
                )
            )
    if cfg.output:
        atomic_write_text(cfg.output, json.dumps(rows, indent=1))
    if cfg.figure:
        from ..plots.draw import draw_plan

        series = plan_series(rows, bytes_per_row, dim, cfg.per_table)
        title = f"dlrm-cache plan: {data} ({len(counts)} tables, {total_rows:,} rows)"
        print(f"dlrm-cache plan: figure {draw_plan(series, title, Path(cfg.figure))}")
    return rows
