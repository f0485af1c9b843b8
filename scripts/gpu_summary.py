"""The table `scripts/gpu_check.sh quick` ends with: every ratio of the run, from its files.

    python scripts/gpu_summary.py OUT

Reads what the quick check left in OUT (bench JSON, the two runs' summary.json, the stream trace's
summary, the GPU tests' log) and prints one short table; a missing file is a line saying so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(out: Path, name: str):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None


def _bench(rows, title: str) -> list[str]:
    if not rows:
        return [f"{title}: no results"]
    lines = [title + ":"]
    for r in rows:
        if "error" in r:
            lines.append(f"  {r['variant']:<24} skipped: {r['error'][:80]}")
            continue
        base, ratio = next(
            ((k[len("speed_vs_") :], v) for k, v in r.items() if k.startswith("speed_vs_")),
            ("", None),
        )
        hit = r.get("hit_rate")
        lines.append(
            f"  {r['variant']:<24} {r['ms_per_iter']:8.3f} ms  "
            f"{'' if ratio is None else f'{ratio:.3f}x of {base}':<16}"
            f"{'' if hit is None or hit != hit else f'hit {hit:.3f}'}"
        )
        if r.get("breakdown_ms"):
            parts = "  ".join(f"{k} {v:.2f}" for k, v in r["breakdown_ms"].items())
            lines.append(f"  {'':<24} {parts}")
    return lines


def main(out: Path) -> int:
    lines: list[str] = []
    tests = out / "gpu-tests.txt"
    last = tests.read_text().strip().splitlines()[-1:] if tests.exists() else ["no log"]
    lines.append(f"gpu tests: {last[0] if last else 'empty log'}")
    lines += _bench(_load(out, "bench-embedding.json"), "embedding layer (ms/iter)")
    lines += _bench(_load(out, "bench-train.json"), "whole step (ms/iter, then its breakdown)")
    lines += _bench(
        _load(out, "bench-train-dcn.json"), "DLRM-DCN step (ms/iter, then its breakdown)"
    )
    lines += _bench(_load(out, "bench-train-bf16.json"), "bf16 step (ms/iter, then its breakdown)")
    plan = _load(out, "bench-planning.json")
    lines.append("freq_cache per batch (ms): threads plan staging floor staging/floor")
    for r in plan or []:
        lines.append(
            f"  {r['planner_threads']:>2}  {r['plan_ms']:6.2f}  {r['staging_ms']:6.2f}  "
            f"{r['floor_ms']:6.2f}  {r['staging_vs_floor']:.3f}  (hit {r['hit_rate']:.3f}, "
            f"{r['rows_loaded_per_batch']:,.0f} rows in)"
        )
    runs = {e: _load(out, f"train-{e}-summary.json") for e in ("hbm", "hbm2", "freq_cache")}
    if all(runs.values()):
        h, h2, f = runs["hbm"], runs["hbm2"], runs["freq_cache"]
        lines.append(
            f"train: hbm {h['train_samples_per_s']:,.0f} samples/s, freq_cache "
            f"{f['train_samples_per_s']:,.0f} ({f['train_samples_per_s'] / h['train_samples_per_s']:.3f}x),"
            f" AUC hbm {h.get('val_auc')} and again {h2.get('val_auc')} (one seed: the spread),"
            f" freq_cache {f.get('val_auc')}, hit {f.get('embedding_hit_rate')}"
        )
    else:
        lines.append(f"train: missing summary ({[e for e, r in runs.items() if not r]})")
    streams = _load(out, "streams.json")
    if streams:
        keep = ("compute_gaps_per_step", "compute_gap_ms_per_step", "compute_idle_share")
        lines.append("stream trace: " + "  ".join(f"{k} {streams.get(k)}" for k in keep))
    else:
        lines.append("stream trace: no summary")
    pre = _load(out, "bench-preprocess.json")
    lines.append(
        "preprocess lines/s: "
        + ("  ".join(f"{r['run']} {r['lines_per_s']:,.0f}" for r in pre) if pre else "no results")
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
