"""A setting written back for a person to type: ``key=value`` as one shell word that Hydra's
override grammar reads back as that string, whatever the value holds (a run directory with a
space, a comma, an ``=`` or a quote in its path)."""

from __future__ import annotations

import re
import shlex

_PLAIN = re.compile(r"[A-Za-z0-9_./@+-]+")  # neither the shell nor the override grammar reads these


def typed_override(key: str, value: object) -> str:
    """``key=value`` to type on a shell command line (quoted only where it has to be)."""
    text = str(value)
    if _PLAIN.fullmatch(text):
        return f"{key}={text}"
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    return shlex.quote(f'{key}="{quoted}"')
