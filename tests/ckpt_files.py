"""Editing a checkpoint's file as a test's attacker or repair does: its size and sha256 recorded in
meta.json to match (what the checkpoint's own checks then compare against)."""

from __future__ import annotations

import json
from pathlib import Path

from dlrm_cache.files.atomic import sha256_file


def record_file(ckpt: Path, name: str) -> None:
    """meta.json records ``ckpt/name`` as it is now: its size and, where digests are recorded
    (every checkpoint written since they were), its sha256."""
    meta = json.loads((ckpt / "meta.json").read_text())
    meta.setdefault("files", {})[name] = (ckpt / name).stat().st_size
    if "digests" in meta:
        meta["digests"][name] = sha256_file(ckpt / name)
    (ckpt / "meta.json").write_text(json.dumps(meta))
