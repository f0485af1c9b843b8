"""The in-process CLI runner sees what a child process's caller would: what the command prints
(C-level writes to descriptors 1 and 2 included), its warnings, its exit status, an escaping
exception as the interpreter prints it; and it leaves the test's process as it found it."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import warnings
from pathlib import Path

from launching import run_in_process

import dlrm_cache.cli


def _command(argv: list[str]) -> None:
    print("to stdout", Path.cwd().name, argv)
    os.write(2, b"C-level stderr\n")
    warnings.warn("a library's warning", UserWarning, stacklevel=1)
    if argv == ["fail"]:
        raise RuntimeError("a bug")
    raise SystemExit(int(argv[0]))


def test_output_warnings_and_status_are_the_childs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(dlrm_cache.cli, "main", _command)
    (tmp_path / "here").mkdir()
    cwd, argv, out = os.getcwd(), list(sys.argv), sys.stdout
    res = run_in_process("3", cwd=tmp_path / "here", env_extra={"DLRM_TEST_ONLY": "1"})
    assert res.returncode == 3 and res.stdout == "to stdout here ['3']\n"
    assert "C-level stderr" in res.stderr and "UserWarning: a library's warning" in res.stderr
    assert (os.getcwd(), sys.argv, sys.stdout) == (cwd, argv, out)
    assert "DLRM_TEST_ONLY" not in os.environ
    res = run_in_process("fail", cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" in res.stderr and "RuntimeError: a bug" in res.stderr


def test_a_deprecation_warning_stays_hidden_as_in_a_new_interpreter(tmp_path, monkeypatch) -> None:
    def command(argv: list[str]) -> None:
        warnings.warn("old", DeprecationWarning, stacklevel=1)

    monkeypatch.setattr(dlrm_cache.cli, "main", command)
    res = run_in_process(cwd=tmp_path)
    assert res.returncode == 0 and res.stderr == ""


def test_a_file_handler_hydra_closed_is_not_put_back(tmp_path: Path) -> None:
    """A command's logging set-up closes the root logger's handlers it replaces (here a file
    handler on a removed run directory, as a test calling ``main`` directly leaves it): restoring
    the loggers must not put that one back, or the next log line tries to reopen its file."""
    old = tmp_path / "old"
    old.mkdir()
    stale = logging.FileHandler(old / "train.log")
    logging.getLogger().addHandler(stale)
    shutil.rmtree(old)
    try:
        res = run_in_process("train", "data.path=missing", "device=cpu", cwd=tmp_path)
        assert res.returncode == 1
        assert stale not in logging.getLogger().handlers
        logging.getLogger("dlrm_cache.train.loop").warning("a line after the command")
    finally:
        logging.getLogger().removeHandler(stale)
        stale.close()
