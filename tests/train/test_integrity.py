"""Nothing lost, nothing silently wrong (issue 19), through the real command line.

A run directory belongs to one run (refused / overwrite / locked while a job trains); damaged
shards, diverging losses and out-of-range ids stop the run naming the file and step; checkpoint
metadata is validated; SIGTERM and SIGINT save a checkpoint of the current step and the resume
continues bit-identically; every user-caused failure is one line.

Commands run as ``dlrm-cache ...`` (``cli.main``) in children forked from a forkserver that has
imported dlrm_cache once (a fresh interpreter costs seconds of imports), so signals and exit
codes are those of a real process; the torchrun test starts the real launcher.
"""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from launching import TORCHRUN_2, ForkedCli, child_env, run_cli
from test_train import SMALL
from test_train import _params as params

from dlrm_cache.data.format import Manifest
from dlrm_cache.data.parquet import read_parquet, write_parquet


def cli(*args: str, cwd: Path) -> tuple[int, str]:
    """(exit code, stderr without the INFO log lines) of ``dlrm-cache args...`` in this process
    (a signal's test starts a :class:`ForkedCli`)."""
    res = run_cli(*args, cwd=cwd, plain_errors=True)
    return res.returncode, _without_log_lines(res.stderr)


def ended(job: ForkedCli, timeout: float = 300) -> tuple[int, str]:
    """(exit code, stderr without the INFO log lines) of ``job`` once it has ended."""
    err = _without_log_lines(job.communicate(timeout)[1])
    assert job.returncode is not None
    return job.returncode, err


def _without_log_lines(err: str) -> str:
    """``err`` without its INFO log lines and blank lines."""
    return "\n".join(ln for ln in err.splitlines() if ln.strip() and not ln.startswith("["))


def one_line(code: int, err: str, command: str, *needles: str) -> str:
    assert code == 1, (code, err)
    assert len(err.splitlines()) == 1 and err.startswith(f"dlrm-cache {command}: error: "), err
    for n in needles:
        assert n in err, (n, err)
    return err


def train_args(data: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["train", f"data.path={data}", f"hydra.run.dir={run_dir}", *SMALL, *extra]


@pytest.fixture(scope="module")
def data(tmp_path_factory, dataset_writer) -> Path:
    root = tmp_path_factory.mktemp("integrity") / "ds"
    dataset_writer(root, {"train": 6000, "val": 1000}, [50, 200, 1000, 30, 500])
    return root


def _records(run_dir: Path, kind: str) -> list[dict]:
    return [
        r
        for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == kind
    ]


# --------------------------------------------------------------------------- 1. one run per run dir
def test_a_run_dir_belongs_to_one_run(data: Path, tmp_path: Path):
    d = tmp_path / "run"
    assert cli(*train_args(data, d, "max_steps=4"), cwd=tmp_path)[0] == 0
    kept = ("summary.json", "metrics.jsonl", ".hydra/config.yaml", "train.log")
    before = {p: (d / p).read_bytes() for p in kept}
    # a new run into it: refused, naming it and both ways out; nothing of the old run touched (its
    # train.log holds its own lines only, not the refusal of another job)
    err = one_line(
        *cli(*train_args(data, d, "max_steps=6"), cwd=tmp_path),
        "train",
        f"run dir {d} holds another run",
        "step_00000004",
        f"resume={d}",
        "overwrite=true",
    )
    assert {p: (d / p).read_bytes() for p in before} == before, err
    # resuming it continues it; overwrite and a resume of it together are refused
    one_line(
        *cli(*train_args(data, d, "max_steps=6", f"resume={d}", "overwrite=true"), cwd=tmp_path),
        "train",
        "overwrite=true would delete the checkpoint",
    )
    assert cli(*train_args(data, d, "max_steps=6", f"resume={d}"), cwd=tmp_path)[0] == 0
    assert json.loads((d / "summary.json").read_text())["steps"] == 6
    # overwrite=true replaces it: one run in metrics.jsonl, only its checkpoints
    assert cli(*train_args(data, d, "max_steps=2", "overwrite=true"), cwd=tmp_path)[0] == 0
    assert len(_records(d, "start")) == 1 and [r["steps"] for r in _records(d, "summary")] == [2]
    assert sorted(p.name for p in (d / "checkpoints").iterdir()) == ["step_00000002"]
    assert "max_steps: 2" in (d / ".hydra" / "config.yaml").read_text()  # the new run's snapshot
    assert _strict((d / "summary.json").read_text())["steps"] == 2


def test_the_resume_a_refusal_suggests_runs_as_typed(data: Path, tmp_path: Path):
    """The refusal's ``resume=`` is one shell word Hydra reads back as the run dir, also for a
    path with a space and a comma (typed as printed, it continues the run)."""
    d = tmp_path / "my runs,v2" / "run"
    assert cli(*train_args(data, f'"{d}"', "max_steps=2"), cwd=tmp_path)[0] == 0
    err = one_line(*cli(*train_args(data, f'"{d}"'), cwd=tmp_path), "train", "resume it with ")
    typed = shlex.split(err.split("resume it with ", 1)[1].split(", replace it", 1)[0])
    assert len(typed) == 1 and typed[0].startswith("resume="), typed
    assert cli("train", f"data.path={data}", *SMALL, "max_steps=3", *typed, cwd=tmp_path)[0] == 0
    assert json.loads((d / "summary.json").read_text())["steps"] == 3


def test_a_dir_holding_only_checkpoints_is_taken(tmp_path: Path):
    from dlrm_cache.train.checkpoint import step_dir
    from dlrm_cache.train.claim import RunDirTaken, _check_owner

    assert _check_owner(tmp_path, None, False) is False  # empty: free
    step_dir(tmp_path, 3).mkdir(parents=True)
    (step_dir(tmp_path, 3) / "meta.json").write_text("{}")
    with pytest.raises(RunDirTaken):
        _check_owner(tmp_path, None, False)


# ---------------------------------------------------------------- 5. preemption (+ the lock)
def _wait_for_steps(d: Path, alive, timeout: float = 200) -> None:
    """Until ``d``'s metrics.jsonl records a training step (``alive()``: the job still runs)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if (d / "metrics.jsonl").is_file() and '"kind": "train"' in (
            d / "metrics.jsonl"
        ).read_text():
            return
        assert alive(), "the job ended before it was signalled"
        time.sleep(0.005)
    raise AssertionError("no training step recorded")


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"]
)
def test_signal_saves_the_current_step_and_resume_is_bit_identical(data: Path, tmp_path: Path, sig):
    """Signalled while it trains: a second job into the run dir is refused (the lock), the run
    saves a checkpoint of the step it was in, says how to resume in one line, exits 128+signal;
    the resume ends where an uninterrupted run ends, bit for bit.  (The stopped run is long: it
    may stop anywhere; how far a run goes does not change its steps, so the comparison runs to
    4 steps past the one saved.)"""
    d = tmp_path / "run"
    job = ForkedCli(*train_args(data, d, "epochs=1000", "checkpoint_every=20"), cwd=tmp_path)
    _wait_for_steps(d, lambda: job.poll() is None)
    if sig == signal.SIGTERM:  # another job while this one trains
        one_line(
            *cli(*train_args(data, d, "overwrite=true"), cwd=tmp_path),
            "train",
            f"run dir {d} is in use: pid {job.pid}",
        )
    job.send_signal(sig)
    code, err = ended(job)
    assert code == 128 + sig, err
    lines = [ln for ln in err.splitlines() if "stopped by" in ln]
    assert len(lines) == 1 and f"resume={d}" in lines[0], err
    saved = max((d / "checkpoints").iterdir())
    step = int(saved.name[5:])
    assert f"checkpoint of step {step} in {saved}" in lines[0] and not (d / "summary.json").exists()
    end = [f"max_steps={step + 4}", "epochs=1000", "checkpoint_every=20"]
    assert cli(*train_args(data, d, *end, f"resume={d}"), cwd=tmp_path)[0] == 0
    straight = tmp_path / "straight"
    assert cli(*train_args(data, straight, *end), cwd=tmp_path)[0] == 0
    last = f"step_{step + 4:08d}"
    want, got = params(straight / "checkpoints" / last), params(d / "checkpoints" / last)
    assert want.keys() == got.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)
    a, b = (json.loads((r / "summary.json").read_text()) for r in (straight, d))
    assert (a["val_auc"], a["val_logloss"]) == (b["val_auc"], b["val_logloss"])


def test_torchrun_sigterm_checkpoints_every_rank_and_resumes_bit_identically(
    data: Path, tmp_path: Path
):
    """While a torchrun job trains, another job into its run dir is refused.  torchrun forwards
    SIGTERM to its workers: both ranks agree on a step, save it together, the job exits non-zero;
    resumed under torchrun it ends as an uninterrupted torchrun run (run beside the resume)."""
    env = child_env(plain_errors=True, OMP_NUM_THREADS="1")

    def torchrun(run_dir: Path, *extra: str) -> subprocess.Popen:
        cmd = [
            *TORCHRUN_2,
            *train_args(data, run_dir, "epochs=1000", "log_every=10", *extra),
        ]
        return subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    d = tmp_path / "run"
    job = torchrun(d)
    _wait_for_steps(d, lambda: job.poll() is None)
    one_line(
        *cli(*train_args(data, d, "overwrite=true"), cwd=tmp_path),
        "train",
        f"run dir {d} is in use",
    )
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode != 0
    assert err.count("dlrm-cache train: stopped by SIGTERM: checkpoint of step") == 1, err[-3000:]
    (saved,) = list((d / "checkpoints").iterdir())
    assert {f for f in json.loads((saved / "meta.json").read_text())["files"]} == {
        "dense.pt",
        "tables-rank0.pt",
        "tables-rank1.pt",
    }
    end = f"max_steps={int(saved.name[5:]) + 4}"
    straight = tmp_path / "straight"
    jobs = [torchrun(d, end, f"resume={d}"), torchrun(straight, end)]  # side by side
    for j in jobs:
        _, err = j.communicate(timeout=300)
        assert j.returncode == 0, err[-3000:]
    last = f"step_{int(saved.name[5:]) + 4:08d}"
    want, got = params(straight / "checkpoints" / last), params(d / "checkpoints" / last)
    assert want.keys() == got.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)


# --------------------------------------------------------------------------- 2. damage is found
def _flip_in_column(shard: Path, column: str) -> None:
    """One bit in the middle of ``column``'s data in ``shard`` (as a disk or a copy may flip it)."""
    import pyarrow.parquet as pq

    meta = pq.read_metadata(shard)
    chunk = meta.row_group(0).column(meta.schema.names.index(column))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(shard.read_bytes())
    data[start + chunk.total_compressed_size // 2] ^= 0x10
    shard.write_bytes(bytes(data))


def test_a_flipped_bit_is_found_by_verify_and_stops_train(data: Path, tmp_path: Path):
    """A bit flipped in a label, a dense and a sparse column chunk of three shards: `verify` names
    all three, `train` stops at the first it reads, one line naming it (before: 4 of 5 such flips
    trained to the end, with values no one wrote)."""
    ds = tmp_path / "ds"
    shutil.copytree(data, ds)
    assert cli("verify", str(ds), cwd=tmp_path)[0] == 0
    damaged = {
        "train/part-00001.parquet": "label",
        "train/part-00004.parquet": "I5",
        "val/part-00000.parquet": "C3",
    }
    for rel, column in damaged.items():
        _flip_in_column(ds / rel, column)
    code, err = cli("verify", str(ds), cwd=tmp_path)
    assert code == 1, err
    named = [ln for ln in err.splitlines() if "CRC checksum verification failed" in ln]
    assert sorted(ln.split(": ")[1] for ln in named) == sorted(str(ds / r) for r in damaged), err
    last = err.splitlines()[-1]
    assert (
        last
        == f"dlrm-cache verify: error: {ds}: 3 of 12 files damaged or not as manifest.json says"
        + (" (listed above)")
    )
    d = tmp_path / "run"
    one_line(
        *cli(*train_args(ds, d, "data.shuffle=false"), cwd=tmp_path),
        "train",
        f"{ds / 'train/part-00001.parquet'}: damaged",
        "CRC checksum verification failed",
    )


def _scaled(data: Path, out: Path, rel: str, factor: float) -> Path:
    """``data`` with the dense values of shard ``rel`` times ``factor`` (a valid, checksummed
    file)."""
    shutil.copytree(data, out)
    t = read_parquet(out / rel)
    for name in Manifest.load(out).dense_names:
        t = t.set_column(
            t.schema.get_field_index(name), name, pa.array(t.column(name).to_numpy() * factor)
        )
    write_parquet(t, out / rel)
    return out


def test_a_loss_far_outside_the_runs_range_stops_it_before_a_checkpoint(data: Path, tmp_path: Path):
    """Shard 3's dense features 10^4 times too large: global batch 17 (rows 2048..2175) is the
    first with its rows; its loss lifts the mean of the last 1024 samples past 10x the loss of
    chance.  The run stops naming
    step 17 and both shards of the batch; the checkpoints before it stay, none after."""
    ds = _scaled(data, tmp_path / "ds", "train/part-00003.parquet", 1e4)
    d = tmp_path / "run"
    err = one_line(
        *cli(
            *train_args(ds, d, "data.shuffle=false", "log_every=5", "checkpoint_every=4"),
            cwd=tmp_path,
        ),
        "train",
        "step 17: training loss",
        "over its last 1024 samples) is more than 10x the loss of chance (ln 2 = 0.693)",
        f"{ds / 'train/part-00002.parquet'}, {ds / 'train/part-00003.parquet'}",
    )
    assert sorted(p.name for p in (d / "checkpoints").iterdir()) == [
        f"step_{s:08d}" for s in (4, 8, 12, 16)
    ], err
    assert not (d / "summary.json").exists()
    # a learning rate that makes the loss NaN: the same, at the step it happened
    one_line(
        *cli(
            *train_args(data, tmp_path / "nan", "optim.dense.lr=1e30", "optim.sparse.lr=1e30"),
            cwd=tmp_path,
        ),
        "train",
        "step 2: training loss nan is not finite",
    )


@pytest.mark.parametrize("embedding", ["host", "freq_cache"])
def test_an_id_outside_its_table_names_the_shard_under_every_placement(
    processed_synth: Path, tmp_path: Path, embedding: str
):
    ds = tmp_path / "ds"
    shutil.copytree(processed_synth, ds)
    m = Manifest.load(ds)
    rel = m.splits["train"].shards[-1]
    t = read_parquet(ds / rel)
    col = t.column("C2").to_numpy().copy()
    col[len(col) // 2] = m.table_sizes[1]
    write_parquet(t.set_column(t.schema.get_field_index("C2"), "C2", pa.array(col)), ds / rel)
    one_line(
        *cli(
            *train_args(ds, tmp_path / "run", f"embedding={embedding}", "data.batch_size=512"),
            cwd=tmp_path,
        ),
        "train",
        f"{ds / rel}: column C2 holds ids outside [0, {m.table_sizes[1]})",
    )


# --------------------------------------------------------------------------- 3. settings and JSON
def test_non_finite_settings_are_refused_at_composition(tmp_path: Path):
    from test_train import compose_train

    from dlrm_cache.config.ranges import validate

    one_line(
        *cli("train", "data.path=nowhere", "optim.dense.lr=inf", cwd=tmp_path),
        "train",
        "optim.dense.lr=inf: must be a finite number",
    )
    keys = (
        "optim.sparse.lr",
        "optim.sparse.eps",
        "optim.dense.weight_decay",
        "dist_timeout_s",
        "host_memory_gb",
        "embedding.cache_ratio",
        "loss_spike_factor",
    )
    for key, value in zip(keys, ["nan", "-inf", "inf"] * 3):
        cfg = compose_train(["data.path=x", "embedding=freq_cache", f"{key}={value}"])
        with pytest.raises(ValueError, match=f"^{key}={value}: must be a finite number"):
            validate(cfg)


def _strict(text: str):
    def refuse(c: str):
        raise ValueError(f"not JSON: {c}")

    return json.loads(text, parse_constant=refuse)


def test_metrics_and_summary_are_strict_json(tmp_path: Path):
    import math

    from dlrm_cache.rundir.records import JsonlLog

    log = JsonlLog(tmp_path / "metrics.jsonl")
    log.write("eval", auc=math.nan, loss=torch.tensor(math.inf), rates=[1.0, -math.inf])
    assert _strict((tmp_path / "metrics.jsonl").read_text())["auc"] is None
    assert {
        k: v for k, v in _strict((tmp_path / "metrics.jsonl").read_text()).items() if k != "time"
    } == {"kind": "eval", "auc": None, "loss": None, "rates": [1.0, None]}


# --------------------------------------------------------------------------- 4. checkpoint metadata
@pytest.fixture(scope="module")
def finished(data: Path, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("finished") / "run"
    assert cli(*train_args(data, d, "max_steps=4"), cwd=d.parent)[0] == 0
    return d


def _meta_edit(change):
    def damage(run: Path, other: Path) -> None:
        path = run / "checkpoints" / "step_00000004" / "meta.json"
        meta = json.loads(path.read_text())
        change(meta, other)
        path.write_text(json.dumps(meta))

    return damage


def _outside(meta: dict, other: Path) -> None:
    """The tables of another run (same shapes, recorded size): a resume would load them."""
    name = "../../../other/checkpoints/step_00000004/tables-rank0.pt"
    meta["tables"] = {k: name for k in meta["tables"]}
    meta["files"][name] = (
        (other / "checkpoints" / "step_00000004" / "tables-rank0.pt").stat().st_size
    )


def _linked_out(run: Path, other: Path) -> None:
    ckpt = run / "checkpoints" / "step_00000004"
    (ckpt / "tables-rank0.pt").unlink()
    (ckpt / "tables-rank0.pt").symlink_to(
        other / "checkpoints" / "step_00000004" / "tables-rank0.pt"
    )


META_DAMAGE = {
    "step a string": (
        _meta_edit(lambda m, o: m.update(step="4")),
        "'step' must be an integer >= 0",
    ),
    "no config": (_meta_edit(lambda m, o: m.pop("config")), "no 'config'"),
    "config without the resume keys": (
        _meta_edit(lambda m, o: m.update(config={"seed": 0})),
        "records no model.embedding_dim",
    ),
    "world_size 0": (
        _meta_edit(lambda m, o: m.update(world_size=0)),
        "'world_size' must be an integer >= 1",
    ),
    "a size not a number": (
        _meta_edit(lambda m, o: m["files"].update({"dense.pt": "12"})),
        "'files' must be",
    ),
    "tables of another run": (_meta_edit(_outside), "is not a file of this checkpoint directory"),
    "a link out of the checkpoint": (
        _linked_out,
        "'tables-rank0.pt' is not a file of this checkpoint directory",
    ),
    "a list": (
        lambda r, o: (r / "checkpoints/step_00000004/meta.json").write_text("[]"),
        "a JSON list, not an object",
    ),
}


@pytest.mark.parametrize("case", list(META_DAMAGE))
def test_checkpoint_metadata_is_validated_before_anything_is_loaded(
    finished: Path, tmp_path: Path, case: str
):
    from test_train import compose_train

    from dlrm_cache.train.loop import train

    run, other = tmp_path / "run", tmp_path / "other"
    shutil.copytree(finished, run)
    shutil.copytree(finished, other)
    damage, says = META_DAMAGE[case]
    damage(run, other)
    cfg = compose_train(
        [
            f"data.path={_data_of(finished)}",
            *SMALL,
            f"run_dir={tmp_path / 'new'}",
            f"resume={run}",
            "max_steps=6",
        ]
    )
    with pytest.raises(ValueError) as e:
        train(cfg)
    assert "\n" not in str(e.value) and says in str(e.value), str(e.value)
    assert not (tmp_path / "new").exists() or list((tmp_path / "new").iterdir()) == []


def _data_of(run: Path) -> str:
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["config"]["data"]["path"]


# ---------------------------------------------------------------- 6. one line, never a traceback
def _manifest_edit(change):
    def make(tmp: Path, data: Path) -> Path:
        ds = tmp / "ds"
        shutil.copytree(data, ds)
        m = json.loads((ds / "manifest.json").read_text())
        change(m)
        (ds / "manifest.json").write_text(json.dumps(m))
        return ds

    return make


def _loop(tmp: Path) -> Path:
    (tmp / "loop_a").symlink_to(tmp / "loop_b")
    (tmp / "loop_b").symlink_to(tmp / "loop_a")
    return tmp / "loop_a"


def _file(tmp: Path) -> Path:
    (tmp / "a_file").write_text("not a directory\n")
    return tmp / "a_file"


def _manifest_dir(tmp: Path, data: Path) -> Path:
    (tmp / "ds" / "manifest.json").mkdir(parents=True)
    return tmp / "ds"


def _shard_dir(tmp: Path, data: Path) -> Path:
    shutil.copytree(data, tmp / "ds")
    (tmp / "ds" / "val" / "part-00000.parquet").unlink()
    (tmp / "ds" / "val" / "part-00000.parquet").mkdir()
    return tmp / "ds"


def _log_dir(tmp: Path) -> Path:
    (tmp / "run" / "train.log").mkdir(parents=True)
    return tmp / "run"


def _lock_dir(tmp: Path) -> Path:
    (tmp / "run" / ".lock").mkdir(parents=True)
    return tmp / "run"


# (case, command line from (tmp, data), what the one line says)
CORPUS = [
    (
        "run dir is a file",
        lambda t, d: train_args(d, _file(t)),
        "hydra.run.dir: [Errno 17] File exists",
    ),
    (
        "run dir under a file",
        lambda t, d: train_args(d, _file(t) / "run"),
        "hydra.run.dir: [Errno 20] Not a directory",
    ),
    # Hydra opens the log before the job runs: as a directory, or in a run dir the user may not
    # write (logging.config's ValueError around the OSError)
    (
        "run dir log is a directory",
        lambda t, d: train_args(d, _log_dir(t)),
        "hydra.run.dir: [Errno 21] Is a directory: ",
    ),
    ("run dir lock is a directory", lambda t, d: train_args(d, _lock_dir(t)), "Is a directory"),
    (
        "data.path a link loop",
        lambda t, d: train_args(_loop(t), t / "run"),
        "manifest.json: no manifest",
    ),
    (
        "manifest a directory",
        lambda t, d: train_args(_manifest_dir(t, d), t / "run"),
        "[Errno 21] Is a directory",
    ),
    (
        "manifest table size a string",
        lambda t, d: train_args(
            _manifest_edit(lambda m: m.update(table_sizes=["a", 200, 1000, 30, 500]))(t, d),
            t / "run",
        ),
        "table_sizes must be a list of integers >= 1",
    ),
    (
        "manifest rows a string",
        lambda t, d: train_args(
            _manifest_edit(lambda m: m["splits"]["val"].update(rows="1000"))(t, d), t / "run"
        ),
        "splits.val: rows, shards and shard_rows do not agree",
    ),
    (
        "manifest shard outside",
        lambda t, d: train_args(
            _manifest_edit(
                lambda m: m["splits"]["val"]["shards"].__setitem__(0, "../../elsewhere.parquet")
            )(t, d),
            t / "run",
        ),
        "shard '../../elsewhere.parquet' is not a path inside the dataset directory",
    ),
    (
        "shard a directory",
        lambda t, d: train_args(_shard_dir(t, d), t / "run"),
        "val/part-00000.parquet: unreadable shard",
    ),
    (
        "resume a file",
        lambda t, d: train_args(d, t / "run", f"resume={_file(t)}"),
        "no checkpoint there",
    ),
    (
        "resume a link loop",
        lambda t, d: train_args(d, t / "run", f"resume={_loop(t)}"),
        "no checkpoint there",
    ),
    (
        "verify without a dataset",
        lambda t, d: ["verify"],
        "no dataset: dlrm-cache verify DATASET_DIR",
    ),
    ("verify a link loop", lambda t, d: ["verify", str(_loop(t))], "manifest.json: no manifest"),
    (
        "preprocess input a link loop",
        lambda t, d: ["preprocess", f"input={_loop(t)}", f"output={t / 'out'}"],
        "input=" + "{tmp}/loop_a: cannot be resolved",
    ),
    (
        "preprocess output a link loop",
        lambda t, d: ["preprocess", f"input={d}", f"output={_loop(t)}"],
        "output=" + "{tmp}/loop_a: cannot be resolved",
    ),
    (
        "plan data.path a file",
        lambda t, d: ["plan", f"data.path={_file(t)}"],
        "manifest.json: no manifest",
    ),
    ("report a file", lambda t, d: ["report", str(_file(t))], "not a run directory"),
]


@pytest.mark.parametrize("case", [c[0] for c in CORPUS])
def test_every_user_caused_failure_is_one_line(data: Path, tmp_path: Path, case: str):
    _, make, says = next(c for c in CORPUS if c[0] == case)
    args = make(tmp_path, data)
    one_line(*cli(*args, cwd=tmp_path), args[0], says.format(tmp=tmp_path))
