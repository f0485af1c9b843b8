"""What a figure shows, as plain data: panels of lines.  report/series.py computes them from run files
(tests check the numbers there, without matplotlib); draw.py draws them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Line:
    label: str
    x: list[float]
    y: list[float]
    style: str = "o-"  # matplotlib format string: "o-" measured, "s--" predicted, "--" reference
    annotate: str | None = None  # format spec to write each value beside its point (few points)
    annotate_below: bool = False  # under the point: clear of a line drawn just above this one


@dataclass
class Panel:
    """One axes: its lines and how to label them (``xticks``: categorical x at 0..n-1)."""

    key: str
    title: str
    xlabel: str
    ylabel: str
    lines: list[Line]
    xscale: str = "linear"
    x_percent: bool = False  # x values are fractions shown as percentages
    xticks: list[str] | None = None
    hlines: list[tuple[str, float]] = field(default_factory=list)  # (label, y) reference lines
    xlim: tuple[float, float] | None = None
    y_from_zero: bool = False  # amounts compared across runs: a cropped axis would exaggerate
