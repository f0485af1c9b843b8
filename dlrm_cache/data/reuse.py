"""Reuse an output if it is up to date: the one rule `synth` and `preprocess` share.

An output directory records the settings it was built from in a JSON file written after
everything else (``oracle.json`` for synth, ``preprocess.json`` next to the manifest for
preprocess).  It is reused when that record holds exactly the settings asked for now and the
output is complete; otherwise the command rebuilds it (synth) or refuses to overwrite it without
being told (preprocess).  Leftovers of an earlier or killed run are removed by :func:`remove_stale`
so no reader ever picks them up.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Recorded:
    """What an output's record says compared with the settings asked for now."""

    found: bool  # a readable record exists
    matches: bool  # ... and holds exactly the settings asked for
    changed: list[str] = field(default_factory=list)  # keys that differ (all keys if not found)


def compare(record: Path, settings: dict[str, Any], key: str | None = None) -> Recorded:
    """Compare ``settings`` with the record's (its ``key`` entry when given, else the whole
    file)."""
    try:
        recorded = json.loads(record.read_text())
        if key is not None:
            recorded = recorded.get(key)
    except (OSError, ValueError, AttributeError):
        recorded = None
    if not isinstance(recorded, dict):
        return Recorded(False, False, sorted(settings))
    changed = sorted(k for k in set(settings) | set(recorded) if recorded.get(k) != settings.get(k))
    return Recorded(True, not changed, changed)


def remove_stale(directory: Path, is_stale: Callable[[Path], bool]) -> None:
    """Delete the entries of ``directory`` that ``is_stale`` picks (files or whole directories)."""
    if not directory.is_dir():
        return
    for p in directory.iterdir():
        if is_stale(p):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
