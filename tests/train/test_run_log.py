"""What `dlrm-cache train` tells its user, through the real CLI: train.log holds every line the
console shows (log intervals, evaluations, the summary), evaluation shows its progress (a bar, or
with progress=false a line at each quarter), and a launch that fails leaves no run directory."""

from __future__ import annotations

import re
from pathlib import Path

from launching import run_cli
from tiny import TINY_MODEL

SMALL = [
    "device=cpu",
    "data.batch_size=256",
    "data.eval_batch_size=200",  # 2000 validation rows: 10 batches per evaluation
    *TINY_MODEL,
    "max_steps=6",
    "log_every=2",
    "eval_every=3",
]
# Hydra's file format: "[time][logger][LEVEL] - message"; a message's further lines follow as written
_PREFIX = re.compile(r"^\[[^]]+\]\[[^]]+\]\[[A-Z]+\] - ")


def log_lines(path: Path) -> list[str]:
    return [_PREFIX.sub("", line) for line in path.read_text().splitlines()]


def test_train_log_holds_every_console_line(shared_small_dataset: Path, tmp_path: Path):
    run = tmp_path / "run"
    res = run_cli(
        "train",
        f"data.path={shared_small_dataset}",
        f"hydra.run.dir={run}",
        "progress=false",
        *SMALL,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    shown = [_PREFIX.sub("", line) for line in res.stdout.splitlines() if line.strip()]
    logged = log_lines(run / "train.log")
    assert shown == [line for line in logged if line.strip()]
    text = "\n".join(shown)
    for step in (2, 4, 6):  # every log interval, with its loss and throughput
        assert re.search(rf"^step {step}/6: loss \d\.\d{{4}}, [\d,]+ samples/s$", text, re.M), text
    for step in (3, 6):  # each evaluation: progress lines at its quarters, then its result
        done = [
            int(m)
            for m in re.findall(rf"^step {step}: val evaluation: (\d+)/10 batches", text, re.M)
        ]
        assert done == [2, 5, 8], text
    assert re.search(r"^step 3: val auc \d\.\d{4} logloss \d\.\d{4}$", text, re.M)
    assert f"dlrm-cache train: {run}" in text and "| val_auc " in text
    assert re.search(rf"^plots: .* report {re.escape(str(run))}$", text, re.M), text


def test_evaluation_shows_a_progress_bar(shared_small_dataset: Path, tmp_path: Path):
    run = tmp_path / "run"
    res = run_cli(
        "train",
        f"data.path={shared_small_dataset}",
        f"hydra.run.dir={run}",
        "progress=true",
        *SMALL,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    # tqdm's bar on stderr: the evaluation's own, over its 10 batches
    assert re.search(r"step 3: val evaluation: +\d+%\|[^|]*\| \d+/10 \[", res.stderr), res.stderr
    logged = "\n".join(log_lines(run / "train.log"))
    # the bar shows the intervals on the console; the log file has them as lines
    assert all(f"step {s}/6: loss " in logged for s in (2, 4, 6)), logged
    assert "step 2/6: loss" not in res.stdout


def test_a_failed_launch_leaves_no_run_directory(shared_small_dataset: Path, tmp_path: Path):
    cases = {
        "bad config": (
            [f"data.path={shared_small_dataset}", "log_every=0"],
            "log_every=0: must be",
        ),
        "missing data": ([f"data.path={tmp_path / 'nowhere'}"], "manifest.json: no manifest"),
    }
    for name, (overrides, error) in cases.items():
        res = run_cli(
            "train", f"hydra.run.dir={tmp_path / 'runs' / name}", "device=cpu", *overrides,
            cwd=tmp_path, plain_errors=True,
        )  # fmt: skip
        assert res.returncode == 1 and error in res.stderr, res.stderr
        assert not (tmp_path / "runs" / name).exists(), name
    # the default layout (runs/train/<date>/<time>): neither the job's nor the date's directory
    res = run_cli("train", f"data.path={tmp_path / 'nowhere'}", "device=cpu", cwd=tmp_path)
    assert res.returncode == 1
    left = [p.relative_to(tmp_path) for p in (tmp_path / "runs").rglob("*")]
    assert left in ([], [Path("runs/train")]), left
    # a directory that holds anything else stays as it was
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    res = run_cli("train", f"hydra.run.dir={kept}", "device=cpu", "log_every=0", cwd=tmp_path)
    assert res.returncode == 1 and (kept / "notes.txt").read_text() == "mine"
