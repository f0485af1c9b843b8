"""DLRM-DCN against dot-DLRM on data with a planted pairwise feature cross: validation AUC over seeds.

    python scripts/dcn_quality.py --work /tmp/dcn-quality --out docs/dcn-quality.md [-- OVERRIDES]

(the train overrides both models share after ``--``: the grid options take several values each)

Per kind of planted cross (``dlrm-cache synth cross=ids|dense cross_scale=...``; see
``dlrm_cache/data/synth.py``), two synthetic datasets of the same settings: a *tuning* set (synth
seed ``--tune-seed``) and a *measurement* set (``--measure-seed``, a different planted model; or,
with ``--measure-sample-seed`` and ``--measure-seed`` equal to ``--tune-seed``, new rows drawn
from the tuning set's planted model, the usual held-out design: tuned and measured on one task).
On the tuning set each model's optimizer settings are chosen by its validation AUC over the grid of every
combination of ``--lrs`` (dense rate), ``--sparse-lrs``, ``--warmups`` (linear warm-up steps of
both rates) and ``--epochs`` (one run each, training seed 100); the measurement set's validation AUC
is never looked at for a choice.  The grid is the same for both models, so neither gets more tuning.
On the measurement set, per training seed 0..``--seeds``-1, one run of each model with its chosen
settings: the same embedding width, bottom and top MLPs and data; only ``model.interaction`` and
the chosen optimizer settings differ.  Everything goes through the real CLI (``synth``,
``preprocess``, ``train``).

Written (Markdown, plus the raw numbers as JSON beside it): per cross the tuning grid, the oracle
AUC, each run's validation AUC and log loss, per model the mean with its 95% interval over the
seeds (Student's t, n-1 degrees of freedom), and the per-seed AUC difference dcn - dot with its
interval.
"""

from __future__ import annotations

import argparse
import itertools
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
TUNE_TRAIN_SEED = 100  # the tuning runs' training seed, apart from the reported seeds 0..n-1
# the tuned settings: the script's option (its attribute) and the train override each sets
AXES = {
    "lrs": "optim.dense.lr",
    "sparse_lrs": "optim.sparse.lr",
    "warmups": "optim.warmup_steps",
    "epochs": "epochs",
}
# each override's letter in run names (``label``)
LETTER = dict(zip(AXES.values(), "dswe"))


class Failed(Exception):
    """A command exited non-zero; the message is its last line."""


def cli(*args: str) -> None:
    cmd = [sys.executable, "-m", "dlrm_cache", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        raise Failed(f"{' '.join(cmd)} failed: {tail}")


def spread(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t interval."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan")
    return mean, T975[len(values) - 1] * statistics.stdev(values) / len(values) ** 0.5


def set_name(cross: str, seed: int, sample_seed: int | None = None) -> str:
    """The work directory of one dataset: ``dense-1``, or ``dense-1s2`` for sample_seed 2."""
    return f"{cross}-{seed}" + ("" if sample_seed is None else f"s{sample_seed}")


def dataset(
    a: argparse.Namespace, cross: str, seed: int, sample_seed: int | None = None
) -> tuple[Path, float]:
    """Synthesize and preprocess one dataset; its processed path and oracle AUC."""
    raw = a.work / set_name(cross, seed, sample_seed) / "raw"
    data = raw.parent / "processed"
    cli(
        "synth",
        f"output={raw}",
        f"seed={seed}",
        *([] if sample_seed is None else [f"sample_seed={sample_seed}"]),
        f"lines={a.lines}",
        f"cardinality_scale={a.cardinality_scale}",
        f"cross={cross}",
        f"cross_scale={a.cross_scale}",
        f"interaction_scale={a.interaction_scale}",
        "progress=false",
    )
    cli("preprocess", f"input={raw}", f"output={data}", "progress=false")
    return data, json.loads((raw / "oracle.json").read_text())["oracle_auc"]


def train(a: argparse.Namespace, data: Path, run: Path, seed: int, *extra: str) -> dict:
    cli(
        "train",
        f"data.path={data}",
        f"run_dir={run}",
        "overwrite=true",
        "device=cpu",
        "progress=false",
        f"seed={seed}",
        *a.model,
        *extra,
    )
    s = json.loads((run / "summary.json").read_text())
    print(f"{run.name}: val AUC {s['val_auc']:.4f}, log loss {s['val_logloss']:.4f}", flush=True)
    return {"seed": seed, "val_auc": s["val_auc"], "val_logloss": s["val_logloss"]}


def grid(a: argparse.Namespace) -> list[dict[str, float]]:
    """Every combination of the tuned settings, by train override."""
    values = [getattr(a, axis) for axis in AXES]
    return [dict(zip(AXES.values(), combo)) for combo in itertools.product(*values)]


def label(settings: dict[str, float]) -> str:
    """A run's name part for its settings: ``d0.03-s0.05-w200-e1``."""
    return "-".join(f"{LETTER[k]}{v:g}" for k, v in settings.items())


def overrides(settings: dict[str, float]) -> list[str]:
    return [f"{k}={v:g}" for k, v in settings.items()]


def best(tried: list[dict]) -> dict[str, float]:
    """The settings of the highest validation AUC among the runs that trained (the first of
    equals, in grid order)."""
    trained = [t for t in tried if t["val_auc"] is not None]
    if not trained:
        raise Failed(f"every setting of {[t['settings'] for t in tried]} diverged")
    return max(trained, key=lambda t: t["val_auc"])["settings"]


def tune(a: argparse.Namespace, cross: str, data: Path, name: str) -> list[dict]:
    """One run of model ``name`` per grid point on the tuning set; val AUC None: diverged."""
    tried = []
    for settings in grid(a):
        run = data.parent / f"{name}-{label(settings)}"
        try:
            r = train(a, data, run, TUNE_TRAIN_SEED, *MODELS[name], *overrides(settings))
            auc: float | None = r["val_auc"]
        except Failed as e:  # the loss guard stopped it: settings too aggressive for this model
            print(f"{run.name}: {e}", flush=True)
            auc = None
        tried.append({"settings": settings, "val_auc": auc})
    return tried


def measure(a: argparse.Namespace, cross: str) -> dict:
    """Tune each model's optimizer settings on the tuning set, then measure on the measurement
    set."""
    tune_data, tune_oracle = dataset(a, cross, a.tune_seed)
    tuning = {name: tune(a, cross, tune_data, name) for name in MODELS}
    chosen = {name: best(tried) for name, tried in tuning.items()}
    data, oracle = dataset(a, cross, a.measure_seed, a.measure_sample_seed)
    runs: dict[str, list[dict]] = {m: [] for m in MODELS}
    for seed in range(a.seeds):
        for name, extra in MODELS.items():
            run = data.parent / f"{name}-{seed}"
            runs[name].append(train(a, data, run, seed, *extra, *overrides(chosen[name])))
    diff = [c["val_auc"] - d["val_auc"] for c, d in zip(runs["dcn"], runs["dot"])]
    return {
        "tune_oracle_auc": tune_oracle,
        "tuning": tuning,
        "chosen": chosen,
        "oracle_auc": oracle,
        "runs": runs,
        "auc": {m: spread([r["val_auc"] for r in rs]) for m, rs in runs.items()},
        "logloss": {m: spread([r["val_logloss"] for r in rs]) for m, rs in runs.items()},
        "auc_dcn_minus_dot": spread(diff),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/dcn-quality"), help="data and runs")
    p.add_argument("--out", type=Path, default=REPO / "docs/dcn-quality.md")
    p.add_argument("--seeds", type=int, default=5, help="training seeds of the measurement")
    p.add_argument("--lines", type=int, default=500_000)
    p.add_argument("--cardinality-scale", type=float, default=0.0005)
    p.add_argument("--crosses", nargs="+", default=["ids", "dense"], help="synth's cross kinds")
    p.add_argument("--cross-scale", type=float, default=2.0, help="synth's cross_scale")
    p.add_argument(
        "--interaction-scale", type=float, default=0.0, help="synth's FM part (dot products)"
    )
    p.add_argument("--tune-seed", type=int, default=1, help="synth seed of the tuning set")
    p.add_argument("--measure-seed", type=int, default=0, help="synth seed of the measurement set")
    p.add_argument(
        "--measure-sample-seed",
        type=int,
        default=None,
        help="synth sample_seed of the measurement set: with --measure-seed equal to --tune-seed,"
        " a new sample of the tuning set's planted model",
    )
    p.add_argument(
        "--lrs", type=float, nargs="+", default=[0.01, 0.03, 0.1], help="dense rates tried"
    )
    p.add_argument(
        "--sparse-lrs", type=float, nargs="+", default=[0.05, 0.2], help="sparse rates tried"
    )
    p.add_argument("--warmups", type=int, nargs="+", default=[0, 200], help="warm-up steps tried")
    p.add_argument("--epochs", type=int, nargs="+", default=[1, 2], help="epochs tried")
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
        help="train overrides both models share (after --)",
    )
    a = p.parse_args()
    t0 = time.perf_counter()
    try:
        crosses = {cross: measure(a, cross) for cross in a.crosses}
    except Failed as e:
        raise SystemExit(f"dcn_quality: {e}") from None
    result = {
        "settings": vars(a) | {"work": str(a.work), "out": str(a.out)},
        "crosses": crosses,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    a.out.write_text(report(result))
    print(report(result))


def report(r: dict) -> str:
    s = r["settings"]
    measure_seed = s.get("measure_seed", 0)  # reports from before the option: 0
    sample_seed = s.get("measure_sample_seed")
    sample = "" if sample_seed is None else f" --measure-sample-seed {sample_seed}"
    measure_set = f"synth seed {measure_seed}" + (
        ""
        if sample_seed is None
        else f", sample_seed {sample_seed}"
        + (": the tuning set's planted model" if measure_seed == s["tune_seed"] else "")
    )
    tuned = " ".join(
        f"--{axis.replace('_', '-')} {' '.join(f'{v:g}' for v in s[axis])}" for axis in AXES
    )
    lines = [
        "# DLRM-DCN against dot-DLRM on a planted pairwise feature cross",
        "",
        f"`python scripts/dcn_quality.py --crosses {' '.join(s['crosses'])} --lines {s['lines']}"
        f" --cardinality-scale {s['cardinality_scale']} --cross-scale {s['cross_scale']}"
        f" --interaction-scale {s['interaction_scale']} --tune-seed {s['tune_seed']}"
        f" --measure-seed {measure_seed}{sample}"
        f" {tuned} --seeds {s['seeds']} -- {' '.join(s['model'])}`"
        f" ({r['seconds']:.0f} s on this machine's CPU). Per"
        " cross, each model's optimizer settings (every combination of the dense rate, sparse"
        " rate, warm-up steps and epochs above, the same grid for both) are chosen on a tuning"
        f" set (synth seed {s['tune_seed']}, training seed {TUNE_TRAIN_SEED}); then per training"
        " seed one run of each model with its chosen settings on the measurement set"
        f" ({measure_set}), whose AUC chose nothing. Validation split; mean ± half-width of the 95% t interval"
        " over the seeds.",
    ]
    for cross, c in r["crosses"].items():
        lines += ["", f"## `cross={cross}`", "", *tuning_table(c), "", *measurement(c)]
    return "\n".join(lines) + "\n"


def tuning_table(c: dict) -> list[str]:
    """The tuning grid's val AUC per model, the chosen settings in bold."""
    keys = list(AXES.values())
    lines = [
        f"Tuning set (oracle AUC {c['tune_oracle_auc']:.4f}), val AUC by setting (**chosen**):",
        "",
        "| " + " | ".join(f"`{k}`" for k in keys) + " | " + " | ".join(c["tuning"]) + " |",
        "|---" * (len(keys) + len(c["tuning"])) + "|",
    ]
    by_model = list(c["tuning"].values())
    for i, point in enumerate(by_model[0]):
        cells = []
        for name, tried in c["tuning"].items():
            auc = tried[i]["val_auc"]
            cell = "diverged" if auc is None else f"{auc:.4f}"
            cells.append(f"**{cell}**" if tried[i]["settings"] == c["chosen"][name] else cell)
        settings = " | ".join(f"{point['settings'][k]:g}" for k in keys)
        lines.append(f"| {settings} | " + " | ".join(cells) + " |")
    return lines


def measurement(c: dict) -> list[str]:
    """Per model the measurement set's AUC and log loss over seeds; the paired difference."""
    lines = [
        f"Measurement set, oracle AUC (the planted model's own scores): {c['oracle_auc']:.4f}",
        "",
        "| model | settings | val AUC | val log loss | per seed (AUC) |",
        "|---|---|---|---|---|",
    ]
    for m in c["runs"]:
        auc, ll = c["auc"][m], c["logloss"][m]
        seeds = ", ".join(f"{x['val_auc']:.4f}" for x in c["runs"][m])
        chosen = " ".join(overrides(c["chosen"][m]))
        lines.append(
            f"| {m} | `{chosen}` | {auc[0]:.4f} ± {auc[1]:.4f} | {ll[0]:.4f} ± {ll[1]:.4f}"
            f" | {seeds} |"
        )
    d = c["auc_dcn_minus_dot"]
    lines += ["", f"AUC dcn - dot, paired by seed: {d[0]:+.4f} ± {d[1]:.4f}: {verdict(*d)}"]
    return lines


def verdict(mean: float, half: float) -> str:
    """What the paired difference dcn - dot (mean, 95% half-width) shows about "at least"."""
    if mean - half > 0:
        return "DLRM-DCN above dot-DLRM (the interval excludes 0)."
    if mean >= 0:
        return "DLRM-DCN's mean at or above dot-DLRM's; the interval includes 0."
    if mean + half >= 0:
        return "DLRM-DCN's mean below dot-DLRM's; the interval includes 0 (a tie within noise)."
    return "DLRM-DCN below dot-DLRM (the interval excludes 0)."


if __name__ == "__main__":
    main()
