"""Nothing lost, nobody in: kill -9 during `train` (also inside a checkpoint save), crafted and damaged
checkpoints, resumes that do not fit, a full disk.

Runs are child processes forked from a forkserver that has imported dlrm_cache once (a fresh
interpreter costs ~5 s of imports; a fork costs milliseconds), so a kill -9 is a real SIGKILL of a
real training process.  Kill points inside a save are the file-system calls (mkdir, fsync, rename,
replace, unlink, rmdir) the save makes: the child kills itself just before the k-th one.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import DictConfig

from dlrm_cache.train.checkpoint import Checkpoint, find_checkpoint

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["dlrm_cache.train.loop", "test_train"])
_FS_CALLS = ("mkdir", "fsync", "rename", "replace", "unlink", "rmdir")


def _compose(data: Path, extra: list[str]) -> DictConfig:
    from test_train import compose_train

    return compose_train([
        f"data.path={data}", "run_dir=unset", "device=cpu", "progress=false",
        "data.batch_size=128", "data.eval_batch_size=1000", "model.embedding_dim=8",
        "model.bottom_mlp=[16]", "model.top_mlp=[16]", "log_every=2", "checkpoint_every=2",
        "optim.sparse.lr=0.1", "optim.dense.lr=0.05", *extra,
    ])


def at(cfg: DictConfig, run_dir: Path, resume: Path | None = None) -> DictConfig:
    """``cfg`` writing to ``run_dir`` (and resuming from ``resume``)."""
    out = cfg.copy()
    out.run_dir, out.resume = str(run_dir), str(resume) if resume else None
    return out


def _child(cfg: DictConfig, stderr: str, kill_at: tuple[int, int] | None, count_to: str | None) -> None:
    """Train as ``cfg`` says in this process; ``kill_at=(save, op)``: SIGKILL just before the
    op-th file-system call of the save-th checkpoint save (both from 0); ``count_to``: write how
    many such calls each save made."""
    fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    torch.set_num_threads(1)  # several children and pytest share two cores
    import dlrm_cache.train.loop as loop

    if kill_at is not None or count_to is not None:
        counts: list[int] = []
        inside = [False]
        real_save = loop.save_checkpoint

        def save(*a, **k):
            counts.append(0)
            inside[0] = True
            try:
                return real_save(*a, **k)
            finally:
                inside[0] = False
                if count_to:
                    Path(count_to).write_text(json.dumps(counts))

        def hook(name):
            real = getattr(os, name)

            def call(*a, **k):
                if inside[0]:
                    if kill_at == (len(counts) - 1, counts[-1]):
                        os.kill(os.getpid(), signal.SIGKILL)
                    counts[-1] += 1
                return real(*a, **k)

            return call

        loop.save_checkpoint = save
        for name in _FS_CALLS:
            setattr(os, name, hook(name))
    loop.train(cfg)


def run(cfg: DictConfig, tmp: Path, kill_at=None, kill_after: float | None = None,
        count_to: Path | None = None) -> tuple[int, str]:
    """(exit code, stderr) of a training child; -9 when it was killed."""
    err = tmp / f"stderr-{time.monotonic_ns()}"
    p = _CTX.Process(target=_child, args=(cfg, str(err), kill_at, str(count_to) if count_to else None))
    p.start()
    p.join(kill_after)
    if p.is_alive():
        os.kill(p.pid, signal.SIGKILL)
        p.join()
    return p.exitcode, err.read_text() if err.exists() else ""


def params(ckpt: Path) -> dict[str, torch.Tensor]:
    c = Checkpoint(ckpt)
    out = {f"dense.{k}": v for k, v in c.dense["model"].items()}
    out.update(c.tables(list(c.meta["tables"])))
    for i, s in c.dense["optimizer"]["state"].items():
        out.update({f"opt.{i}.{k}": v for k, v in s.items() if isinstance(v, torch.Tensor)})
    return out


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def log(run_dir: Path) -> list[tuple]:
    """The metrics.jsonl records that must not depend on interruptions (not: times, start records)."""
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] in ("train", "checkpoint", "eval"):
            out.append((r["kind"], r["step"], r.get("loss"), r.get("auc"), Path(r.get("path", "")).name))
    return out


def left_behind(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> tuple[DictConfig, Path, float]:
    """(config of a 12-step run with checkpoints every 2 steps, its uninterrupted run, its wall time)."""
    from conftest import write_dataset

    tmp = tmp_path_factory.mktemp("reliability")
    write_dataset(tmp / "ds", {"train": 6000, "val": 1000}, [50, 200, 1000, 30, 500])
    cfg = _compose(tmp / "ds", ["max_steps=12"])
    code, err = run(at(cfg, tmp / "warm-up"), tmp)  # starts the forkserver: not part of the wall time
    assert code == 0, err
    t0 = time.perf_counter()
    code, err = run(at(cfg, tmp / "straight"), tmp)
    assert code == 0, err
    return cfg, tmp / "straight", time.perf_counter() - t0


def test_kill_at_every_point_of_replacing_a_checkpoint_keeps_one(straight, tmp_path: Path):
    """Saving a step that already exists (a resume that does no step): killed before each of the
    save's file-system calls, the run directory still holds a complete step 12, equal to the old."""
    cfg, base, _ = straight
    want = params(base / "checkpoints" / "step_00000012")
    shutil.copytree(base, tmp_path / "count")
    code, err = run(at(cfg, tmp_path / "count", tmp_path / "count"), tmp_path, count_to=tmp_path / "ops")
    assert code == 0, err
    (n,) = json.loads((tmp_path / "ops").read_text())
    assert n >= 6  # mkdir, fsyncs, the renames, the old directory's removal
    for k in range(n):
        d = tmp_path / f"kill{k}"
        shutil.copytree(base, d)
        code, _ = run(at(cfg, d, d), tmp_path, kill_at=(0, k))
        assert code == -signal.SIGKILL, k
        found = find_checkpoint(str(d))
        assert found.name in ("step_00000012", ".step_00000012.old"), (k, found)
        assert_same(want, params(found))
        # the next save puts everything in order
        code, err = run(at(cfg, d, d), tmp_path)
        assert code == 0, (k, err)
        assert left_behind(d) == [], k
        assert_same(want, params(d / "checkpoints" / "step_00000012"))


def test_kill_inside_a_save_then_resume_is_bit_identical(straight, tmp_path: Path):
    """Killed before each file-system call of the second checkpoint save (step 4), resumed in the same run directory: the same parameters, optimizer state and
    metrics.jsonl records as the uninterrupted run, and nothing left behind."""
    cfg, base, _ = straight
    want, want_log = params(base / "checkpoints" / "step_00000012"), log(base)
    code, err = run(at(cfg, tmp_path / "count"), tmp_path, count_to=tmp_path / "ops")
    assert code == 0, err
    n = json.loads((tmp_path / "ops").read_text())[1]
    for k in range(n):
        d = tmp_path / f"kill{k}"
        code, _ = run(at(cfg, d), tmp_path, kill_at=(1, k))
        assert code == -signal.SIGKILL, k
        code, err = run(at(cfg, d, d), tmp_path)
        assert code == 0, (k, err)
        assert_same(want, params(d / "checkpoints" / "step_00000012"))
        assert log(d) == want_log, k
        assert left_behind(d) == [], k


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kill_at_a_random_time_then_resume_is_bit_identical(straight, tmp_path: Path, seed: int):
    """kill -9 at a random time of the run (start-up, steps, checkpoint saves, evaluation), then
    resumed (or, killed before the first checkpoint, rerun): the uninterrupted run's results."""
    cfg, base, wall = straight
    want, want_log = params(base / "checkpoints" / "step_00000012"), log(base)
    d = tmp_path / "run"
    delay = float(np.random.default_rng(seed).uniform(0.1, wall))
    code, _ = run(at(cfg, d), tmp_path, kill_after=delay)
    if code == 0:  # a loaded machine: the kill came too late (wall time is of another run)
        pytest.skip(f"the run finished within {delay:.2f} s")
    assert code == -signal.SIGKILL
    resumable = bool(_complete_steps(d))
    code, err = run(at(cfg, d, d if resumable else None), tmp_path)
    assert code == 0, err
    assert_same(want, params(d / "checkpoints" / "step_00000012"))
    if resumable:
        assert log(d) == want_log


def _complete_steps(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.glob("checkpoints/*step_*") if (p / "meta.json").is_file())
