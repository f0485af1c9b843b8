"""`dlrm-cache predict` lines/s beside `dlrm-cache preprocess` lines/s on the same raw file.

    python scripts/bench_predict.py [--work DIR] [--lines N] [--repeats R] [model overrides ...]

Makes (or reuses) a synthetic raw file of N lines, its processed dataset and a briefly trained run
(the default model unless overrides are given), then runs preprocess (a fresh build: overwrite=true)
and predict on that same raw file alternately, R times each (A B A B ...), every run as a user runs
it (the console command, progress bars off).  Prints each run's own lines/s (what the command
reports: preprocess's covers both its passes, predict's the scoring loop) and its wall time with
interpreter start-up, then the ratio of the medians.  Run it under `flock /work/bench.lock` on a
shared machine and quote `uptime` beside it.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

CLI = [sys.executable, "-m", "dlrm_cache"]


def run(args: list[str]) -> tuple[str, float]:
    t0 = time.perf_counter()
    res = subprocess.run(CLI + args, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode:
        sys.exit(f"failed: {' '.join(args)}\n{res.stderr[-2000:]}")
    return res.stdout, wall


def prepare(work: Path, lines: int, model: list[str]) -> tuple[Path, Path]:
    raw = work / "raw"
    run(["synth", f"output={raw}", f"lines={lines}", "progress=false"])
    run(["preprocess", f"input={raw}", f"output={work / 'processed'}", "progress=false"])
    if not (work / "run" / "checkpoints").is_dir():
        run(
            [
                "train",
                f"data.path={work / 'processed'}",
                f"hydra.run.dir={work / 'run'}",
                "device=cpu",
                "progress=false",
                "max_steps=20",
                *model,
            ]
        )
    return raw / "day_0", work / "run"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--work", default="bench-predict", help="working directory (reused between calls)"
    )
    ap.add_argument("--lines", type=int, default=500_000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "model", nargs="*", help="train overrides, e.g. model.bottom_mlp=[64] model.top_mlp=[64]"
    )
    a = ap.parse_args()
    work = Path(a.work).resolve()
    raw, run_dir = prepare(work, a.lines, a.model)
    rows: dict[str, list[tuple[float, float]]] = {"preprocess": [], "predict": []}
    for _ in range(a.repeats):
        out, wall = run(
            [
                "preprocess",
                f"input={raw}",
                f"output={work / 'bench-processed'}",
                "overwrite=true",
                "progress=false",
            ]
        )
        rows["preprocess"].append(
            (float(re.search(r"\(([\d,]+) lines/s\)", out)[1].replace(",", "")), wall)
        )
        out, wall = run(
            [
                "predict",
                f"checkpoint={run_dir}",
                f"input={raw}",
                f"output={work / 'pred.parquet'}",
                "progress=false",
            ]
        )
        rows["predict"].append(
            (float(re.search(r"lines_per_s\s*\|\s*([\d,]+)", out)[1].replace(",", "")), wall)
        )
    result = {
        "lines": a.lines,
        "model": a.model or ["default"],
        "runs": rows,
        **{f"{k}_median_lines_per_s": statistics.median(r[0] for r in v) for k, v in rows.items()},
        **{f"{k}_median_wall_s": statistics.median(r[1] for r in v) for k, v in rows.items()},
    }
    result["predict_over_preprocess"] = (
        result["predict_median_lines_per_s"] / result["preprocess_median_lines_per_s"]
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
