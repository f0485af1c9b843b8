"""`dlrm-cache report`: what a run (or a sweep of runs) did, as one figure and a short markdown summary.

Every series that is drawn is computed here from the runs (runs.py reads them), without
matplotlib, so that tests check the plotted numbers against the run's own files; ``figures.py``
only draws ``Panel``s (panels.py).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from .data.files import atomic_write_text
from .embedding.rates import rate_weight_key
from .outputs import RUN, check_output, check_writable
from .panels import Line, Panel
from .readable import best_line, format_value, summary_order
from .rundir import METRICS, REPORT_MD, REPORT_PNG, SUMMARY
from .runs import RunRecord, Sweep, compare, find_runs, flat_config, short_value


# ----------------------------------------------------------------------------------- one run
def _best_marks(run: RunRecord):
    """``marks(key)``: the summary's best checkpoint as a point on the panel of eval ``key``."""
    step = (run.summary or {}).get("best_step")
    at = next((r for r in run.evals if r["step"] == step), None)

    def marks(key: str) -> list[Line]:
        return [Line(f"best checkpoint (step {step})", [at["step"]], [at[key]], "*")] if at else []

    return marks


def run_panels(run: RunRecord, worst_tables: int = 3) -> list[Panel]:
    """The panels of one run's figure; cache panels only when the placement reports those stats."""
    t = run.train
    steps = [r["step"] for r in t]
    e_steps = [r["step"] for r in run.evals]
    last = max(steps + e_steps, default=1)
    xlim = (
        0.0,
        last * 1.06,
    )  # every panel over the whole run (even with one evaluation), room for labels
    panels = [
        Panel(
            "loss",
            "Training loss",
            "step",
            "binary cross-entropy (mean per log interval)",
            [Line("train loss", steps, [r["loss"] for r in t], "-")],
            xlim=xlim,
        ),
        Panel(
            "samples_per_s",
            "Training throughput",
            "step",
            "samples/s",
            [Line("samples/s (per log interval)", steps, [r["samples_per_s"] for r in t], "-")],
            xlim=xlim,
        ),
    ]
    oracle = (run.summary or {}).get("oracle_auc")
    best = _best_marks(run)
    panels.append(
        Panel(
            "val_auc",
            "Validation AUC",
            "step",
            "AUC",
            [
                Line(
                    "val AUC", e_steps, [r["auc"] for r in run.evals], annotate=_few(e_steps, ".4f")
                ),
                *best("auc"),
            ],
            xlim=xlim,
            hlines=[(f"planted model (oracle) AUC {oracle:.4f}", oracle)]
            if oracle is not None
            else [],
        )
    )
    panels.append(
        Panel(
            "val_logloss",
            "Validation log loss",
            "step",
            "log loss",
            [
                Line(
                    "val log loss",
                    e_steps,
                    [r["logloss"] for r in run.evals],
                    annotate=_few(e_steps, ".4f"),
                ),
                *best("logloss"),
            ],
            xlim=xlim,
        )
    )
    rate_key = next((k for k in ("hit_rate", "hit_rate_distinct") if any(k in r for r in t)), None)
    if rate_key:
        what = "lookups" if rate_key == "hit_rate" else "distinct ids"
        # an interval without lookups has no rate: a gap in the line, not a fall to 0
        lines = [Line(f"all tables ({what})", steps, [r.get(rate_key, math.nan) for r in t], "-")]
        for name in worst_hit_tables(run, worst_tables):
            rates = [r.get(f"hit_rate/{name}", math.nan) for r in t]
            lines.append(Line(f"table {name}", steps, rates, "-"))
        panels.append(
            Panel(
                "hit_rate",
                f"Cache hit rate ({what} served by the cache)",
                "step",
                "hit rate (per log interval)",
                lines,
                xlim=xlim,
            )
        )
    moved = [
        (k, label)
        for k, label in (
            ("rows_loaded", "rows loaded (host to cache)"),
            ("rows_written_back", "rows written back (cache to host)"),
        )
        if t and k in t[0]
    ]
    if moved:
        panels.append(
            Panel(
                "rows_moved",
                "Cache traffic",
                "step",
                "rows per training step",
                [Line(label, steps, per_step(t, k)) for k, label in moved],
                xlim=xlim,
            )
        )
    waits = [
        (k, label)
        for k, label in (
            ("stall_s", "stall (training thread waits for a batch's plan)"),
            ("transfer_wait_s", "transfer wait (step waits for its rows)"),
        )
        if t and k in t[0]
    ]
    if waits:
        panels.append(
            Panel(
                "waits",
                "Time the training step waited on the cache",
                "step",
                "ms per training step",
                [Line(label, steps, [1000 * v for v in per_step(t, k)]) for k, label in waits],
                xlim=xlim,
            )
        )
    return panels


def _few(points: list, spec: str, most: int = 8) -> str | None:
    """Write the values beside the points when there are few enough to read."""
    return spec if len(points) <= most else None


def per_step(train: list[dict[str, Any]], key: str) -> list[float]:
    """A counter summed over each log interval, divided by the steps of that interval."""
    return [r[key] / r["steps"] if r["steps"] else math.nan for r in train]


def worst_hit_tables(run: RunRecord, n: int) -> list[str]:
    """The ``n`` tables with the lowest hit rate over the run's records (each interval's rate
    weighted by its accesses; ties: table order)."""
    if not run.train or n <= 0:
        return []
    keys = dict.fromkeys(k for r in run.train for k in r if k.startswith("hit_rate/"))
    rates = {}
    for k in keys:  # records written before the per-table counts: each interval weighs 1
        w = [(r[k], r.get(rate_weight_key(k), 1.0)) for r in run.train if k in r]
        rates[k.split("/", 1)[1]] = sum(v * n for v, n in w) / max(sum(n for _, n in w), 1e-30)
    names = list(rates)
    return sorted(names, key=lambda name: rates[name])[:n]


def run_title(run: RunRecord) -> str:
    c = run.config
    emb = c.get("embedding", {})
    what = run.placement() + (
        f" cache_ratio={emb['cache_ratio']:g}" if "cache_ratio" in emb else ""
    )
    steps = run.summary["steps"] if run.summary else (run.train[-1]["step"] if run.train else 0)
    return (
        f"dlrm-cache run {run.name}\n{what} | {steps:,} steps of batch {c['data']['batch_size']:,} "
        f"| data {c['data']['path']}"
    )


def sweep_panels(sweep: Sweep) -> list[Panel]:
    runs, x = sweep.runs, sweep.x
    xlabel = sweep.keys[0] if sweep.numeric else "run"
    is_ratio = sweep.numeric and sweep.keys[0].endswith("cache_ratio")
    common: dict[str, Any] = dict(
        xscale="log" if is_ratio else "linear",
        x_percent=is_ratio,
        xticks=None if sweep.numeric else sweep.labels,
    )
    if is_ratio:
        xlabel = "cache ratio (share of all embedding rows in the cache)"

    def pick(key: str) -> tuple[list[float], list[float]]:
        pts = [(xi, r.final[key]) for xi, r in zip(x, runs) if key in r.final]
        return [p[0] for p in pts], [p[1] for p in pts]

    oracle = [r.final["oracle_auc"] for r in runs if "oracle_auc" in r.final]
    panels = [
        Panel(
            "val_auc",
            "Final validation AUC",
            xlabel,
            "AUC",
            [Line("val AUC (end of run)", *pick("val_auc"), annotate=_few(x, ".4f"))],
            hlines=[(f"planted model (oracle) AUC {oracle[0]:.4f}", oracle[0])] if oracle else [],
            **common,
        ),
        Panel(
            "samples_per_s",
            "Training throughput",
            xlabel,
            "samples/s (whole run)",
            [Line("train samples/s", *pick("train_samples_per_s"), annotate=_few(x, ",.0f"))],
            y_from_zero=True,
            **common,
        ),
    ]
    # measured has come out below the plan's prediction in the runs so far: its labels go under the points
    hit = [
        Line(
            "measured (lookups served by the cache)",
            *pick("embedding_hit_rate"),
            annotate=_few(x, ".3f"),
            annotate_below=True,
        )
    ]
    pred = [(xi, p) for xi, p in zip(x, sweep.predicted) if p is not None]
    if pred:
        hit.append(
            Line(
                "predicted by dlrm-cache plan",
                [p[0] for p in pred],
                [p[1] for p in pred],
                "s--",
                annotate=_few(pred, ".3f"),
            )
        )
    if hit[0].x or pred:
        panels.append(
            Panel(
                "hit_rate",
                "Cache hit rate: measured vs planned",
                xlabel,
                "hit rate",
                [line for line in hit if line.x],
                **common,
            )
        )
    loaded = [
        (xi, r.final["embedding_rows_loaded"] / r.final["steps"])
        for xi, r in zip(x, runs)
        if "embedding_rows_loaded" in r.final and r.final["steps"]
    ]
    if loaded:
        panels.append(
            Panel(
                "rows_loaded",
                "Cache traffic",
                xlabel,
                "rows loaded per training step",
                [
                    Line(
                        "rows loaded (host to cache)",
                        [p[0] for p in loaded],
                        [p[1] for p in loaded],
                        annotate=_few(loaded, ",.0f"),
                    )
                ],
                y_from_zero=True,
                **common,
            )
        )
    return panels


def sweep_title(sweep: Sweep, where: str) -> str:
    keys = sweep.keys
    what = (
        ", ".join(keys)
        if len(keys) <= 3
        else f"{', '.join(keys[:3])} and {len(keys) - 3} more config keys"
    )
    c = sweep.runs[0].config
    placements = " / ".join(dict.fromkeys(r.placement() for r in sweep.runs))
    return (
        f"dlrm-cache report: {where}, {len(sweep.runs)} runs compared over {what or 'nothing (same config)'}\n"
        f"{placements} | batch {c['data']['batch_size']:,} | data {c['data']['path']}"
    )


# ----------------------------------------------------------------------------------- markdown
def run_markdown(run: RunRecord, worst: list[str]) -> str:
    out = [
        f"# dlrm-cache report: {run.path}",
        "",
        f"![training, evaluation and cache]({REPORT_PNG})",
        "",
        run_title(run).replace("\n", "  \n"),
        "",
    ]
    if run.summary is None:
        out += [
            f"The run has not finished: no {SUMMARY} (the figure shows the records so far).",
            "",
        ]
    else:
        out += ["| result | value |", "|---|---|"]
        shown = summary_order(run.summary).items()
        out += [f"| {k} | {format_value(k, v)} |" for k, v in shown if "/" not in k]
        out.append("")
        best = best_line(run.summary)
        out += [best, ""] if best else []
    if worst and run.summary:
        rates = ", ".join(
            f"{name} {run.summary.get(f'embedding_hit_rate/{name}', math.nan):.4f}"
            for name in worst
        )
        out += [f"Lowest per-table hit rates (whole run): {rates}", ""]
    return "\n".join(out)


# the summary keys of a sweep's table, after steps (then plan's hit rate)
_SWEEP_COLUMNS = ("val_auc", "val_logloss", "train_samples_per_s", "embedding_hit_rate")


def sweep_markdown(sweep: Sweep, where: str) -> str:
    out = [
        f"# dlrm-cache report: {where}",
        "",
        f"![runs compared]({REPORT_PNG})",
        "",
        sweep_title(sweep, where).replace("\n", "  \n"),
        "",
        "| run | "
        + (" | ".join(sweep.keys) or "config")
        + " | steps | val AUC | val log loss | samples/s "
        "| hit rate | plan's hit rate |",
        "|---" * (7 + max(1, len(sweep.keys))) + "|",
    ]
    flat = [flat_config(r.config) for r in sweep.runs]
    for r, f, p in zip(sweep.runs, flat, sweep.predicted):
        s = r.final
        vals = (
            " | ".join("-" if f.get(k) is None else short_value(f.get(k)) for k in sweep.keys)
            or "same"
        )
        out.append(
            f"| {r.name} | {vals} | {format_value('steps', s['steps'])} "
            + "".join(f"| {format_value(k, s.get(k))} " for k in _SWEEP_COLUMNS)
            + f"| {format_value('hit_rate', p)} |"
        )
    if sweep.unfinished:
        out += [
            "",
            f"Not finished (no {SUMMARY}), left out: "
            + ", ".join(str(p) for p in sweep.unfinished),
        ]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------- the command
def _checked(output: str | None, default: Path) -> Path:
    """Where the report goes: ``output``, else ``default``; by the outputs rule, a run directory
    (a run's own report, an abandoned branch's inside it) or any other directory, but no
    checkpoint or dataset directory, nor one inside them."""
    where = Path(output) if output else default
    check_output(where, "output" if output else "runs", makes=RUN, inside=(RUN,))
    check_writable(where, "output" if output else "runs")
    if where.exists() and not where.is_dir():  # before: "[Errno 17] File exists: 'x'", no key
        raise ValueError(
            f"output={output}: is a file; report writes report.png and report.md into a directory"
        )
    return where


def report(cfg: DictConfig) -> dict[str, Path]:
    """Write report.png and report.md; returns their paths."""
    from .figures import draw_panels

    runs, sweep_dir = find_runs([Path(p) for p in cfg.runs])
    if len(runs) == 1:
        run = runs[0]
        if not run.train and not run.evals:
            raise ValueError(f"{run.path / METRICS}: no train or eval records yet: nothing to draw")
        out = _checked(cfg.output, run.path)
        worst = worst_hit_tables(run, cfg.worst_tables)
        draw_panels(run_panels(run, cfg.worst_tables), run_title(run), out / REPORT_PNG)
        atomic_write_text(out / REPORT_MD, run_markdown(run, worst))
    else:
        where = str(sweep_dir) if sweep_dir else "runs side by side"
        sweep = compare(runs)
        out = _checked(cfg.output, sweep_dir or Path("."))
        draw_panels(sweep_panels(sweep), sweep_title(sweep, where), out / REPORT_PNG)
        atomic_write_text(out / REPORT_MD, sweep_markdown(sweep, where))
    paths = {"png": out / REPORT_PNG, "md": out / REPORT_MD}
    print(f"dlrm-cache report: wrote {paths['png']} and {paths['md']}")
    return paths
