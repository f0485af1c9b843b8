"""Malformed lines: counted per reason, the first few reported as ``path:line: reason (detail)``,
or (``bad_lines: fail``) the first one in read order stops the run.

Workers parse in any order; each part keeps its bad lines' positions and reasons, plus the
messages of its first few (:func:`.parse.parse_task`), and the parent puts them in read order
here, so counts, reports and the failing line do not depend on the number of workers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import criteo
from .parse import REASONS, Part
from .splits import SplitPlan

LIST_HINT = (
    "ids joined by '|' are a multi-hot list: declare the column multi_hot in a schema (schema=, "
    "docs/data.md, 'Your own dataset'; synth writes its own as schema.yaml beside its output)"
)


def _a_list(message: str) -> bool:
    """``message`` rejects a Criteo id that holds ``|``: a multi-hot field."""
    return criteo.BAD_HEX in message and "|" in message.split(criteo.BAD_HEX, 1)[1]


def with_list_hint(message: str) -> str:
    return f"{message}; {LIST_HINT}" if _a_list(message) else message


@dataclass
class BadLineLog:
    policy: str
    max_reports: int
    counts: dict[str, int] = field(default_factory=dict)
    reports: list[str] = field(default_factory=list)
    first: dict[str, str] = field(default_factory=dict)  # reason -> its first line's message

    def add(
        self, path: Path, part: Part, file_first_line: int, keep: np.ndarray | None = None
    ) -> None:
        """Record a part's bad lines (``keep``: the ones that count) whose first line is
        ``file_first_line`` of its file; raise :class:`criteo.BadLineError` under ``fail``."""
        lines, reasons = part.bad_lines, part.bad_reasons
        if keep is not None:
            lines, reasons = lines[keep], reasons[keep]
        if len(lines) == 0:
            return
        codes, first, n = np.unique(reasons, return_index=True, return_counts=True)
        for k in np.argsort(first):  # reasons in order of first occurrence, as a line-by-line log
            self.counts[REASONS[codes[k]]] = self.counts.get(REASONS[codes[k]], 0) + int(n[k])
        msg = {ln: f"{path}:{file_first_line + ln + 1}: {d}" for ln, d in part.details.items()}
        if self.policy == "fail":
            raise criteo.BadLineError(with_list_hint(msg[int(lines[0])]))
        for ln in lines[: max(0, self.max_reports - len(self.reports))]:
            self.reports.append(msg[int(ln)])
        for k in np.argsort(first):
            reason = REASONS[codes[k]]
            if reason not in self.first:
                self.first[reason] = msg.get(int(lines[first[k]])) or _any_of(msg, reason)

    def per_reason(self) -> str:
        """The counts, most frequent reason first, each with its first line's message."""
        return "; ".join(
            f"{reason}: {n} (first: {self.first[reason]})"
            for reason, n in sorted(self.counts.items(), key=lambda kv: -kv[1])
        )


def _any_of(msg: dict[int, str], reason: str) -> str:
    """A kept message of this reason (a part keeps its first of each reason and its first few)."""
    return next((m for m in msg.values() if f": {reason} (" in m), reason)


def why_no_training_lines(cfg: Any, plan: SplitPlan, bad: BadLineLog) -> str:
    """The one-line error when no good training line was found: which lines there were and why
    each kind was rejected (with its first line), plus what that usually means."""
    where = f"no valid training lines in {', '.join(map(str, plan.files))} (split={cfg.split})"
    if not bad.counts:
        if plan.kind == "day":
            return f"{where}: the training files have no lines"
        total = plan.bounds[2]
        if total == 0:
            return f"{where}: the input has no lines"
        return (
            f"{where}: {total} line(s) in all, and train_fraction={float(cfg.train_fraction):g} "
            "leaves none for training"
        )
    per_reason = bad.per_reason()
    hints = []
    if f"({criteo.NUM_FIELDS - 1} fields, expected" in bad.first.get(criteo.BAD_FIELDS, ""):
        hints.append(
            f"{criteo.NUM_FIELDS - 1} fields is a file without the label column, "
            "like Criteo's test files"
        )
    if re.search(r":1: ", bad.first.get(criteo.BAD_LABEL, "")):
        hints.append("line 1 looks like a header (Criteo files have none)")
    if _a_list(bad.first.get(criteo.BAD_HEX, "")):
        hints.append(LIST_HINT)
    hints.append("the input must be raw Criteo text: label, 13 integers, 26 hex ids, tab-separated")
    n_bad = sum(bad.counts.values())
    return f"{where}: all {n_bad} training lines are malformed. {per_reason}. ({'; '.join(hints)})"
