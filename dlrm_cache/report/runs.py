"""Runs as `report` reads them back: a run directory's records and summary (:class:`RunRecord`),
the runs a command line names (one run, several, or a ``-m`` sweep directory), and finished runs
compared along what differs in their configs (:class:`Sweep`, with `plan`'s hit rate for each).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.schemas import backend_name, flatten
from ..data.stats import SUMMARY as STATS_SUMMARY
from ..rundir.records import (
    EVAL,
    METRICS,
    START,
    SUMMARY,
    TRAIN,
    hydra_cwd,
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
    for p in paths:  # else load_run says it is "nor a sweep directory"
        if len(paths) > 1 and not (p / METRICS).exists() and any(map(is_run_dir, p.glob("*"))):
            raise ValueError(
                f"{p}: a sweep directory is reported alone (dlrm-cache report {p}); to compare "
                "some of its jobs with other runs, name the jobs' directories"
            )
    return [load_run(p) for p in paths], None


def _job_order(d: Path) -> tuple[int, str]:
    return (int(d.name), "") if d.name.isdigit() else (1 << 30, d.name)


def _short_path(p: Path, parts: int = 3) -> str:
    return "/".join(p.resolve().parts[-parts:])


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
            out.append(short_value(v))
        elif v is not None and (k in present or k.endswith("cache_ratio")):
            out.append(f"{k.rsplit('.', 1)[-1]}={short_value(v)}")
    return "\n".join(out)


def short_value(v: Any) -> str:
    if isinstance(v, str) and "." in v and v.rsplit(".", 1)[-1][:1].isupper():  # a _target_ class
        return backend_name(v)
    return f"{v:g}" if isinstance(v, float) else str(v)


def predicted_hit_rates(runs: list[RunRecord]) -> list[float | None]:
    """`dlrm-cache plan`'s hit rate for each run with a cache_ratio, for the cache that run had (its
    look-ahead window sized for its batch size); None: no cache, or no stats."""
    from ..config.schemas import FreqCacheEmbeddingConfig
    from ..data.format import Manifest
    from ..data.stats import counted_samples, load_counts
    from ..embedding.freq_cache.layout import plan_table

    embs = [r.config.get("embedding", {}) for r in runs]
    data = dataset_path(runs[0])
    if data is None or all(e.get("cache_ratio") is None for e in embs):
        return [None] * len(runs)
    counts = load_counts(data)
    samples = counted_samples(Manifest.load(data))
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
            samples,
        )[0]["hit_rate"]
        if e.get("cache_ratio")
        else None
        for e in embs
    ]


def _dataset_id(run: RunRecord) -> str:
    """The dataset by identity when it can be found: a digest of its manifest's identity (what a
    resume checks), so a copy at another path is the same data; else data.path as written."""
    import hashlib

    from ..data.format import Manifest

    found = dataset_path(run)
    if found is None:
        return str(run.config["data"]["path"])
    identity = json.dumps(Manifest.load(found).identity(), sort_keys=True)
    return hashlib.sha256(identity.encode()).hexdigest()


def dataset_path(run: RunRecord) -> Path | None:
    """The run's dataset with its frequency statistics: data.path as given, else relative to the
    directory the run was started from (Hydra records it)."""
    p = Path(run.config["data"]["path"])
    candidates = [p]
    cwd = None if p.is_absolute() else hydra_cwd(run.path)
    if cwd is not None:
        candidates.append(Path(cwd) / p)
    return next((c for c in candidates if (c / STATS_SUMMARY).is_file()), None)
