"""Issue 38, target 7 (reliability round 4): a signal around predict's rename.  Through
``dlrm-cache`` (``cli.main``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from test_output_rule import _raw
from test_output_safety import cli

from dlrm_cache import predict as predict_module
from dlrm_cache.train.metrics import EvalMetrics


def _signal_during(monkeypatch, owner, name: str) -> None:
    """SIGTERM sent to this process when ``owner.name`` is called (a signal at that moment)."""
    real = getattr(owner, name)

    def call(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)

    monkeypatch.setattr(owner, name, call)


def _predict(capsys, host_run, raw: Path, out: Path) -> tuple[int, str]:
    return cli(
        capsys, "predict", "progress=false", f"checkpoint={host_run.path}", f"input={raw}",
        f"output={out}",
    )  # fmt: skip


def test_a_signal_during_predicts_metrics_leaves_no_output(
    capsys, monkeypatch, host_run, raw_test_lines: list[bytes], tmp_path: Path
):
    """Before: the metrics were computed after the output was renamed into place, so a SIGTERM
    then said "stopped" (exit 143) with the new file there.  Now they come first."""
    raw, out = _raw(tmp_path, raw_test_lines), tmp_path / "p.parquet"
    _signal_during(monkeypatch, EvalMetrics, "compute")
    code, err = _predict(capsys, host_run, raw, out)
    assert code == 128 + signal.SIGTERM and err.strip() == "dlrm-cache predict: stopped by SIGTERM"
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["raw"]


def test_a_signal_after_predicts_rename_names_the_output_it_wrote(
    capsys, monkeypatch, host_run, raw_test_lines: list[bytes], tmp_path: Path
):
    raw, out = _raw(tmp_path, raw_test_lines), tmp_path / "p.parquet"
    _signal_during(monkeypatch, predict_module, "format_table")  # the summary, after the rename
    code, err = _predict(capsys, host_run, raw, out)
    assert code == 128 + signal.SIGTERM and err.strip() == (
        f"dlrm-cache predict: stopped by SIGTERM after it wrote output={out} (complete)"
    )
    assert out.is_file()
