"""Trained runs of the real synth -> preprocess dataset, shared by the predict, export and
tensorboard tests.

One host run and one freq_cache run (with ``logger.tensorboard=true``), each with ``test=true``,
so the test split's metrics the run reported are there to compare predict with; and the host run's
checkpoint in the layout of a two-rank row-sharded one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from after_runs import Run, _train, train_overrides

from dlrm_cache.files.atomic import sha256_file
from dlrm_cache.train.saved import Checkpoint


@pytest.fixture(scope="session")
def host_run(processed_synth: Path, tmp_path_factory) -> Run:
    run = tmp_path_factory.mktemp("host") / "run"
    return Run(run, _train(train_overrides(processed_synth, run, [])))


@pytest.fixture(scope="session")
def cached_run(processed_synth: Path, tmp_path_factory) -> Run:
    """freq_cache (a small cache, rows moving), live TensorBoard scalars, a mid-run evaluation."""
    run = tmp_path_factory.mktemp("cached") / "run"
    extra = [
        "embedding=freq_cache",
        "embedding.cache_ratio=0.05",
        "embedding.lookahead=2",
        "eval_every=20",
        "logger.tensorboard=true",
    ]
    return Run(run, _train(train_overrides(processed_synth, run, extra)))


@pytest.fixture(scope="session")
def row_sharded_run(host_run: Run, tmp_path_factory) -> Run:
    """The host run's checkpoint laid out as two ranks write a row-sharded one: every table split
    at half its rows into ``C3:0-k.weight`` (tables-rank0.pt) and ``C3:k-n.weight``
    (tables-rank1.pt).

    (A real two-rank run costs half a minute of process start-up here; tests/parallel shows that
    such a run's checkpoint holds the one-rank tables, this the reading of its layout.)
    """
    src = host_run.path / "checkpoints" / "step_00000030"
    run = tmp_path_factory.mktemp("sharded") / "run"
    dst = run / "checkpoints" / src.name
    shutil.copytree(src, dst)
    meta = json.loads((dst / "meta.json").read_text())
    whole = Checkpoint(src).tables(sorted(meta["tables"]))
    pieces: list[dict[str, torch.Tensor]] = [{}, {}]
    for key, tensor in whole.items():
        table, field = key.split(".")
        half = tensor.shape[0] // 2
        pieces[0][f"{table}:0-{half}.{field}"] = tensor[:half].clone()
        pieces[1][f"{table}:{half}-{tensor.shape[0]}.{field}"] = tensor[half:].clone()
    (dst / "tables-rank0.pt").unlink()
    meta["tables"], meta["world_size"] = {}, 2
    for rank, part in enumerate(pieces):
        name = f"tables-rank{rank}.pt"
        torch.save(part, dst / name)
        meta["tables"].update({k: name for k in part})
        meta["files"][name] = (dst / name).stat().st_size
        meta["digests"][name] = sha256_file(dst / name)
    (dst / "meta.json").write_text(json.dumps(meta))
    return Run(run, host_run.summary)


@pytest.fixture(scope="session")
def raw_test_lines(processed_synth: Path) -> list[bytes]:
    """The raw lines that became the processed test split, from the synth file."""
    manifest = json.loads((processed_synth / "manifest.json").read_text())
    (source,) = manifest["sources"]
    lo, hi = manifest["split_spec"]["lines"]["test"]
    return Path(source).read_bytes().split(b"\n")[lo:hi]
