"""The commands the manual (README.md and its docs/ pages) shows and train prints work as typed: the
`plots:` hint from a shell with no venv active, in another directory; `resume=RUN` continues that
run in its own directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from launching import REPO, run_cli
from manual import manual_pages, manual_text
from tiny import TINY_MODEL

SMALL = [
    "data.batch_size=256",
    *TINY_MODEL,
    "device=cpu",
    "progress=false",
    "eval_batches=1",
]
# a shell without the venv: neither python's nor dlrm-cache's directory on PATH
BARE_ENV = {
    **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    "PATH": "/usr/bin:/bin",
}


def _script(bin_dir: Path) -> Path:
    """`dlrm-cache` as pip's console script is: this python running dlrm_cache.cli:main."""
    exe = bin_dir / "dlrm-cache"
    exe.write_text(
        f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
        "from dlrm_cache.cli import main\nsys.exit(main())\n"
    )
    exe.chmod(0o755)
    return exe


def _sh(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=BARE_ENV, capture_output=True, text=True, timeout=300
    )


def test_the_printed_hints_and_resume_work_as_typed(processed_synth: Path, tmp_path: Path):
    (tmp_path / "bin").mkdir()
    exe = _script(tmp_path / "bin")
    work = tmp_path / "work"
    work.mkdir()
    common = " ".join([f"data.path={processed_synth}", *SMALL])
    res = _sh(f".././bin/dlrm-cache train {common} max_steps=4", work)
    assert res.returncode == 0, res.stderr
    (plots,) = [line for line in res.stdout.splitlines() if line.startswith("plots:")]
    hint = plots.removeprefix("plots:").strip()
    assert hint.startswith(f"{exe} report ")  # the script as run, made absolute
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = _sh(hint, elsewhere)
    assert shown.returncode == 0, shown.stderr
    (run,) = (work / "runs" / "train").glob("*/*")
    assert (run / "report.png").is_file()

    # the manual: `dlrm-cache train resume=runs/train/<date>/<time>` continues from its latest
    # checkpoint, in that directory
    assert "dlrm-cache train resume=runs/train/" in manual_text()
    rel = run.relative_to(work)
    # (in this process: the words are the same as the shell's, and the start-up is tested above)
    res = run_cli("train", *common.split(), "max_steps=8", f"resume={rel}", cwd=work)
    assert res.returncode == 0, res.stderr
    assert list((work / "runs" / "train").glob("*/*")) == [run]  # no new run directory
    steps = [
        json.loads(line)["step"]
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "checkpoint"
    ]
    assert steps == [4, 8]
    assert json.loads((run / "summary.json").read_text())["steps"] == 8


def test_the_readme_names_the_directories_the_commands_write():
    """Every ``outputs/<cmd>/`` or ``runs/<cmd>/`` the manual (README.md and every docs/ page)
    shows is where that command writes (a directory its config names): "Your own dataset" said
    ``checkpoint=outputs/train/...`` while runs are in ``runs/train/``."""
    import re

    configs = " ".join(
        line.split(" #", 1)[0]  # the settings, not their comments
        for path in (REPO / "configs").glob("*.yaml")
        for line in path.read_text().splitlines()
        if not line.lstrip().startswith("#")
    )
    shown = {
        (page.relative_to(REPO).as_posix(), d)
        for page in manual_pages()
        for d in re.findall(r"\b(?:outputs|runs)/\w+/", page.read_text())
    }
    assert {page for page, _ in shown} >= {"README.md"}, shown  # the README shows where runs go
    assert not {(page, d) for page, d in shown if d not in configs}, shown
