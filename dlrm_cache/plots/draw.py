"""Drawing: the only module that imports matplotlib (Agg: no display needed), imported lazily by the
commands that write figures so that `train` never pays for it.  The numbers come ready-made as
``Panel``s (plots/panels.py, computed by report/series.py) or as the rows of `plan` / `bench`."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.figure import Figure, SubFigure
from matplotlib.ticker import FuncFormatter, NullFormatter

from ..files.atomic import atomic_file
from .panels import Panel

DPI = 100


def save_png(fig: Figure, path: Path) -> Path:
    """Write the figure atomically (a temp name, then rename) and close it."""
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format="png", dpi=DPI)
    plt.close(fig)
    return path


def _wrap(title: str, width: int) -> str:
    """Long lines (deep run paths, many swept keys) wrapped rather than cut at the figure's edge."""
    return "\n".join(textwrap.fill(line, width) for line in title.splitlines())


def _percent(v: float, _pos: Any = None) -> str:
    return f"{100 * v:.3g}%"


def _percent_ticks(ax, ratios: Sequence[float]) -> None:
    """An x tick at each ratio, labelled as a percentage (no log-scale minor labels)."""
    ax.set_xticks(ratios)
    ax.xaxis.set_major_formatter(FuncFormatter(_percent))
    ax.xaxis.set_minor_formatter(NullFormatter())


def draw_panels(panels: Sequence[Panel], title: str, path: Path, columns: int = 2) -> Path:
    """A grid of panels under one title."""
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(
        rows,
        columns,
        figsize=(6.4 * columns, 3.6 * rows + 0.8),
        squeeze=False,
        layout="constrained",
    )
    fig.suptitle(_wrap(title, 140), fontsize=11)
    for ax, panel in zip(axes.flat, panels):
        for line in panel.lines:
            (drawn,) = ax.plot(line.x, line.y, line.style, label=line.label, markersize=4)
            if panel.xticks is not None:  # separate runs, not a series: no lines between them
                drawn.set_linestyle("none")
            if line.annotate:
                for x, y in zip(line.x, line.y):
                    if not math.isfinite(y):  # no value (an empty split's AUC): no label
                        continue
                    ax.annotate(
                        format(y, line.annotate),
                        (x, y),
                        textcoords="offset points",
                        xytext=(0, -12 if line.annotate_below else 6),
                        ha="center",
                        fontsize=7,
                        color=drawn.get_color(),
                    )
        for label, y in panel.hlines:
            ax.axhline(y, color="tab:gray", linestyle="--", linewidth=1, label=label)
        if any(line.annotate for line in panel.lines):
            ax.margins(x=0.08, y=0.15)  # room for the value labels inside the axes
        if panel.xlim:
            ax.set_xlim(*panel.xlim)
        if panel.y_from_zero:
            ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.set_xscale(panel.xscale)
        ax.grid(True, alpha=0.3)
        if panel.x_percent:
            _percent_ticks(ax, sorted({v for line in panel.lines for v in line.x}))
        if (
            panel.xticks is not None
        ):  # separate runs: every run's slot shown, labels clear of the edges
            ax.set_xlim(-0.6, len(panel.xticks) - 0.4)
            ax.set_xticks(range(len(panel.xticks)), panel.xticks, fontsize=8)
        ax.legend(fontsize=8, loc="lower right" if panel.y_from_zero else "best")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    return save_png(fig, path)


def draw_plan(series: dict[str, Any], title: str, path: Path) -> Path:
    """Predicted hit rate against cache ratio with the cache's memory on a second axis; with
    per-table rates, a second panel: one row per table, one column per ratio."""
    per_table = series.get("per_table")
    fig = plt.figure(
        figsize=(11, 4.6 + (0.26 * len(per_table) + 1.2 if per_table else 0)), layout="constrained"
    )
    fig.suptitle(_wrap(title, 120), fontsize=11)
    top: Figure | SubFigure
    bottom: SubFigure | None
    if per_table:
        # matplotlib's stubs type the 2x1 grid as a single SubFigure
        top, bottom = fig.subfigures(2, 1, height_ratios=[4.6, 0.26 * len(per_table) + 1.2])  # type: ignore[misc]
    else:
        top, bottom = fig, None
    ax = top.subplots()
    x = series["ratio"]
    ax.plot(x, series["hit_rate"], "o-", label="pooled cache (freq_cache)")
    ax.plot(x, series["hit_rate_per_table_caches"], "s--", label="a separate cache per table")
    for xi, yi in zip(x, series["hit_rate"]):
        ax.annotate(
            f"{yi:.3f}",
            (xi, yi),
            textcoords="offset points",
            xytext=(0, 7),
            ha="center",
            fontsize=8,
        )
    ax.set_xscale("log")
    ax.margins(x=0.06)
    _percent_ticks(ax, x)
    ax.set_xlabel("cache ratio (share of all embedding rows in the cache)")
    ax.set_ylabel("predicted hit rate (share of lookups)")
    ax.set_ylim(0, 1.05)
    ax.grid(True, alpha=0.3)
    mem = ax.twinx()
    mem.plot(
        x,
        series["cache_mib"],
        "^:",
        color="tab:gray",
        label=f"cache GPU memory: rows + optimizer state at dim {series['embedding_dim']} (right axis)",
    )
    for xi, mib in zip(x, series["cache_mib"]):
        mem.annotate(
            f"{mib:,.1f} MiB",
            (xi, mib),
            textcoords="offset points",
            xytext=(-5, 4),
            ha="right",
            fontsize=7,
            color="tab:gray",
        )  # upper left of a rising curve: clear of it
    mem.set_ylabel("cache GPU memory (MiB)")
    mem.set_ylim(0, max(series["cache_mib"]) * 1.15 or 1)
    handles = ax.get_legend_handles_labels()[0] + mem.get_legend_handles_labels()[0]
    top.legend(
        handles,
        [str(h.get_label()) for h in handles],
        fontsize=8,
        loc="outside lower center",
        ncols=3,
    )
    ax.set_title("Hit rate and memory per cache ratio", fontsize=10)
    if bottom is not None and per_table:
        _draw_table_heatmap(bottom.subplots(), per_table, x)
    return save_png(fig, path)


def _draw_table_heatmap(ax, per_table: dict[str, list[float]], ratios: list[float]) -> None:
    names = list(per_table)
    grid = [per_table[n] for n in names]
    im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=1)
    ax.set_xticks(range(len(ratios)), [_percent(r) for r in ratios])
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel("cache ratio")
    ax.set_ylabel("table")
    ax.set_title("Predicted hit rate per table (in the pooled cache)", fontsize=10)
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            ax.text(
                j,
                i,
                f"{v:.3f}",
                ha="center",
                va="center",
                fontsize=7,
                color="black" if v > 0.6 else "white",
            )
    ax.figure.colorbar(im, ax=ax, label="hit rate", fraction=0.04)


def draw_bench(series: dict[str, Any], title: str, path: Path) -> Path:
    """Horizontal bars per variant (baseline highlighted, speed relative to it written beside)."""
    labels = series["variant"]
    per_bar = 0.45 if series["metric"] == "ms_per_iter" else 0.8
    fig, ax = plt.subplots(
        figsize=(10, 1.6 + per_bar * len(labels) + 0.9 * bool(series["skipped"])),
        layout="constrained",
    )
    fig.suptitle(_wrap(title, 120), fontsize=11)
    y = range(len(labels))
    if series["metric"] == "ms_per_iter":
        colors = ["tab:orange" if v == series["baseline"] else "tab:blue" for v in labels]
        bars = ax.barh(y, series["ms_per_iter"], color=colors)
        for bar, ms, sps, rel in zip(
            bars, series["ms_per_iter"], series["samples_per_s"], series["relative"]
        ):
            text = f" {ms:.2f} ms | {sps:,.0f} samples/s" + (
                f" | {rel:.2f}x" if rel is not None else ""
            )
            ax.text(
                bar.get_width(), bar.get_y() + bar.get_height() / 2, text, va="center", fontsize=8
            )
        ax.set_xlabel(
            "milliseconds per iteration (lower is faster); beside each bar: speed as a multiple of the baseline's"
        )
        if series["baseline"]:
            base = series["ms_per_iter"][labels.index(series["baseline"])]
            ax.axvline(
                base,
                color="tab:orange",
                linestyle="--",
                linewidth=1,
                label=f"baseline: {series['baseline']} ({base:.2f} ms)",
            )
            ax.legend(fontsize=8, loc="lower right")
        ax.set_xlim(
            0, max(series["ms_per_iter"]) * 1.75
        )  # room for the text beside the longest bar
    else:  # kind=planning: the cache's own work per batch, by party
        h = 0.27
        for offset, key, label in (
            (-h, "plan_ms", "plan (device ops and their reads)"),
            (0, "staging_ms", "host staging (gather, landing, issue)"),
            (h, "floor_ms", "floor (bare torch gather and scatter)"),
        ):
            bars = ax.barh([i + offset for i in y], series[key], h, label=label)
            for bar, ms in zip(bars, series[key]):
                ax.text(
                    bar.get_width(), bar.get_y() + h / 2, f" {ms:.2f} ms", va="center", fontsize=8
                )
        ax.set_xlabel("milliseconds per batch")
        ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=3, frameon=False)
        ax.set_xlim(0, max(series["plan_ms"] + series["staging_ms"] + series["floor_ms"]) * 1.2)
    ax.set_yticks(
        list(y),
        [f"{v}\n(baseline)" if v == series.get("baseline") else v for v in labels],
        fontsize=9,
    )
    ax.invert_yaxis()
    ax.set_ylabel("backend / cache ratio")
    ax.grid(True, axis="x", alpha=0.3)
    if series["skipped"]:
        text = "skipped: " + "; ".join(f"{v}: {why}" for v, why in series["skipped"])
        ax.set_title(textwrap.fill(text, 140), fontsize=8)
    return save_png(fig, path)
