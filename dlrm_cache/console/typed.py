"""A setting written back for a person to type: ``key=value`` as one shell word that Hydra's
override grammar reads back as that string, whatever the value holds (a run directory with a
space, a comma, an ``=`` or a quote in its path); and the command itself, as this process was run
(:func:`invocation`, which `train` prints to point at `report`)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from pathlib import Path

_PLAIN = re.compile(r"[A-Za-z0-9_./@+-]+")  # neither the shell nor the override grammar reads these


def typed_override(key: str, value: object) -> str:
    """``key=value`` to type on a shell command line (quoted only where it has to be)."""
    text = str(value)
    if _PLAIN.fullmatch(text):
        return f"{key}={text}"
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    return shlex.quote(f'{key}="{quoted}"')


ARGV0: list[str] = []  # how this process was started (sys.argv[0]), before Hydra's argv replaces it


def invocation() -> str:
    """The command that runs dlrm-cache as this process was run, typed anywhere: ``dlrm-cache``
    when that is what PATH finds, else the script's absolute path (``.venv/bin/dlrm-cache`` with
    no venv active, torchrun's ``--no-python`` path), else ``<this python> -m dlrm_cache``."""
    argv0 = ARGV0[0] if ARGV0 else sys.argv[0]
    if Path(argv0).name == "dlrm-cache":
        script = os.path.abspath(argv0 if os.sep in argv0 else shutil.which(argv0) or argv0)
        on_path = shutil.which("dlrm-cache")
        return (
            "dlrm-cache" if on_path and os.path.abspath(on_path) == script else shlex.quote(script)
        )
    python = shutil.which(Path(sys.executable).name)
    if python and os.path.abspath(python) == os.path.abspath(sys.executable):
        return f"{Path(sys.executable).name} -m dlrm_cache"
    return f"{shlex.quote(sys.executable)} -m dlrm_cache"
