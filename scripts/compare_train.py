"""Throughput of `dlrm-cache train` variants side by side: interleaved rounds, medians, ratios.

    python scripts/compare_train.py --data data/synth/processed --steps 300 --rounds 6 \\
        host=.:embedding=host  freq_cache=.:embedding=freq_cache,embedding.cache_ratio=0.05 \\
        before=/path/to/other/checkout:embedding=freq_cache,embedding.cache_ratio=0.05

Each variant is ``NAME=CHECKOUT:OVERRIDES`` (overrides comma-separated; CHECKOUT is a source tree
whose ``dlrm_cache`` runs, with this interpreter).  Every round runs every variant once, in the
order given, so slow drifts of a shared machine hit all of them alike; the figure is each run's
``train_samples_per_s`` (training steps only, from its summary.json).  Printed: every run, then
per variant the median, min and max, and the median's ratio to the first variant's median, and
the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def parse_variant(text: str) -> tuple[str, Path, list[str]]:
    name, sep, rest = text.partition("=")
    checkout, sep2, overrides = rest.partition(":")
    if not (sep and sep2 and name):
        raise SystemExit(f"compare_train: variant {text!r}: expected NAME=CHECKOUT:OVERRIDES")
    tree = Path(checkout).resolve()
    if not (tree / "dlrm_cache").is_dir():
        raise SystemExit(f"compare_train: variant {name}: no dlrm_cache/ in {tree}")
    return name, tree, [o for o in overrides.split(",") if o]


def run_once(tree: Path, overrides: list[str], args, out_dir: Path) -> float:
    cmd = [sys.executable, "-m", "dlrm_cache", "train", f"data.path={args.data}"]
    cmd += ["progress=false", f"max_steps={args.steps}", "eval_batches=1"]
    cmd += [f"hydra.run.dir={out_dir}", *overrides]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        raise SystemExit(f"compare_train: {' '.join(cmd)} failed in {tree}: {tail}")
    return float(json.loads((out_dir / "summary.json").read_text())["train_samples_per_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="processed dataset (train's data.path)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("variants", nargs="+", help="NAME=CHECKOUT:OVERRIDES")
    args = ap.parse_args()
    args.data = str(Path(args.data).resolve())
    variants = [parse_variant(v) for v in args.variants]
    rates: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    with tempfile.TemporaryDirectory(prefix="compare_train-") as tmp:
        for r in range(args.rounds):
            for name, tree, overrides in variants:
                rate = run_once(tree, overrides, args, Path(tmp) / f"{name}-{r}")
                rates[name].append(rate)
                load = os.getloadavg()[0]
                print(
                    f"round {r + 1} {name:>16} {rate:>10,.0f} samples/s  load {load:.2f}",
                    flush=True,
                )
    base = variants[0][0]
    base_med = statistics.median(rates[base])
    print(
        f"\n{'variant':>16} {'median':>10} {'min':>10} {'max':>10} {'vs ' + base:>10} {'per-round':>10}"
    )
    for name, _, _ in variants:
        xs = rates[name]
        per_round = statistics.median(x / b for x, b in zip(xs, rates[base]))
        print(
            f"{name:>16} {statistics.median(xs):>10,.0f} {min(xs):>10,.0f} {max(xs):>10,.0f} "
            f"{statistics.median(xs) / base_med:>9.3f}x {per_round:>9.3f}x"
        )


if __name__ == "__main__":
    main()
