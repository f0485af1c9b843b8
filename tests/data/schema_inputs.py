"""Raw inputs written by the schema tests themselves (not by synth, whose output may change)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np


def criteo_lines(n: int, seed: int = 7) -> bytes:
    """``n`` Criteo lines from a fixed generator, a few of them malformed (every reason)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        label = str(int(rng.random() < 0.3))
        dense = ["" if rng.random() < 0.1 else str(int(rng.integers(-3, 5000))) for _ in range(13)]
        sparse = [
            "" if rng.random() < 0.05 else f"{int(rng.zipf(1.3)) % (1 << 32):08x}"
            for _ in range(26)
        ]
        fields = [label, *dense, *sparse]
        if k % 97 == 5:
            fields[3] = "x7"
        if k % 89 == 7:
            fields = fields[:-1]
        if k % 101 == 9:
            fields[0] = "2"
        if k % 103 == 11:
            fields[20] = "zz"
        out.append("\t".join(fields))
    return ("\n".join(out) + "\n").encode()


def dataset_digests(out: Path) -> dict[str, str]:
    """sha256 of every file of a processed dataset but preprocess.json (it names the input's
    path); the manifest with its ``sources`` (paths) left out."""
    digests = {}
    for p in sorted(out.rglob("*")):
        rel = str(p.relative_to(out))
        if not p.is_file() or rel == "preprocess.json":
            continue
        data = p.read_bytes()
        if rel == "manifest.json":
            m = json.loads(data)
            m.pop("sources")
            data = json.dumps(m, indent=2).encode()
        digests[rel] = hashlib.sha256(data).hexdigest()
    return digests
