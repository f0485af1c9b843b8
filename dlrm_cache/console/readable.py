"""Numbers for people: how the console tables and `report`'s markdown write a value, chosen by
its key (what it measures), and the order a summary's keys are read in.

The machine-readable files (summary.json, metrics.jsonl) keep plain numbers; only the text shown
to a person goes through here.
"""

from __future__ import annotations

import math
import re
from typing import Any

# A run's summary, the keys a person looks for first (then the rest, in the order written)
SUMMARY_FIRST = (
    "val_auc",
    "val_logloss",
    "test_auc",
    "test_logloss",
    "train_samples_per_s",
    "embedding_hit_rate",
    "embedding_hit_rate_distinct",
    "oracle_auc",
)


def summary_order(summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` with the keys of :data:`SUMMARY_FIRST` first."""
    first = {k: summary[k] for k in SUMMARY_FIRST if k in summary}
    return {**first, **{k: v for k, v in summary.items() if k not in first}}


def best_line(summary: dict[str, Any]) -> str | None:
    """A sentence on the run's best checkpoint (None: its summary names none)."""
    if "best_step" not in summary:
        return None
    value = "".join(
        f" ({k.removeprefix('best_')} {format_value(k, v)})"
        for k, v in summary.items()
        if k.startswith("best_val_")
    )
    early = ", where training stopped early" if summary.get("stopped_early") is True else ""
    return (
        f"Best checkpoint: step {summary['best_step']}{value}, {summary.get('best_checkpoint')}; "
        f"the last: step {summary.get('steps')}{early}."
    )


def natural_key(name: str) -> tuple[Any, ...]:
    """``sorted(names, key=natural_key)``: numbers inside names in numeric order (C1, C2, ...,
    C10, ``hit_rate/C2`` before ``hit_rate/C10``), the rest by text."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part)
        for part in re.split(r"(\d+)", name)
        if part
    )


def is_seconds(key: str) -> bool:
    """A duration in seconds (``train_seconds``, ``startup_s``, ``stall_s``), not a rate."""
    return key.endswith(("seconds", "_s")) and not key.endswith("per_s")


def format_value(key: str, v: Any) -> str:
    """``v`` as a person reads it: counts as integers with thousands separators, durations in
    seconds or ms to 3 significant digits, byte counts in MB or GB, rates per second as integers,
    fractions (AUC, log loss, hit rates) to 4 decimals; no value (NaN, None) as ``n/a``."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if "bytes" in key.rsplit("/", 1)[0].split("_"):  # cache_bytes, bytes_loaded
        return format_bytes(v)
    if is_seconds(key):
        return format_seconds(v)
    if key.endswith("per_s"):  # a rate: 684 as 1,404, never 684.1062
        return f"{v:,.0f}"
    if isinstance(v, int) or v.is_integer():  # counters that stats() reports as floats
        return f"{int(v):,}"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4f}"


def format_bytes(n: float) -> str:
    """Bytes in GB (from 1 GB), MB (from 1 MB, and below it to 3 decimals), decimal units."""
    if abs(n) >= 1e9:
        return f"{n / 1e9:,.2f} GB"
    return f"{n / 1e6:,.1f} MB" if abs(n) >= 1e6 else f"{n / 1e6:.3f} MB"


def format_seconds(t: float) -> str:
    """A duration to 3 significant digits: in ms below a second, whole seconds from 100 s."""
    if t == 0 or abs(t) >= 1:
        return f"{t:,.0f} s" if abs(t) >= 100 else f"{t:.3g} s"
    return f"{1000 * t:.3g} ms"
