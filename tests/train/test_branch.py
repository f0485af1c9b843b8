"""A run directory's final checkpoint is the one its records describe (issue 27, target 2).

A run resumed into its own run directory from an older checkpoint (a branch) sets what it recorded
after that checkpoint aside in ``abandoned/after_step_K/``; `predict`, `export` and ``resume=RUN``
all take the newest complete checkpoint the run's log records, the one ``summary.json`` names.
Every command runs through ``dlrm-cache`` (``cli.main``, in process: the fixtures' training costs
seconds, a fresh interpreter per command as much again).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tiny import TINY_MODEL

from dlrm_cache.cli import main
from dlrm_cache.rundir.tensorboard import EVENTS_GLOB, read_scalars, record_scalars, record_step

SMALL = [
    "device=cpu",
    "progress=false",
    "data.batch_size=256",
    "data.eval_batch_size=1000",
    *TINY_MODEL,
    "eval_batches=1",
    "log_every=5",
]


def cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def train(capsys, data: Path, run: Path, *extra: str) -> None:
    code, _, err = cli(capsys, "train", f"data.path={data}", f"hydra.run.dir={run}", *SMALL, *extra)
    assert code == 0, err


def records(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def steps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def exported_step(capsys, checkpoint: Path, out: Path) -> int:
    code, _, err = cli(capsys, "export", f"checkpoint={checkpoint}", f"output={out}")
    assert code == 0, err
    return int(json.loads((out / "dlrm.json").read_text())["step"])


@pytest.fixture(scope="module")
def branched(processed_synth: Path, tmp_path_factory) -> Path:
    """A run to step 30 (checkpoints 10, 20, 30), then resumed in its own directory from step 10
    to step 20."""
    run = tmp_path_factory.mktemp("branch") / "run"
    for extra in (
        ["max_steps=30", "checkpoint_every=10"],
        ["max_steps=20", "checkpoint_every=10", f"resume={run}/checkpoints/step_00000010"],
    ):
        try:
            main(
                [
                    "train",
                    f"data.path={processed_synth}",
                    f"hydra.run.dir={run}",
                    *SMALL,
                    *extra,
                    "logger.tensorboard=true",
                ]
            )
        except SystemExit as e:
            assert not e.code, e.code
    return run


def test_a_branch_sets_aside_what_came_after_its_checkpoint(branched: Path):
    run = branched
    aside = run / "abandoned" / "after_step_00000010"
    assert steps(run / "checkpoints") == ["step_00000010", "step_00000020"]
    assert steps(aside / "checkpoints") == ["step_00000020", "step_00000030"]
    # the run's records: its summary and log describe the new branch, ending at step 20
    assert json.loads((run / "summary.json").read_text())["steps"] == 20
    assert [r["step"] for r in records(run, "checkpoint")] == [10, 20]
    # the abandoned branch is a run directory of its own: its log as it was, its summary
    assert json.loads((aside / "summary.json").read_text())["steps"] == 30
    assert [r["step"] for r in records(aside, "checkpoint")] == [10, 20, 30]
    # TensorBoard shows each run as its log records it: the branch's steps 11-20 once, the
    # abandoned ones beside the abandoned log
    for d in (run, aside):
        assert scalars(d) == logged_scalars(d)
    assert [step for step, tag, _ in scalars(run) if tag == "main/loss"] == [5, 10, 15, 20]


def scalars(run: Path) -> list[tuple[int, str, float]]:
    """Every scalar of the run directory's TensorBoard event files, as (step, tag, value)."""
    found = [s for f in run.glob(EVENTS_GLOB) for s in read_scalars(f)]
    return sorted((s.step, s.tag, s.value) for s in found)


def logged_scalars(run: Path) -> list[tuple[int, str, float]]:
    """What the event files must hold: the scalars of every record of the run's log."""
    logged = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return sorted(
        (record_step(r), tag, float(np.float32(v))) for r in logged for tag, v in record_scalars(r)
    )


def test_every_command_takes_the_checkpoint_the_records_name(
    capsys, branched: Path, processed_synth: Path, tmp_path: Path
):
    run = tmp_path / "run"
    shutil.copytree(branched, run)
    assert exported_step(capsys, run, tmp_path / "e1") == 20
    code, out, err = cli(
        capsys,
        "predict",
        "progress=false",
        f"checkpoint={run}",
        f"input={processed_synth}",
        "split=val",
        f"output={tmp_path / 'p.parquet'}",
    )
    assert code == 0 and "step_00000020" in out and "step_00000030" not in out, (out, err)
    # a later checkpoint the log does not record (left by a branch before this rule) is not the run's
    shutil.copytree(
        run / "abandoned" / "after_step_00000010" / "checkpoints" / "step_00000030",
        run / "checkpoints" / "step_00000030",
    )
    assert exported_step(capsys, run, tmp_path / "e2") == 20
    assert exported_step(capsys, run / "abandoned" / "after_step_00000010", tmp_path / "e3") == 30
    # resume=RUN continues from step 20 and sets the unrecorded step 30 aside
    train(capsys, processed_synth, run, "max_steps=25", f"resume={run}")
    assert [r["step"] for r in records(run, "start")] == [0, 10, 20]
    assert steps(run / "checkpoints") == ["step_00000010", "step_00000020", "step_00000025"]
    assert steps(run / "abandoned" / "after_step_00000020" / "checkpoints") == ["step_00000030"]


def test_overwrite_refuses_to_delete_the_abandoned_checkpoint_it_resumes(
    capsys, branched: Path, processed_synth: Path, tmp_path: Path
):
    """``overwrite=true`` removes the run's files, ``abandoned/`` included: a resume from a
    checkpoint in there is refused before anything is removed (it deleted the whole run, the
    checkpoint too, then failed reading it)."""
    run = tmp_path / "run"
    shutil.copytree(branched, run)
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    ckpt = run / "abandoned" / "after_step_00000010" / "checkpoints" / "step_00000030"
    code, _, err = cli(
        capsys,
        "train",
        f"data.path={processed_synth}",
        f"hydra.run.dir={run}",
        *SMALL,
        "overwrite=true",
        f"resume={ckpt}",
    )
    assert code == 1, err
    line = err.strip()
    assert "\n" not in line and "overwrite=true would delete" in line and str(ckpt) in line, err
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before
