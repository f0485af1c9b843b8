"""No command writes over what it reads or into what a run owns; a stopped command leaves no
temporary file (issue 27, target 1).  Through ``dlrm-cache`` (``cli.main``), and for the signal a
real child process."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from launching import child_env

from dlrm_cache.cli import main


def cli(capsys, *args: str) -> tuple[int, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    return code, capsys.readouterr().err


def tree(*roots: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for r in roots for p in sorted(r.rglob("*")) if p.is_file()}


def test_an_output_on_an_input_or_in_a_directory_the_tool_owns_is_refused(
    capsys, host_run, processed_synth: Path, raw_test_lines: list[bytes], tmp_path: Path
):
    run = tmp_path / "run"
    shutil.copytree(host_run.path, run)
    ckpt = run / "checkpoints" / "step_00000030"
    raw = tmp_path / "raw.txt"
    raw.write_bytes(b"\n".join(raw_test_lines[:200]) + b"\n")
    link = tmp_path / "link.parquet"
    link.symlink_to(raw)
    before = tree(run, processed_synth, tmp_path)

    def predict(output: Path) -> list[str]:
        return [
            "predict",
            "progress=false",
            f"checkpoint={run}",
            f"input={raw}",
            f"output={output}",
        ]

    def export(output: Path) -> list[str]:
        return ["export", f"checkpoint={run}", f"output={output}"]

    cases = [
        (predict(raw), f"output={raw}: is the input {raw}"),
        (predict(link), f"output={link}: is the input {raw}"),
        (predict(ckpt / "tables-rank0.pt"), f"inside the checkpoint directory {ckpt}"),
        (predict(ckpt), f"is the checkpoint {ckpt}"),
        (predict(run / "p.parquet"), f"inside the run directory {run}"),
        (predict(processed_synth / "p.csv"), f"inside the dataset directory {processed_synth}"),
        (export(ckpt / "exported"), f"inside the checkpoint directory {ckpt}"),
        (export(run / "exported"), f"inside the run directory {run}"),
        (export(processed_synth / "exported"), f"inside the dataset directory {processed_synth}"),
        (
            ["preprocess", f"input={raw}", f"output={run / 'data'}", "workers=1"],
            f"inside the run directory {run}",
        ),
    ]
    for args, message in cases:
        code, err = cli(capsys, *args)
        lines = err.strip().splitlines()
        assert code == 1 and len(lines) == 1, (args, err)
        assert lines[0].startswith(f"dlrm-cache {args[0]}: error: output=") and message in lines[0]
    assert tree(run, processed_synth, tmp_path) == before  # nothing written, nothing replaced


def test_a_stopped_predict_leaves_no_temporary_file(
    host_run, raw_test_lines: list[bytes], tmp_path: Path
):
    """SIGTERM (what a scheduler or `kill` sends) while predictions are being written: exit status
    128 + 15 with one line, and the output's directory as it was."""
    raw = tmp_path / "raw.txt"
    raw.write_bytes(b"\n".join(raw_test_lines * 10) + b"\n")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    env = child_env(plain_errors=True)
    args = [f"checkpoint={host_run.path}", f"input={raw}", f"output={out_dir / 'p.parquet'}"]
    # a new interpreter: the one line is all it prints, its imports' messages included
    p = subprocess.Popen(
        [sys.executable, "-m", "dlrm_cache", "predict", "progress=false", "batch_size=1", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    t0 = time.monotonic()
    while not any(out_dir.iterdir()):  # the temporary file: predictions are being written
        assert p.poll() is None, p.communicate()[1]
        assert time.monotonic() - t0 < 120
        time.sleep(0.01)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == ["dlrm-cache predict: stopped by SIGTERM"]
    assert list(out_dir.iterdir()) == []
