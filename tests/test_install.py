"""The package builds without setuptools' warnings and ships every config file (through pip, as
`make install` runs it, on a copy of the source tree so the checkout gets no build files)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from launching import REPO


def test_the_wheel_builds_quietly_and_ships_every_config(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("dlrm_cache", "configs"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v"]
        + ["-w", str(tmp_path / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    log = res.stdout + res.stderr
    assert "would be ignored" not in log, log[log.find("would be ignored") - 500 :][:1500]
    (wheel,) = (tmp_path / "dist").glob("dlrm_cache-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    configs = {
        f"dlrm_cache/configs/{p.relative_to(src / 'configs')}"
        for p in src.glob("configs/**/*.yaml")
    }
    assert len(configs) > 15 and configs <= shipped, sorted(configs - shipped)


def test_a_python_without_the_dependencies_says_what_to_install(tmp_path: Path):
    """``python3 -m dlrm_cache --help`` with a system Python (no torch, no hydra) was a
    ModuleNotFoundError traceback; it is one line naming the module and what to run instead.
    ``-S``: this interpreter without its site-packages, as a Python outside the venv."""
    res = subprocess.run(
        [sys.executable, "-S", "-m", "dlrm_cache", "--help"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert "has no module 'hydra'" in lines[0] and ".venv/bin/dlrm-cache" in lines[0], lines[0]
