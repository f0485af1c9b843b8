"""Issue 38, target 7 (reliability round 4): the outputs rule compares files by device and inode
too (a bind mount), and covers `report`'s output.  Through ``dlrm-cache`` (``cli.main``)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_output_safety import cli, tree


def _raw(tmp_path: Path, lines: list[bytes]) -> Path:
    raw = tmp_path / "raw" / "raw.txt"
    raw.parent.mkdir(exist_ok=True)
    raw.write_bytes(b"\n".join(lines[:200]) + b"\n")
    return raw


@pytest.fixture
def bind_view(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(a directory, the same directory through ``mount --bind`` at another path)."""
    src, view = tmp_path / "raw", tmp_path / "view"
    src.mkdir(exist_ok=True)
    view.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", src, view]).returncode != 0:
        pytest.skip("mount --bind needs root")
    try:
        yield src, view
    finally:
        subprocess.run(["umount", view], check=True)


def test_an_input_reached_through_a_bind_mount_is_not_overwritten(
    capsys, host_run, raw_test_lines: list[bytes], tmp_path: Path, bind_view
):
    """Before: predict replaced its raw input by its predictions, exit 0 (the real paths differ;
    the device and inode are the input's)."""
    raw = _raw(tmp_path, raw_test_lines)
    same = bind_view[1] / raw.name
    before = raw.read_bytes()
    args = ["predict", "progress=false", f"checkpoint={host_run.path}", f"input={raw}"]
    code, err = cli(capsys, *args, f"output={same}")
    assert code == 1 and err.strip() == (
        f"dlrm-cache predict: error: output={same}: is the input {raw} this command reads; "
        "choose another output"
    )
    assert raw.read_bytes() == before


def test_report_into_a_checkpoint_or_a_dataset_is_refused(
    capsys, host_run, processed_synth: Path, tmp_path: Path
):
    """Before: report.png and report.md were written into them."""
    ckpt = host_run.path / "checkpoints" / "step_00000030"
    before = tree(ckpt, processed_synth)
    for where, kind in ((ckpt, "checkpoint"), (processed_synth, "dataset")):
        code, err = cli(capsys, "report", str(host_run.path), f"output={where}")
        assert code == 1 and err.strip().startswith(
            f"dlrm-cache report: error: output={where}: is the {kind} directory {where}"
        ), err
    assert tree(ckpt, processed_synth) == before
