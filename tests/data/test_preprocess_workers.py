"""preprocess gives the same dataset, byte for byte, for every worker count, block size and number
of torchrun ranks (2 gloo processes through the real torchrun); a rank killed with SIGKILL fails the
job and leaves the output absent or complete."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from launching import TORCHRUN_2, child_env

import dlrm_cache.data.preprocess as pp
from dlrm_cache.data.format import MANIFEST, Manifest
from dlrm_cache.data.preprocess import idtable

from refdata import pp_config, tiny_synth


def _tree(d: Path) -> dict[str, bytes]:
    """Every file of a dataset directory, by relative path (stats, shards, manifest, settings)."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def raw3(tmp_path_factory) -> Path:
    """Three day files with 2% malformed lines (every reason), CRLF on some lines."""
    d = tiny_synth(tmp_path_factory.mktemp("raw3"), lines=9000, files=3, bad_line_rate=0.02)
    day = d / "day_1"
    lines = day.read_bytes().split(b"\n")
    day.write_bytes(
        b"\n".join(ln + b"\r" if k % 5 == 0 and ln else ln for k, ln in enumerate(lines))
    )
    (d / "oracle.json").unlink()
    return d


@pytest.mark.parametrize(
    "settings",
    [
        dict(),  # split=fraction over the three files
        dict(split="day", hash_modulus=40_000_000, min_count=2),  # the MLPerf 1TB setting
    ],
)
def test_identical_for_every_worker_count(raw3: Path, tmp_path: Path, capsys, settings) -> None:
    trees, outputs = [], []
    for workers, chunk in ((1, 1 << 20), (2, 16 << 10), (3, 5000)):
        out = tmp_path / f"w{workers}"
        pp.preprocess(pp_config(raw3, out, workers=workers, chunk_bytes=chunk, **settings))
        trees.append(_tree(out))
        # The reports and the summary, without the timing lines.
        outputs.append(
            [
                ln
                for ln in capsys.readouterr().out.splitlines()
                if "second" not in ln and " lines/s" not in ln
            ]
        )
    assert sum(Manifest.load(tmp_path / "w1").bad_lines.values()) > 100
    assert len(trees[0]) > 10 and trees[1] == trees[0] and trees[2] == trees[0]
    assert any("skipped" in ln for ln in outputs[0]) and outputs[1] == outputs[0] == outputs[2]


def _torchrun(raw: Path, out: Path, cwd: Path, *extra: str) -> subprocess.Popen:
    cmd = [
        *TORCHRUN_2,
        "preprocess",
        f"input={raw}",
        f"output={out}",
        "workers=1",
        "chunk_bytes=20000",
        "rows_per_shard=700",
        "progress=false",
        *extra,
    ]
    env = child_env(OMP_NUM_THREADS="1")
    return subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_torchrun_two_ranks_identical_to_one_process(raw3: Path, tmp_path: Path) -> None:
    one = tmp_path / "one"
    pp.preprocess(pp_config(raw3, one, workers=1, split="day"))
    proc = _torchrun(raw3, tmp_path / "two", tmp_path, "split=day")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "1 worker(s) x 2 rank(s)" in out
    assert _tree(tmp_path / "two") == _tree(one)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.parametrize("modulus", [0, 1000])
def test_id_table_matches_a_dict(tmp_path: Path, modulus: int) -> None:
    rng = np.random.default_rng(modulus)
    keys = np.unique(rng.integers(-1, modulus or 2**32, 700))
    keys = rng.permutation(keys)
    rows = rng.permutation(len(keys))
    idtable.build(str(tmp_path / "t"), keys, rows, len(keys), modulus)
    queries = np.concatenate([keys, rng.integers(-1, modulus or 2**32, 5000)])
    got = np.empty(len(queries), np.int32)
    idtable.IdTable(str(tmp_path / "t"), len(keys)).lookup(queries, got)
    want = dict(zip(keys.tolist(), rows.tolist()))
    assert got.tolist() == [want.get(q, len(keys)) for q in queries.tolist()]


def test_torchrun_rank_killed_leaves_output_absent_or_complete(raw3: Path, tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    pp.preprocess(pp_config(raw3, ref, workers=1))
    out = tmp_path / "ds"
    proc = _torchrun(raw3, out, tmp_path)
    rng = random.Random()  # a random point each run; the seed is printed on failure
    seed = random.randrange(1 << 30)
    rng.seed(seed)
    print(f"kill seed {seed}")
    deadline = time.monotonic() + 120
    ranks: list[int] = []
    while len(ranks) < 2 and time.monotonic() < deadline:  # the agent's two rank processes
        ranks = sorted(_children(proc.pid))
        time.sleep(0.01)
    assert len(ranks) == 2, "torchrun did not start two ranks"
    time.sleep(rng.uniform(0, 8.0))  # a random point: importing, parsing, counting, writing, done
    victim = ranks[rng.randrange(2)]
    try:
        os.kill(victim, signal.SIGKILL)
    except ProcessLookupError:
        pass  # already finished
    proc.communicate(timeout=300)
    if out.exists():  # never half a dataset
        assert (out / MANIFEST).exists()
        assert _tree(out) == _tree(ref)
    # and the next run repairs whatever the kill left
    m = pp.preprocess(pp_config(raw3, out, workers=2, overwrite=True))
    assert m == Manifest.load(ref) and _tree(out) == _tree(ref)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".ds.")] == []
