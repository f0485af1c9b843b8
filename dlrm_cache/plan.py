"""`dlrm-cache plan`: size the cache before training, from the frequency statistics alone."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from .data.format import Manifest, atomic_write_text
from .data.stats import load_counts
from .embedding.base import SparseOptim
from .embedding.freq_cache.plan import plan_table
from .train.metrics import format_table


def plan(cfg: DictConfig) -> list[dict]:
    """Predicted hit rate (share of lookups served by the device cache) for each cache ratio."""
    data = Path(cfg.data_path)
    manifest = Manifest.load(data)
    counts = load_counts(data)
    rows = plan_table(counts, list(cfg.ratios), cfg.static_fraction, cfg.lookahead, cfg.batch_size)
    bytes_per_row = SparseOptim("rowwise_adagrad").row_bytes(cfg.embedding_dim)
    total_rows = sum(manifest.table_sizes)
    print(f"dlrm-cache plan: {data} ({len(counts)} tables, {total_rows:,} rows, "
          f"{total_rows * bytes_per_row / 2**20:,.1f} MiB of rows+state at dim {cfg.embedding_dim}); "
          f"window: {cfg.lookahead + 1} batches of {cfg.batch_size}")
    mib = lambda n: n * bytes_per_row / 2**20  # noqa: E731
    print(f"{'ratio':>8} {'cache rows':>12} {'cache MiB':>10} {'static rows':>12} {'static MiB':>10} "
          f"{'window rows':>12} {'window MiB':>10} {'added rows':>11} {'hit rate':>9} {'per-table caches':>17}")
    for r in rows:
        print(f"{r['ratio']:>8.4f} {r['cache_rows']:>12,} {mib(r['cache_rows']):>10.1f} {r['static_rows']:>12,} "
              f"{mib(r['static_rows']):>10.1f} {r['window_rows']:>12,} {mib(r['window_rows']):>10.1f} "
              f"{r['added_rows']:>11,} {r['hit_rate']:>9.4f} {r['hit_rate_per_table_caches']:>17.4f}")
    if cfg.per_table:
        for r in rows:
            print(format_table(sorted(r["per_table"].items()), title=f"per-table hit rate at ratio {r['ratio']}"))
    if cfg.output:
        atomic_write_text(cfg.output, json.dumps(rows, indent=1))
    return rows
