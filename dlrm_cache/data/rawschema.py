"""``schema.yaml`` beside raw files: their layout, written as a ``schema=`` file is (docs/data.md "Your own
dataset"), so that `preprocess` of that directory needs no ``schema=``.

`synth` writes one when its output has multi-hot columns (``multi_hot_sizes``: Criteo's layout
with those columns' ids joined by ``|``); `preprocess` reads it when ``schema=`` is left at Criteo's
default, and says so.  A ``schema=`` given on the command line wins over the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..files.atomic import atomic_write_text
from .config import SchemaConfig
from .schema import Schema, SchemaError, resolve

RAW_SCHEMA = "schema.yaml"
_SYNTH_MARK = "# written by dlrm-cache synth"


def write_synth_schema(out: Path, multi_hot: list[str]) -> None:
    """``out/schema.yaml`` naming synth's multi-hot columns (none: a file synth wrote is removed)."""
    path = out / RAW_SCHEMA
    if not multi_hot:
        if path.is_file() and path.read_text().startswith(_SYNTH_MARK):
            path.unlink()
        return
    lines = [
        f"{_SYNTH_MARK}: Criteo's layout, these columns' ids joined by '|' (read by preprocess)",
        "format: criteo",
        "sparse:",
        *(f"  - {{name: {name}, multi_hot: true}}" for name in multi_hot),
    ]
    atomic_write_text(path, "\n".join(lines) + "\n")


def beside(inp: Path, node: Any) -> Path | None:
    """The ``schema.yaml`` of input ``inp`` (a directory, or a file's directory) when ``node``, the
    command line's schema, is Criteo's default; else None."""
    if node is not None and _plain(node) != _plain(SchemaConfig()):
        return None
    path = (inp if inp.is_dir() else inp.parent) / RAW_SCHEMA
    return path if path.is_file() else None


def load(path: Path, hash_modulus: int) -> Schema:
    """The schema a ``schema.yaml`` describes; a SchemaError naming the file if it cannot."""
    try:
        node = OmegaConf.merge(OmegaConf.structured(SchemaConfig), OmegaConf.load(path))
        return resolve(node, hash_modulus)
    except (OmegaConfBaseException, SchemaError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SchemaError(f"{path}: {first} (or give schema= on the command line)") from None


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(OmegaConf.structured(node), enum_to_str=True)
