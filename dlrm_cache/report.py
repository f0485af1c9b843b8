"""`dlrm-cache report`: what a run (or a sweep of runs) did, as one figure and a short markdown summary.

Reading runs and computing every series that is drawn happen here, without matplotlib, so that tests
check the plotted numbers against the run's own files; ``figures.py`` only draws ``Panel``s (panels.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from .config import backend_name, flatten
from .data.format import atomic_write_text
from .data.stats import SUMMARY as STATS_SUMMARY
from .embedding.rates import rate_weight_key
from .panels import Line, Panel
from .readable import format_value, summary_order
from .rundir import (
    EVAL,
    METRICS,
    REPORT_MD,
    REPORT_PNG,
    START,
    SUMMARY,
    TRAIN,
    is_run_dir,
    read_records,
    read_summary,
)

# config keys that differ between any two runs without describing what was compared (data.path:
# compare() has checked that every run read the same dataset, however its path was written)
_NOT_SWEPT = {"run_dir", "resume", "progress", "data.path"}


@dataclass
class RunRecord:
    """A train run directory as read back from its files."""

    path: Path
    config: dict[str, Any]  # the resolved config of its last start record
    train: list[dict[str, Any]]  # train records, each with "steps": the steps its counters cover
    evals: list[dict[str, Any]]  # validation eval records
    summary: dict[str, Any] | None  # summary.json (None: the run has not finished)

    @property
    def name(self) -> str:
        return _short_path(self.path)

    @property
    def final(self) -> dict[str, Any]:
        """The summary of a finished run (a :class:`Sweep` holds only those)."""
        if self.summary is None:
            raise ValueError(f"{self.path}: the run has not finished (no {SUMMARY})")
        return self.summary

    def placement(self) -> str:
        """The embedding placement by the name the user typed (``freq_cache``)."""
        return backend_name(self.config.get("embedding", {}).get("_target_", "?"))


@dataclass
class Sweep:
    """Finished runs compared along what differs in their configs."""

    runs: list[RunRecord]
    keys: list[str]  # the config keys that differ between the runs
    x: list[float]  # numeric x per run (one numeric swept key), else 0..n-1
    labels: list[str]  # per run: the swept values as text
    numeric: bool
    unfinished: list[Path] = field(default_factory=list)
    predicted: list[float | None] = field(default_factory=list)  # plan's hit rate per run


# ----------------------------------------------------------------------------------- reading
def load_run(path: Path) -> RunRecord:
    """Read ``path``'s log (and summary.json); bad input raises a one-line error."""
    records = read_records(path)
    config, train, evals, last_step = records[0]["config"], [], [], 0
    for r in records:
        if r.get("kind") == START:  # a resumed run appends a new start record
            config, last_step = r["config"], int(r["step"])
        elif r.get("kind") == TRAIN:
            train.append({**r, "steps": r["step"] - last_step})
            last_step = r["step"]
        elif r.get("kind") == EVAL and r.get("split") == "val":
            evals.append(r)
    return RunRecord(path, config, train, evals, read_summary(path))


def find_runs(paths: list[Path]) -> tuple[list[RunRecord], Path | None]:
    """The runs named by ``paths``, and the sweep directory when one -m sweep directory was given."""
    if not paths:
        raise ValueError(
            "runs: name at least one run directory (dlrm-cache report RUN_DIR [RUN_DIR ...])"
        )
    if len(paths) == 1 and not (paths[0] / METRICS).exists():
        jobs = sorted((d for d in paths[0].glob("*") if is_run_dir(d)), key=_job_order)
        if jobs:
            return [load_run(d) for d in jobs], paths[0]
    return [load_run(p) for p in paths], None


def _job_order(d: Path) -> tuple[int, str]:
    return (int(d.name), "") if d.name.isdigit() else (1 << 30, d.name)


def _short_path(p: Path, parts: int = 3) -> str:
    return "/".join(p.resolve().parts[-parts:])


# ----------------------------------------------------------------------------------- one run
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
    panels.append(
        Panel(
            "val_auc",
            "Validation AUC",
            "step",
            "AUC",
            [
                Line(
                    "val AUC", e_steps, [r["auc"] for r in run.evals], annotate=_few(e_steps, ".4f")
                )
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
                )
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


# ----------------------------------------------------------------------------------- several runs
def flat_config(config: dict[str, Any]) -> dict[str, Any]:
    """A run's config by dotted key, lists as tuples (values are compared and grouped)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in flatten(config).items()}


def compare(runs: list[RunRecord]) -> Sweep:
    """What the runs differ in, checked to be comparable (one dataset, finished)."""
    datasets = {_dataset_id(r) for r in runs}
    if len(datasets) > 1:
        by = "; ".join(f"{r.name}: data.path={r.config['data']['path']}" for r in runs)
        raise ValueError(f"runs of different datasets cannot be compared ({by})")
    done = [r for r in runs if r.summary is not None]
    unfinished = [r.path for r in runs if r.summary is None]
    if not done:
        raise ValueError(
            f"{runs[0].path}: no finished run to compare (no {SUMMARY} in "
            f"{', '.join(str(p) for p in unfinished)})"
        )
    flat = [flat_config(r.config) for r in done]
    keys = sorted(
        {
            k
            for f in flat
            for k in f
            if k not in _NOT_SWEPT and len({repr(g.get(k)) for g in flat}) > 1
        }
    )
    values: list[list[Any]] = [[f.get(k) for k in keys] for f in flat]
    numeric = len(keys) == 1 and all(
        isinstance(v[0], (int, float)) and not isinstance(v[0], bool) for v in values
    )
    if numeric:
        order = sorted(range(len(done)), key=lambda i: values[i][0])
        done, values = [done[i] for i in order], [values[i] for i in order]
        x = [float(v[0]) for v in values]
    else:
        x = list(range(len(done)))
    labels = [
        _label(
            dict(zip(keys, vs)),
            present=[k for k in keys if all(f.get(k) is not None for f in flat)],
        )
        or r.name
        for r, vs in zip(done, values)
    ]
    return Sweep(done, keys, x, labels, numeric, unfinished, predicted_hit_rates(done))


def _label(values: dict[str, Any], present: list[str]) -> str:
    """A run's swept values, one per line: a placement as its class name; of the keys that only some
    placements have, just the cache ratio (the rest follow from the placement)."""
    out = []
    for k, v in values.items():
        if k.endswith("._target_"):
            out.append(_short(v))
        elif v is not None and (k in present or k.endswith("cache_ratio")):
            out.append(f"{k.rsplit('.', 1)[-1]}={_short(v)}")
    return "\n".join(out)


def _short(v: Any) -> str:
    if isinstance(v, str) and "." in v and v.rsplit(".", 1)[-1][:1].isupper():  # a _target_ class
        return backend_name(v)
    return f"{v:g}" if isinstance(v, float) else str(v)


def predicted_hit_rates(runs: list[RunRecord]) -> list[float | None]:
    """`dlrm-cache plan`'s hit rate for each run with a cache_ratio, for the cache that run had (its
    look-ahead window sized for its batch size); None: no cache, or no stats."""
    from .config import FreqCacheEmbeddingConfig
    from .data.stats import load_counts
    from .embedding.freq_cache.layout import plan_table

    embs = [r.config.get("embedding", {}) for r in runs]
    data = dataset_path(runs[0])
    if data is None or all(e.get("cache_ratio") is None for e in embs):
        return [None] * len(runs)
    counts = load_counts(data)
    d = (
        FreqCacheEmbeddingConfig()
    )  # a key a run's config lacks (uvm_cache, older runs): the default
    return [
        plan_table(
            counts,
            [e["cache_ratio"]],
            e.get("static_fraction", d.static_fraction),
            e.get("lookahead", d.lookahead),
            e.get("batch_size", d.batch_size),
        )[0]["hit_rate"]
        if e.get("cache_ratio")
        else None
        for e in embs
    ]


def _dataset_id(run: RunRecord) -> str:
    """The dataset as a resolved path when it can be found (a relative and an absolute data.path
    name the same data), else data.path as written."""
    found = dataset_path(run)
    return str(found.resolve()) if found else str(run.config["data"]["path"])


def dataset_path(run: RunRecord) -> Path | None:
    """The run's dataset with its frequency statistics: data.path as given, else relative to the
    directory the run was started from (Hydra records it)."""
    p = Path(run.config["data"]["path"])
    candidates = [p]
    hydra_yaml = run.path / ".hydra" / "hydra.yaml"
    if not p.is_absolute() and hydra_yaml.is_file():
        from omegaconf import OmegaConf

        cwd = OmegaConf.load(hydra_yaml).hydra.runtime.cwd
        candidates.append(Path(cwd) / p)
    return next((c for c in candidates if (c / STATS_SUMMARY).is_file()), None)


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
            " | ".join("-" if f.get(k) is None else _short(f.get(k)) for k in sweep.keys) or "same"
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
def report(cfg: DictConfig) -> dict[str, Path]:
    """Write report.png and report.md; returns their paths."""
    from .figures import draw_panels

    runs, sweep_dir = find_runs([Path(p) for p in cfg.runs])
    if len(runs) == 1:
        run = runs[0]
        if not run.train and not run.evals:
            raise ValueError(f"{run.path / METRICS}: no train or eval records yet: nothing to draw")
        out = Path(cfg.output) if cfg.output else run.path
        worst = worst_hit_tables(run, cfg.worst_tables)
        draw_panels(run_panels(run, cfg.worst_tables), run_title(run), out / REPORT_PNG)
        atomic_write_text(out / REPORT_MD, run_markdown(run, worst))
    else:
        where = str(sweep_dir) if sweep_dir else "runs side by side"
        sweep = compare(runs)
        out = Path(cfg.output) if cfg.output else (sweep_dir or Path("."))
        draw_panels(sweep_panels(sweep), sweep_title(sweep, where), out / REPORT_PNG)
        atomic_write_text(out / REPORT_MD, sweep_markdown(sweep, where))
    paths = {"png": out / REPORT_PNG, "md": out / REPORT_MD}
    print(f"dlrm-cache report: wrote {paths['png']} and {paths['md']}")
    return paths
