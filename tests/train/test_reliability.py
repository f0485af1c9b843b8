"""Nothing lost, nobody in: kill -9 during `train` (also inside a checkpoint save), crafted and damaged
checkpoints, resumes that do not fit, a full disk.

Runs are child processes forked from a forkserver that has imported dlrm_cache once (a fresh
interpreter costs ~5 s of imports; a fork costs milliseconds), so a kill -9 is a real SIGKILL of a
real training process.  Kill points inside a save are the file-system calls (mkdir, fsync, rename,
replace, unlink, rmdir) the save makes: the child kills itself just before the k-th one.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from ckpt_files import record_file
from launching import ForkedCli, forkserver
from omegaconf import DictConfig
from test_train import _params as params
from tiny import TINY_MODEL

from dlrm_cache.train.checkpoint import find_checkpoint

_CTX = forkserver()
_FS_CALLS = ("mkdir", "fsync", "rename", "replace", "unlink", "rmdir")


def _compose(data: Path, extra: list[str]) -> DictConfig:
    from test_train import SMALL, compose_train

    return compose_train(
        [f"data.path={data}", "run_dir=unset", *SMALL, "checkpoint_every=2", *extra]
    )


def at(cfg: DictConfig, run_dir: Path, resume: Path | None = None) -> DictConfig:
    """``cfg`` writing to ``run_dir`` (and resuming from ``resume``)."""
    out = cfg.copy()
    out.run_dir, out.resume = str(run_dir), str(resume) if resume else None
    return out


def _child(
    cfg: DictConfig,
    stderr: str,
    kill_at: tuple[int, int] | None,
    count_to: str | None,
    full_at: int | None = None,
) -> None:
    """Train as ``cfg`` says in this process; ``kill_at=(save, op)``: SIGKILL just before the
    op-th file-system call of the save-th checkpoint save (both from 0); ``count_to``: write how
    many such calls each save made; ``full_at``: from the start of that save on, the kernel
    refuses to grow a file past 1000 bytes (RLIMIT_FSIZE: EFBIG, as a full disk gives ENOSPC)."""
    fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    torch.set_num_threads(1)  # several children and pytest share two cores
    import dlrm_cache.train.build as build
    import dlrm_cache.train.loop as loop

    if kill_at is not None or count_to is not None or full_at is not None:
        counts: list[int] = []
        inside = [False]
        real_save = build.save_checkpoint

        def save(*a, **k):
            counts.append(0)
            if full_at == len(counts) - 1:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
            inside[0] = True
            try:
                return real_save(*a, **k)
            finally:
                inside[0] = False
                resource.setrlimit(
                    resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
                )
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

        build.save_checkpoint = save  # TrainingRun.checkpoint calls it
        for name in _FS_CALLS:
            setattr(os, name, hook(name))
    loop.train(cfg)


def run(
    cfg: DictConfig,
    tmp: Path,
    kill_at=None,
    kill_after: float | None = None,
    count_to: Path | None = None,
    full_at: int | None = None,
) -> tuple[int, str]:
    """(exit code, stderr) of a training child; -9 when it was killed."""
    err = tmp / f"stderr-{time.monotonic_ns()}"
    p = _CTX.Process(
        target=_child, args=(cfg, str(err), kill_at, str(count_to) if count_to else None, full_at)
    )
    p.start()
    p.join(kill_after)
    if p.is_alive():
        os.kill(p.pid, signal.SIGKILL)
        p.join()
    return p.exitcode, err.read_text() if err.exists() else ""


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
            out.append(
                (r["kind"], r["step"], r.get("loss"), r.get("auc"), Path(r.get("path", "")).name)
            )
    return out


def left_behind(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def straight(tmp_path_factory, dataset_writer) -> tuple[DictConfig, Path, float]:
    """(config of a 12-step run with checkpoints every 2 steps, its uninterrupted run, its wall time)."""
    tmp = tmp_path_factory.mktemp("reliability")
    dataset_writer(tmp / "ds", {"train": 6000, "val": 1000}, [50, 200, 1000, 30, 500])
    cfg = _compose(tmp / "ds", ["max_steps=12"])
    code, err = run(
        at(cfg, tmp / "warm-up"), tmp
    )  # starts the forkserver: not part of the wall time
    assert code == 0, err
    t0 = time.perf_counter()
    code, err = run(at(cfg, tmp / "straight"), tmp)
    assert code == 0, err
    return cfg, tmp / "straight", time.perf_counter() - t0


def test_kill_at_every_point_of_replacing_a_checkpoint_keeps_one(straight, tmp_path: Path):
    """Saving a step that already exists (a resume that does no step: of a run stopped before its
    final evaluation, which it then does): killed before each of the save's file-system calls,
    the run directory still holds a complete step 12, equal to the old."""
    cfg, base, _ = straight
    want = params(base / "checkpoints" / "step_00000012")
    shutil.copytree(base, tmp_path / "count")
    unfinish(tmp_path / "count")
    code, err = run(
        at(cfg, tmp_path / "count", tmp_path / "count"), tmp_path, count_to=tmp_path / "ops"
    )
    assert code == 0, err
    (n,) = json.loads((tmp_path / "ops").read_text())
    assert n >= 6  # mkdir, fsyncs, the renames, the old directory's removal
    for k in range(n):
        d = tmp_path / f"kill{k}"
        shutil.copytree(base, d)
        unfinish(d)
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


def unfinish(run_dir: Path) -> None:
    """The run as a signal during its final evaluation leaves it: no summary (a resume of a
    finished run is refused: it would train nothing)."""
    (run_dir / "summary.json").unlink()


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
    if (d / "summary.json").is_file():  # killed after its last write: finished, nothing to resume
        assert_same(want, params(d / "checkpoints" / "step_00000012"))
        return
    resumable = bool(_complete_steps(d))
    again = at(cfg, d, d if resumable else None)
    again.overwrite = not resumable  # the killed run's files (no checkpoint to resume) make way
    code, err = run(again, tmp_path)
    assert code == 0, err
    assert_same(want, params(d / "checkpoints" / "step_00000012"))
    if resumable:
        assert log(d) == want_log


def _complete_steps(run_dir: Path) -> list[str]:
    return sorted(
        p.name for p in run_dir.glob("checkpoints/*step_*") if (p / "meta.json").is_file()
    )


# --------------------------------------------------------------------------- hostile and damaged input
class _Payload:
    """Unpickling this runs code: it creates the file ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _set_size(ckpt: Path, name: str) -> None:
    """What an attacker also does: make meta.json's recorded size and sha256 match the crafted
    file."""
    record_file(ckpt, name)


def _crafted_torch_dense(ckpt: Path, marker: Path) -> str:
    torch.save({"model": _Payload(marker), "optimizer": {}}, ckpt / "dense.pt")
    _set_size(ckpt, "dense.pt")
    return "dense.pt: refused"


def _crafted_pickle_dense(ckpt: Path, marker: Path) -> str:
    with open(ckpt / "dense.pt", "wb") as f:
        pickle.dump({"model": _Payload(marker)}, f)
    _set_size(ckpt, "dense.pt")
    return "dense.pt: refused"


def _crafted_tables(ckpt: Path, marker: Path) -> str:
    torch.save({"C1.weight": _Payload(marker)}, ckpt / "tables-rank0.pt")
    _set_size(ckpt, "tables-rank0.pt")
    return "tables-rank0.pt: refused"


def _truncate(name: str, keep_size_record: bool = True):
    def damage(ckpt: Path, marker: Path) -> str:
        data = (ckpt / name).read_bytes()
        (ckpt / name).write_bytes(data[: len(data) // 2])
        if not keep_size_record:  # a checkpoint whose meta.json records no sizes
            meta = json.loads((ckpt / "meta.json").read_text())
            meta.pop("files", None)
            (ckpt / "meta.json").write_text(json.dumps(meta))
        return (
            f"{name}: "
            if keep_size_record
            else "meta.json: not a dlrm-cache checkpoint's meta.json (no 'files')"
        )

    return damage


def _garbage_meta(ckpt: Path, marker: Path) -> str:
    (ckpt / "meta.json").write_text('{"step": 12, "tables": ')
    return "meta.json: not a dlrm-cache checkpoint"


def _missing_tables(ckpt: Path, marker: Path) -> str:
    (ckpt / "tables-rank0.pt").unlink()
    return "tables-rank0.pt: missing"


def _optimizer_state(change):
    """A dense.pt whose optimizer state ``change`` (state dict -> state dict) made another one's."""

    def damage(ckpt: Path, marker: Path) -> str:
        dense = torch.load(ckpt / "dense.pt", weights_only=True)
        dense["optimizer"] = change(dense["optimizer"])
        torch.save(dense, ckpt / "dense.pt")
        _set_size(ckpt, "dense.pt")
        return "dense.pt: its optimizer state is not optim.dense.name=adagrad's"

    return damage


def _as_adam(o: dict) -> dict:
    return {
        **o,
        "state": {i: {"step": s["step"], "exp_avg": s["sum"]} for i, s in o["state"].items()},
    }


def _cut_sums(o: dict) -> dict:
    return {**o, "state": {i: {**s, "sum": s["sum"][:1]} for i, s in o["state"].items()}}


DAMAGE = {
    "no optimizer state": _optimizer_state(lambda o: {}),
    "no parameter group": _optimizer_state(lambda o: {"state": {}, "param_groups": []}),
    "another optimizer's state": _optimizer_state(_as_adam),
    "optimizer state of another shape": _optimizer_state(_cut_sums),
    "crafted torch.save dense.pt": _crafted_torch_dense,
    "crafted plain pickle dense.pt": _crafted_pickle_dense,
    "crafted tables file": _crafted_tables,
    "truncated tables file": _truncate("tables-rank0.pt"),
    "truncated dense.pt": _truncate("dense.pt"),
    "truncated tables file, no sizes recorded": _truncate(
        "tables-rank0.pt", keep_size_record=False
    ),
    "garbage meta.json": _garbage_meta,
    "missing tables file": _missing_tables,
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_crafted_or_damaged_checkpoint_is_refused_before_anything_runs(
    straight, tmp_path: Path, case: str
):
    """One line naming the file, no payload run, nothing written by the refused run."""
    from dlrm_cache.train.loop import train

    cfg, base, _ = straight
    src = tmp_path / "src"
    shutil.copytree(base, src)
    marker = tmp_path / "payload-ran"
    expect = DAMAGE[case](src / "checkpoints" / "step_00000012", marker)
    with pytest.raises((ValueError, OSError)) as e:
        train(at(cfg, tmp_path / "new", src))
    msg = str(e.value)
    assert "\n" not in msg and expect in msg and str(src) in msg, msg
    assert not marker.exists()
    assert list((tmp_path / "new").glob("*")) == []  # the run directory, and nothing in it


def test_cli_refuses_a_crafted_checkpoint_in_one_line(straight, tmp_path: Path):
    """The whole command: exit status 1, one line on stderr, the payload did not run."""
    cfg, base, _ = straight
    src = tmp_path / "src"
    shutil.copytree(base, src)
    marker = tmp_path / "payload-ran"
    _crafted_torch_dense(src / "checkpoints" / "step_00000012", marker)
    args = [
        "train",
        f"data.path={cfg.data.path}",
        f"hydra.run.dir={tmp_path / 'new'}",
        "device=cpu",
        *TINY_MODEL,
        "data.batch_size=128",
        f"resume={src}",
    ]
    p = ForkedCli(*args, cwd=tmp_path)
    lines = p.communicate()[1].splitlines()
    assert p.returncode == 1
    assert (
        len(lines) == 1
        and lines[0].startswith("dlrm-cache train: error: ")
        and "dense.pt: refused" in lines[0]
    )
    assert not marker.exists()


def test_resume_from_a_directory_without_checkpoint(straight, tmp_path: Path):
    from dlrm_cache.train.loop import train

    cfg, _, _ = straight
    (tmp_path / "empty" / "checkpoints" / ".step_00000004.tmp").mkdir(
        parents=True
    )  # a killed first save
    with pytest.raises(
        FileNotFoundError, match=f"resume={tmp_path / 'empty'}: no checkpoint there"
    ):
        train(at(cfg, tmp_path / "new", tmp_path / "empty"))


def test_disk_full_while_saving_keeps_the_earlier_checkpoints(straight, tmp_path: Path):
    """The second save fails for want of space: one-line error, its temporary directory removed,
    step 2 intact, and resuming from it gives the uninterrupted run's results."""
    cfg, base, _ = straight
    d = tmp_path / "run"
    code, err = run(at(cfg, d), tmp_path, full_at=1)
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith(
        "dlrm_cache.files.atomic.WriteError: [Errno 27] checkpoint step 4 not written (File too large); "
        "the earlier checkpoints are intact"
    ), last
    assert str(d / "checkpoints") in last
    assert sorted(p.name for p in (d / "checkpoints").iterdir()) == ["step_00000002"]
    code, err = run(at(cfg, d, d), tmp_path)
    assert code == 0, err
    assert_same(
        params(base / "checkpoints" / "step_00000012"), params(d / "checkpoints" / "step_00000012")
    )
    assert log(d) == log(base)


# --------------------------------------------------------------------------- resumes that do not fit
@pytest.mark.parametrize(
    "change, named",
    [
        (["model.embedding_dim=16"], ["model.embedding_dim=8 (now 16)"]),
        (["optim.sparse.name=sgd"], ["optim.sparse.name='rowwise_adagrad' (now 'sgd')"]),
        (
            ["optim.dense.name=adam", "model.top_mlp=[32]"],
            ["model.top_mlp=[16] (now [32])", "optim.dense.name='adagrad' (now 'adam')"],
        ),
        (["data.batch_size=64"], ["data.batch_size=128 (now 64)"]),
        (["model.pooling=mean"], ["model.pooling='sum' (now 'mean')"]),
    ],
)
def test_resume_with_another_model_or_optimizer_is_refused_naming_the_keys(
    straight, tmp_path, change, named
):
    from dlrm_cache.train.loop import train

    cfg, base, _ = straight
    other = _compose(Path(cfg.data.path), ["max_steps=12", *change])
    with pytest.raises(ValueError) as e:
        train(at(other, tmp_path / "new", base))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(
        f"resume={base / 'checkpoints' / 'step_00000012'}: "
    ), msg
    assert all(n in msg for n in named), msg
    assert list((tmp_path / "new").glob("*")) == []


def test_resume_past_the_end_of_the_run_is_refused_naming_the_key(straight, tmp_path: Path):
    """A checkpoint of step 12 resumed by a run of 6 steps: refused before anything is written
    (it did no step, saved step 12 again and reported a run of 12 steps, exit 0)."""
    from dlrm_cache.train.loop import train

    cfg, base, _ = straight
    other = _compose(Path(cfg.data.path), ["max_steps=6"])
    with pytest.raises(ValueError) as e:
        train(at(other, tmp_path / "new", base))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("max_steps=6: "), msg
    assert "step 12" in msg and str(base / "checkpoints" / "step_00000012") in msg, msg
    assert list((tmp_path / "new").glob("*")) == []


def test_resume_keeps_the_dense_optimizer_implementation_of_the_resuming_device(
    straight, tmp_path: Path
):
    """A checkpoint's optimizer state records how its writer ran (a GPU's Adagrad: ``foreach``);
    the resumed run keeps its own device's (fused on the CPU), as it would have built it: the
    writer's flags named a kernel the resuming device may not have."""
    from dlrm_cache.parallel.dist import DistInfo
    from dlrm_cache.train.build import build_run, restore
    from dlrm_cache.train.claim import release

    cfg, base, _ = straight
    ckpt = tmp_path / "gpu" / "checkpoints" / "step_00000012"
    shutil.copytree(base / "checkpoints" / "step_00000012", ckpt)
    dense = torch.load(ckpt / "dense.pt", weights_only=True)
    for group in dense["optimizer"]["param_groups"]:
        assert group["fused"] is True  # this machine's Adagrad
        group.update(fused=None, foreach=True)  # as torch 2.11 on a GPU writes it
    torch.save(dense, ckpt / "dense.pt")
    record_file(ckpt, "dense.pt")
    run = build_run(at(cfg, tmp_path / "new", ckpt), torch.device("cpu"), DistInfo())
    try:
        assert restore(run) == 12
        assert [(g["fused"], g["foreach"]) for g in run.opt.param_groups] == [(True, None)]
    finally:
        release()


def test_resume_on_another_dataset_is_refused(straight, tmp_path: Path, dataset_writer):
    from dlrm_cache.train.loop import train

    cfg, base, _ = straight
    dataset_writer(tmp_path / "other", {"train": 5000, "val": 1000}, [50, 200, 1000, 30, 500])
    other = _compose(tmp_path / "other", ["max_steps=12"])
    with pytest.raises(ValueError, match=r"dataset.splits.train.rows=6000 \(now 5000\)"):
        train(at(other, tmp_path / "new", base))


def test_resume_may_change_learning_rates_and_run_longer(straight, tmp_path: Path):
    """What may change: a run resumed with another learning rate continues from step 12."""
    from dlrm_cache.train.loop import train

    cfg, base, _ = straight
    other = _compose(
        Path(cfg.data.path),
        # momentum: SGD's only; this run's Adagrad has none to change
        ["max_steps=14", "optim.sparse.lr=0.2", "optim.dense.lr=0.01", "optim.dense.momentum=0.9"],
    )
    assert train(at(other, tmp_path / "new", base))["steps"] == 14
    assert [
        r["step"]
        for r in map(json.loads, (tmp_path / "new" / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    ] == [14]


# --------------------------------------------------------------------------- what a run will read
def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    "damage, named, says",
    [
        (
            lambda d: _cut(d / "val" / "part-00001.parquet"),
            "val/part-00001.parquet",
            "unreadable shard",
        ),
        (
            lambda d: (d / "train" / "part-00003.parquet").unlink(),
            "train/part-00003.parquet",
            "unreadable shard",
        ),
        (
            lambda d: shutil.copy(
                d / "train" / "part-00007.parquet", d / "train" / "part-00002.parquet"
            ),
            "train/part-00002.parquet",
            "100 rows but",
        ),
        (
            lambda d: (d / "manifest.json").write_text('{"schema_version": 1, "table_si'),
            "manifest.json",
            "not a dataset manifest",
        ),
        (
            lambda d: (d / "manifest.json").write_text("[1, 2]"),
            "manifest.json",
            "not a dataset manifest",
        ),
        (
            lambda d: (d / "manifest.json").write_text('{"schema_version": 1}'),
            "manifest.json",
            "not a dataset manifest",
        ),
    ],
    ids=[
        "truncated shard",
        "missing shard",
        "another shard",
        "cut manifest",
        "manifest a list",
        "manifest no keys",
    ],
)
def test_damaged_dataset_is_found_at_start_naming_the_file(
    tmp_path: Path, dataset_writer, damage, named, says
):
    """Found before anything is built or written (before: a traceback, or an error when reached)."""
    from dlrm_cache.train.loop import train

    data = tmp_path / "ds"
    dataset_writer(data, {"train": 5000, "val": 1500}, [50, 200, 1000, 30, 500])  # 700-row shards
    damage(data)
    with pytest.raises(ValueError) as e:
        train(at(_compose(data, ["max_steps=12"]), tmp_path / "run"))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(data / named)) and says in msg, msg
    assert list((tmp_path / "run").glob("*")) == []


def test_statistics_other_than_the_manifest_says_are_refused(processed_synth: Path, tmp_path: Path):
    """stats_digest is checked where the statistics are read (freq_cache, plan)."""
    import pyarrow.parquet as pq

    from dlrm_cache.data.stats import load_counts
    from dlrm_cache.train.loop import train

    data = tmp_path / "ds"
    shutil.copytree(processed_synth, data)
    counts = data / "stats" / "counts.parquet"
    table = pq.read_table(counts)
    pq.write_table(table.set_column(2, "count", table.column("count")), counts, compression="gzip")
    assert pq.read_table(counts).equals(table)  # same values, another file
    with pytest.raises(
        ValueError, match=f"^{counts}: not the statistics {data / 'manifest.json'} was built with"
    ):
        load_counts(data)
    with pytest.raises(ValueError, match=f"^{counts}: "):
        train(at(_compose(data, ["max_steps=2", "embedding=freq_cache"]), tmp_path / "run"))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_metrics_log_drops_a_line_cut_short_and_keeps_what_it_is_told(tmp_path: Path):
    from dlrm_cache.rundir.records import JsonlLog

    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"kind": "train", "step": 2}\n{"kind": "checkpoint", "step": 2}\n{"kind": "train", "step": 4}\n{"kind": "tr'
    )
    log_ = JsonlLog(path)  # a kill in the middle of a write: that record never was
    assert log_.records == 3 and path.read_text().endswith('"step": 4}\n')
    log_ = JsonlLog(path, keep=2)  # resumed from the checkpoint after record 2
    log_.write("train", step=4)
    assert [(r["kind"], r["step"]) for r in map(json.loads, path.read_text().splitlines())] == [
        ("train", 2),
        ("checkpoint", 2),
        ("train", 4),
    ]
    assert log_.records == 3
