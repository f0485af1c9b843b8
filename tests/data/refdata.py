"""Helpers of the data tests: tiny configs and an independent plain-Python/pandas reference of the
preprocessing policy (written from the spec, not from the implementation).

A plain module (not conftest.py) so test files can import it; fixtures live in conftest.py."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from dlrm_cache.data.config import PreprocessConfig, SynthConfig
from dlrm_cache.data.format import DENSE_NAMES, LABEL, MISSING_ID, SPARSE_NAMES, Manifest
from dlrm_cache.data.synth import synth

_INT = re.compile(r"-?[0-9]+")  # and the value fits in int64
_HEX = re.compile(r"[0-9a-fA-F]{1,8}")

# Hand-written odd lines: (text, reason or None if valid).  Ids chosen to also appear in synth data
# is not needed: unseen ids must map to the rare row.
GOOD = "1\t5\t-3\t\t0\t99999999999\t7\t7\t7\t7\t7\t7\t7\t7\t" + "\t".join(
    ["0000000a", "", "ABCDEF12", "f", "1", "00000000"] + ["deadbeef"] * 20
)
EDGE_LINES = [
    (GOOD, None),
    (GOOD.replace("\t5\t", "\tx7\t", 1), "non-integer in an integer field"),
    ("2" + GOOD[1:], "label not 0/1"),
    ("\t" + GOOD[2:], "label not 0/1"),  # empty label
    ("\t".join(GOOD.split("\t")[1:]), "wrong field count"),  # 39 fields (test.txt style)
    (GOOD + "\textra", "wrong field count"),
    ("", "wrong field count"),  # empty line
    (GOOD.replace("0000000a", "zz", 1), "categorical not 1-8 hex digits"),
    (GOOD.replace("0000000a", "123456789", 1), "categorical not 1-8 hex digits"),
    (GOOD.replace("\t5\t", "\t+5\t", 1), "non-integer in an integer field"),
    (GOOD.replace("\t5\t", "\t1.5\t", 1), "non-integer in an integer field"),
    ("0" + GOOD[1:], None),
]


def tiny_synth(out: Path, **kw) -> Path:
    """A few thousand lines with small tables (many repeats, so min_count matters)."""
    args = dict(
        output=str(out),
        lines=3000,
        files=1,
        seed=1,
        cardinality_scale=0.0005,
        min_cardinality=8,
        progress=False,
    )
    args.update(kw)
    return synth(SynthConfig(**args))


def pp_config(inp: Path, out: Path, **kw) -> PreprocessConfig:
    """Small blocks and shards so streaming, caching and sharding paths all run."""
    args = dict(
        input=str(inp), output=str(out), chunk_bytes=64 << 10, rows_per_shard=700, progress=False
    )
    args.update(kw)
    return PreprocessConfig(**args)


@dataclass
class RefLine:
    file: int
    lineno: int  # 0-based within its file
    label: float
    dense: list[float]
    ids: list[int]


def ref_parse(paths: list[Path]) -> tuple[list[list[RefLine]], dict[str, int], list[int]]:
    """Per file: valid lines; bad-line counts per reason; physical lines per file."""
    import gzip

    good: list[list[RefLine]] = []
    bad: dict[str, int] = {}
    sizes = []
    for f, path in enumerate(paths):
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        text = raw.decode("latin-1")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the final newline ends the last line
        lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
        if lines and lines[0].startswith("\xef\xbb\xbf"):  # a UTF-8 byte order mark (as latin-1)
            lines[0] = lines[0][3:]
        sizes.append(len(lines))
        out = []
        for k, line in enumerate(lines):
            reason = _ref_reason(line)
            if reason:
                bad[reason] = bad.get(reason, 0) + 1
                continue
            x = line.split("\t")
            dense = [math.log1p(max(int(v), 0)) if v else 0.0 for v in x[1:14]]
            ids = [int(v, 16) if v else MISSING_ID for v in x[14:]]
            out.append(RefLine(f, k, float(x[0]), dense, ids))
        good.append(out)
    return good, bad, sizes


def _ref_reason(line: str) -> str | None:
    """``line``: one line's bytes as latin-1 text (one character per byte)."""
    if len(line) > 64 * 1024:
        return "line too long"
    x = line.split("\t")
    if len(x) != 40:
        return "wrong field count"
    if x[0] not in ("0", "1"):
        return "label not 0/1"
    if any(v and not (_INT.fullmatch(v) and -(2**63) <= int(v) < 2**63) for v in x[1:14]):
        return "non-integer in an integer field"
    if any(v and not _HEX.fullmatch(v) for v in x[14:]):
        return "categorical not 1-8 hex digits"
    return None


def ref_dataset(
    per_file: list[list[RefLine]], split_of, min_count: int = 1, hash_modulus: int = 0
) -> tuple[dict[str, pd.DataFrame], dict[str, list[RefLine]]]:
    """Expected counts (feature -> DataFrame[id, count] in rank order) and lines per split."""
    by_split: dict[str, list[RefLine]] = {"train": [], "val": [], "test": []}
    for lines in per_file:
        for ln in lines:
            by_split[split_of(ln)].append(ln)

    def h(i: int) -> int:
        return i if (hash_modulus <= 0 or i == MISSING_ID) else i % hash_modulus

    counts = {}
    train = pd.DataFrame([[h(i) for i in ln.ids] for ln in by_split["train"]], columns=SPARSE_NAMES)
    for name in SPARSE_NAMES:
        vc = train[name].value_counts().rename_axis("id").reset_index(name="count")
        vc = vc.sort_values(["count", "id"], ascending=[False, True], kind="stable")
        counts[name] = vc[vc["count"] >= min_count].reset_index(drop=True)
    return counts, by_split


def expected_rows(
    lines: list[RefLine], counts: dict[str, pd.DataFrame], hash_modulus: int = 0
) -> np.ndarray:
    """(n, 26) expected ranks: rank if kept, else the rare row (table_size - 1)."""
    out = np.empty((len(lines), len(SPARSE_NAMES)), dtype=np.int64)
    for j, name in enumerate(SPARSE_NAMES):
        rank = {int(i): r for r, i in enumerate(counts[name]["id"])}
        rare = len(rank)
        for k, ln in enumerate(lines):
            i = ln.ids[j]
            if hash_modulus > 0 and i != MISSING_ID:
                i %= hash_modulus
            out[k, j] = rank.get(i, rare)
    return out


def read_split(root: Path, manifest: Manifest, split: str) -> pd.DataFrame:
    info = manifest.splits[split]
    frames = [pq.read_table(root / s).to_pandas() for s in info.shards]
    cols = [LABEL, *DENSE_NAMES, *SPARSE_NAMES]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def check_dataset(root: Path, manifest: Manifest, counts, by_split, hash_modulus: int = 0) -> None:
    """Every stats row and every shard value against the reference."""
    stats = pq.read_table(root / "stats/counts.parquet").to_pandas()
    assert list(stats["feature"].unique()) == [n for n in SPARSE_NAMES if len(counts[n])]
    for j, name in enumerate(SPARSE_NAMES):
        got = stats[stats["feature"] == name][["id", "count"]].reset_index(drop=True)
        pd.testing.assert_frame_equal(got, counts[name].astype("int64"), check_names=False)
        assert manifest.table_sizes[j] == len(counts[name]) + 1
    for split in ("train", "val", "test"):
        df = read_split(root, manifest, split)
        lines = by_split[split]
        assert manifest.splits[split].rows == len(df) == len(lines)
        assert sum(manifest.splits[split].shard_rows) == len(df)
        if not lines:
            continue
        assert (
            df[LABEL].dtype == np.float32
            and df["I1"].dtype == np.float32
            and df["C1"].dtype == np.int32
        )
        np.testing.assert_array_equal(df[LABEL].to_numpy(), [ln.label for ln in lines])
        dense = df[DENSE_NAMES].to_numpy()
        assert np.isfinite(dense).all()
        np.testing.assert_allclose(
            dense, np.array([ln.dense for ln in lines], dtype=np.float32), rtol=1e-6
        )
        np.testing.assert_array_equal(
            df[SPARSE_NAMES].to_numpy(), expected_rows(lines, counts, hash_modulus)
        )
        assert (df[SPARSE_NAMES].to_numpy() < np.array(manifest.table_sizes)).all()
