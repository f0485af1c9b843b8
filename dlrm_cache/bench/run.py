"""`dlrm-cache bench`: the command (which kind runs, the results printed, written and drawn, the
failure policy); each kind of benchmark is a module of its own.

* ``kind=embedding``: the embedding layer alone (forward + backward + fused rowwise-Adagrad update),
  ``num_tables`` x ``rows_per_table`` x ``embedding_dim``, power-law ids, fresh batches every step.
* ``kind=train``: a whole DLRM training step (MLPs, interaction, loss, dense optimizer) with
  Criteo-Kaggle-shaped tables, once per backend and (``precisions`` x ``compile``) setting; after
  the timed steps, ``warmup`` + ``iters`` more steps split into phases (bench/breakdown.py) give
  the step's breakdown.  Both: bench/steps.py.
* ``kind=planning``: the freq_cache's own work per batch (the plan on the device, the host's
  staging of rows against its floor, the copies) with Criteo-Kaggle-shaped tables, per
  ``planner_threads``: what has to stay below the step time: bench/planning.py.
* ``kind=loader``: the input pipeline alone on a processed dataset (``data_path``): samples/s of
  batches ready for the step, through training's own path (shard stream, shuffle, rank share, KJT,
  pinned memory and device copy on a GPU), beside the rate of reading the same shards with parquet
  alone (the ceiling): bench/loader.py.
* ``kind=preprocess``: `dlrm-cache preprocess` itself on raw Criteo text (``preprocess_input``), in
  fresh processes per ``workers`` value (and a ``preprocess_baseline`` tree, torchrec's parser):
  lines/s, CPU time, peak memory and CPU seconds per stage (parse, count, encode, write):
  bench/preprocess.py.

Every backend runs in the same process on the same batches; results are reported as ms/iter and as
a ratio against the first baseline present (``hbm``, else ``host``), so figures compare within one
run.  Timings are wall-clock around a device synchronize, after ``warmup`` untimed iterations.

A placement that cannot run on this machine (:class:`DeviceUnavailable`, e.g. hbm without a GPU) is
skipped with its reason; any other error in a row is printed with its traceback and makes the bench
fail (:class:`BenchFailed`, exit status 1) after the other rows ran, as does a run where no row ran.
"""

from __future__ import annotations

import json
import math
import sys
import traceback
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from ..embedding.base import DeviceUnavailable
from ..files.atomic import atomic_write_text
from ..files.outputs import check_files
from ..parallel.dist import resolve_device
from . import BenchFailed
from .breakdown import format_breakdown
from .inputs import bench_tables, ids_per_sample, init_device, make_batches, zipf_counts
from .loader import loader
from .planning import planning
from .preprocess import preprocess_bench
from .steps import run_one, variants


def bench(cfg: DictConfig) -> list[dict[str, Any]]:
    reads = [("dataset", cfg.data_path), ("input", cfg.preprocess_input)]
    check_files(cfg, ("output", "figure"), reads)
    if cfg.kind == "preprocess":  # fresh processes, no device; no figure: tables, printed
        return _write_json(cfg, preprocess_bench(cfg))
    device = resolve_device(cfg.device)
    init_device(device)
    if cfg.kind == "loader":  # no figure: one rate per epoch, printed
        return _write_json(cfg, loader(cfg, device))
    tables = bench_tables(cfg)
    sizes = [t.num_rows for t in tables]
    hot = ids_per_sample(cfg.hotness, len(tables))
    batches = make_batches(
        sizes, cfg.batch_size, cfg.distinct_batches, cfg.zipf_alpha, cfg.seed, hot
    )
    counts = zipf_counts(tables, cfg.zipf_alpha, hot)
    print(
        f"dlrm-cache bench kind={cfg.kind} device={device} tables={len(tables)} "
        f"rows={sum(sizes):,} dim={cfg.embedding_dim} batch={cfg.batch_size} "
        f"hotness={cfg.hotness} ({sum(hot) * cfg.batch_size:,} ids per batch) "
        f"zipf_alpha={cfg.zipf_alpha} iters={cfg.iters}"
    )
    title = (
        f"dlrm-cache bench kind={cfg.kind} on {device}: {len(tables)} tables, {sum(sizes):,} rows, "
        f"dim {cfg.embedding_dim}, batch {cfg.batch_size:,}"
    )
    if cfg.kind == "planning":
        results = planning(cfg, tables, batches, device, counts)
        _write(cfg, results, title)
        return results
    results = []
    for v in variants(cfg):
        try:
            r = run_one(cfg, v, tables, batches, device, counts)
        except DeviceUnavailable as e:  # e.g. a CUDA-only backend on a CPU machine
            r = {"variant": v.label, "error": str(e).splitlines()[0]}
        except Exception as e:  # reported below and fails the run, after the other rows ran
            traceback.print_exc(file=sys.stderr)
            r = {
                "variant": v.label,
                "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                "crashed": True,
            }
        results.append(r)
        print(_row(r), flush=True)
    base = next(
        (
            r
            for name in ("hbm", "host")
            for r in results
            if r["variant"] == name and "error" not in r
        ),
        None,
    )
    if base:
        for r in results:
            if "error" not in r:
                r["speed_vs_" + base["variant"]] = base["ms_per_iter"] / r["ms_per_iter"]
        print(f"\nspeed relative to {base['variant']} (same run):")
        for r in results:
            if "error" not in r:
                print(
                    f"  {r['variant']:<24} {r['ms_per_iter']:9.3f} ms  "
                    f"{r['speed_vs_' + base['variant']]:6.3f}x"
                    f"{_vs_same_setting(r, results, base['variant'])}"
                )
    _write(cfg, results, title)
    check_rows(results)
    return results


def bench_series(results: list[dict[str, Any]]) -> dict[str, Any]:
    """What the bench figure draws: per variant that ran, ms/iter and speed against the baseline
    (kind=planning: plan, host staging and its floor, ms per batch); the skipped ones with their
    reason."""
    ran = [r for r in results if "error" not in r]
    out: dict[str, Any] = {
        "variant": [r["variant"] for r in ran],
        "skipped": [(r["variant"], r["error"]) for r in results if "error" in r],
    }
    if ran and "staging_ms" in ran[0]:
        out.update(
            metric="planning",
            plan_ms=[r["plan_ms"] for r in ran],
            staging_ms=[r["staging_ms"] for r in ran],
            floor_ms=[r["floor_ms"] for r in ran],
        )
        return out
    speed_key = next((k for k in (ran[0] if ran else {}) if k.startswith("speed_vs_")), None)
    out.update(
        metric="ms_per_iter",
        ms_per_iter=[r["ms_per_iter"] for r in ran],
        samples_per_s=[r["samples_per_s"] for r in ran],
        baseline=speed_key[len("speed_vs_") :] if speed_key else None,
        relative=[r[speed_key] if speed_key else None for r in ran],
    )
    return out


def _write_json(cfg: DictConfig, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if cfg.output:
        atomic_write_text(cfg.output, json.dumps(results, indent=1, default=float))
    return results


def _write(cfg: DictConfig, results: list[dict[str, Any]], title: str) -> None:
    _write_json(cfg, results)
    if cfg.figure and any("error" not in r for r in results):
        from ..plots.draw import draw_bench

        print(
            f"dlrm-cache bench: figure {draw_bench(bench_series(results), title, Path(cfg.figure))}"
        )


def _vs_same_setting(r: dict[str, Any], results: list[dict[str, Any]], base: str) -> str:
    """A cache's speed against the baseline backend run in the same precision/compile setting."""
    if "precision" not in r or r["variant"].split(" ")[0] == base:
        return ""
    same = next(
        (
            o
            for o in results
            if "error" not in o
            and o["variant"].split(" ")[0] == base
            and (o["precision"], o["compile"]) == (r["precision"], r["compile"])
        ),
        None,
    )
    if same is None or same["variant"] == base:  # fp32 eager: the speed column above says it
        return ""
    return f"  ({same['ms_per_iter'] / r['ms_per_iter']:.3f}x {same['variant']})"


def check_rows(results: list[dict[str, Any]]) -> None:
    """Raise :class:`BenchFailed` when a row crashed or when no row ran at all."""
    crashed = [r for r in results if r.get("crashed")]
    if crashed or all("error" in r for r in results):
        bad = crashed or results
        raise BenchFailed(
            "; ".join(f"{r['variant']}: {r['error']}" for r in bad)
            + ("" if crashed else " (no placement could run on this machine)")
        )


def _row(r: dict[str, Any]) -> str:
    """A variant's line of the table: time, rate, and what it has of hit rate and GPU memory."""
    if "error" in r:
        return f"  {r['variant']:<24} {'FAILED' if r.get('crashed') else 'skipped'}: {r['error']}"
    st = r.get("stats", {})
    waits = ""
    if "stall_s" in st:  # freq_cache: where its time went (per timed iteration)
        n = r["iters"]
        waits = (
            f"  stall {1000 * st['stall_s'] / n:.3f} ms/iter"
            f"  GPU wait for rows {1000 * st.get('transfer_wait_s', 0.0) / n:.3f} ms/iter"
        )
    line = f"  {r['variant']:<24} {r['ms_per_iter']:9.3f} ms/iter  {r['samples_per_s']:>12,.0f} samples/s"
    hits = [
        f"{what}{r[key]:.4f}"
        for what, key in (("hit ", "hit_rate"), ("distinct ids ", "hit_rate_distinct"))
        if not math.isnan(r[key])  # NaN: not counted (host and hbm have no cache)
    ]
    if hits:
        line += "  " + (f"{hits[0]} ({hits[1]})" if len(hits) == 2 else hits[0])
    if not math.isnan(r["peak_gpu_mib"]):  # NaN: no GPU (device=cpu)
        line += f"  peak GPU {r['peak_gpu_mib']:.0f} MiB"
    line += waits
    if "breakdown_ms" in r:
        line += "\n" + format_breakdown(r["breakdown_ms"])
    return line
