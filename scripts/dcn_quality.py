"""DLRM-DCN against dot-DLRM on data with a planted feature cross: validation AUC over seeds.

    python scripts/dcn_quality.py --work /tmp/dcn-quality --out docs/dcn-quality.md

One synthetic dataset (``dlrm-cache synth cross_scale=...``, then ``preprocess``), then per
training seed one run of each model through the real CLI: the same embedding width, bottom and
top MLPs, optimizers and steps, only ``model.interaction`` differs.  Printed and written (Markdown,
plus the raw numbers as JSON beside it): each run's validation AUC and log loss, and per model the
mean with its 95% interval over the seeds (Student's t, n-1 degrees of freedom), the data's oracle
AUC, and the per-seed AUC difference dcn - dot with its interval.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
MODELS = {"dot": ["model.interaction=dot"], "dcn": ["model.interaction=dcn"]}


def cli(*args: str) -> None:
    cmd = [sys.executable, "-m", "dlrm_cache", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        raise SystemExit(f"dcn_quality: {' '.join(cmd)} failed: {tail}")


def spread(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t interval."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan")
    return mean, T975[len(values) - 1] * statistics.stdev(values) / len(values) ** 0.5


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/dcn-quality"), help="data and runs")
    p.add_argument("--out", type=Path, default=REPO / "docs/dcn-quality.md")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--lines", type=int, default=100_000)
    p.add_argument("--cardinality-scale", type=float, default=0.0005)
    p.add_argument("--cross-scale", type=float, default=2.0, help="synth's cross_scale")
    p.add_argument(
        "--interaction-scale", type=float, default=0.0, help="synth's FM part (dot products)"
    )
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument(
        "model",
        nargs="*",
        default=[
            "model.embedding_dim=16",
            "model.bottom_mlp=[64]",
            "model.top_mlp=[64,32]",
            "model.dcn_num_layers=3",
            "model.dcn_low_rank_dim=32",
            "data.batch_size=512",
        ],
        help="train overrides both models share",
    )
    a = p.parse_args()
    t0 = time.perf_counter()
    raw, data = a.work / "raw", a.work / "processed"
    cli(
        "synth",
        f"output={raw}",
        f"lines={a.lines}",
        f"cardinality_scale={a.cardinality_scale}",
        f"cross_scale={a.cross_scale}",
        f"interaction_scale={a.interaction_scale}",
        "progress=false",
    )
    cli("preprocess", f"input={raw}", f"output={data}", "progress=false")
    oracle = json.loads((raw / "oracle.json").read_text())
    runs: dict[str, list[dict]] = {m: [] for m in MODELS}
    for seed in range(a.seeds):
        for name, extra in MODELS.items():
            run = a.work / f"{name}-{seed}"
            cli(
                "train",
                f"data.path={data}",
                f"run_dir={run}",
                "overwrite=true",
                "device=cpu",
                "progress=false",
                f"seed={seed}",
                f"epochs={a.epochs}",
                *a.model,
                *extra,
            )
            s = json.loads((run / "summary.json").read_text())
            runs[name].append(
                {"seed": seed, "val_auc": s["val_auc"], "val_logloss": s["val_logloss"]}
            )
            print(
                f"{name} seed {seed}: val AUC {s['val_auc']:.4f}, log loss {s['val_logloss']:.4f}"
            )
    diff = [c["val_auc"] - d["val_auc"] for c, d in zip(runs["dcn"], runs["dot"])]
    result = {
        "settings": vars(a) | {"work": str(a.work), "out": str(a.out)},
        "oracle_auc": oracle["oracle_auc"],
        "runs": runs,
        "auc": {m: spread([r["val_auc"] for r in rs]) for m, rs in runs.items()},
        "logloss": {m: spread([r["val_logloss"] for r in rs]) for m, rs in runs.items()},
        "auc_dcn_minus_dot": spread(diff),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    a.out.write_text(report(result))
    print(report(result))


def report(r: dict) -> str:
    s = r["settings"]
    lines = [
        "# DLRM-DCN against dot-DLRM on a planted feature cross",
        "",
        f"`python scripts/dcn_quality.py {' '.join(s['model'])}` with `--lines {s['lines']}"
        f" --cardinality-scale {s['cardinality_scale']} --cross-scale {s['cross_scale']}"
        f" --interaction-scale {s['interaction_scale']}"
        f" --epochs {s['epochs']} --seeds {s['seeds']}` ({r['seconds']:.0f} s on this machine's CPU)."
        " One `synth` dataset, preprocessed; per training seed one run of each model (only"
        " `model.interaction` differs). Validation split; mean ± half-width of the 95% t interval"
        " over the seeds.",
        "",
        f"Oracle AUC (the planted model's own scores): {r['oracle_auc']:.4f}",
        "",
        "| model | val AUC | val log loss | per seed (AUC) |",
        "|---|---|---|---|",
    ]
    for m in r["runs"]:
        auc, ll = r["auc"][m], r["logloss"][m]
        seeds = ", ".join(f"{x['val_auc']:.4f}" for x in r["runs"][m])
        lines.append(f"| {m} | {auc[0]:.4f} ± {auc[1]:.4f} | {ll[0]:.4f} ± {ll[1]:.4f} | {seeds} |")
    d = r["auc_dcn_minus_dot"]
    lines += ["", f"AUC dcn - dot, paired by seed: {d[0]:+.4f} ± {d[1]:.4f}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
