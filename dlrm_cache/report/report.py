"""`dlrm-cache report`: what a run (or a sweep of runs) did, as one figure and a short markdown summary.

The figure's series come from :mod:`.series` (no matplotlib); the markdown summary is written here;
:mod:`dlrm_cache.plots.draw` draws the figure.
"""

from __future__ import annotations

import math
from pathlib import Path

from omegaconf import DictConfig

from ..console.readable import best_line, format_value, summary_order
from ..files.atomic import atomic_write_text
from ..files.outputs import RUN, check_output, check_writable
from ..rundir.records import METRICS, REPORT_MD, REPORT_PNG, SUMMARY
from .runs import RunRecord, Sweep, compare, find_runs, flat_config, short_value
from .series import run_panels, run_title, sweep_panels, sweep_title, worst_hit_tables


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
    from ..plots.draw import draw_panels

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
