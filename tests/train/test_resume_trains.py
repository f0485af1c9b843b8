"""A resume that cannot train says so (issue 38, target 4): ``train resume=RUN`` of a finished
run trained 0 steps, exited 0 and moved its ``summary.json`` into ``abandoned/``; it is refused
in one line, before anything moves, naming the step the run ended at and the key to raise.  The
manual's "continue from its final checkpoint" (README.md) continues with that key.  Commands run
through ``dlrm-cache`` in process (``cli.main``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_branch import SMALL, cli, records

from dlrm_cache.cli import main

EPOCH = 23  # steps of one epoch: 6000 training rows in batches of 256 (SMALL's)


@pytest.fixture(scope="module")
def finished(shared_small_dataset: Path, tmp_path_factory) -> Path:
    """A run of one whole epoch (the default ``epochs=1``), finished."""
    run = tmp_path_factory.mktemp("finished") / "run"
    try:
        main(["train", f"data.path={shared_small_dataset}", f"hydra.run.dir={run}", *SMALL])
    except SystemExit as e:
        assert not e.code, e.code
    assert json.loads((run / "summary.json").read_text())["steps"] == EPOCH
    return run


def files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "extra, says",
    [
        ([], "raise epochs (e.g. epochs=2) to train on"),  # docs/reliability.md's example
        (["max_steps=23"], "raise epochs (e.g. epochs=2) and max_steps (now 23) to train on"),
        (["epochs=2", "max_steps=23"], "raise max_steps (e.g. max_steps=46) to train on"),
    ],
    ids=["as-written", "max_steps-at-the-end", "max_steps-ends-it"],
)
def test_a_resume_of_a_finished_run_is_refused_before_anything_moves(
    capsys, finished: Path, shared_small_dataset: Path, tmp_path: Path, extra: list[str], says: str
):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = files(run)
    args = ["train", f"data.path={shared_small_dataset}", *SMALL, f"resume={run}", *extra]
    code, _, err = cli(capsys, *args)
    line = err.strip()
    assert code == 1 and "\n" not in line, err
    assert f"resume={run}: nothing to train: the run ended at step {EPOCH}" in line, line
    assert line.endswith(says) and str(run / "summary.json") in line, line
    # summary.json in place, no abandoned/, metrics.jsonl as it was; train.log has the line too
    after = files(run)
    log, was = after.pop("train.log"), before.pop("train.log")
    assert log.startswith(was) and line.encode() in log[len(was) :], log[len(was) :]
    assert after == before


def test_a_finished_run_trains_on_with_the_key_the_refusal_names(
    capsys, finished: Path, shared_small_dataset: Path, tmp_path: Path
):
    """``epochs=2`` trains the second epoch, and the first epoch's final evaluation stays in the
    run's records (it was cut with the summary), so the best of the two is known."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    args = ["train", f"data.path={shared_small_dataset}", *SMALL, f"resume={run}", "epochs=2"]
    code, _, err = cli(capsys, *args)
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 * EPOCH
    aucs = {r["step"]: r["auc"] for r in records(run, "eval") if r["split"] == "val"}
    assert sorted(aucs) == [EPOCH, 2 * EPOCH]
    assert summary["best_step"] == max(aucs, key=aucs.__getitem__)
    assert [r["step"] for r in records(run, "checkpoint")] == [EPOCH, 2 * EPOCH]
