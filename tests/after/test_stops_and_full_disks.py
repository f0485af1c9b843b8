"""Issue 38, target 7 (reliability round 4): a signal around predict's rename, export onto a full
disk, report of a record without its number.  Through ``dlrm-cache`` (``cli.main``)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
from pathlib import Path

from test_output_rule import _raw
from test_output_safety import cli

from dlrm_cache.after import predict as predict_module
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


def test_export_onto_a_full_disk_is_one_line_and_leaves_nothing(capsys, host_run, tmp_path: Path):
    """A file size limit (EFBIG, as ENOSPC on a full disk).  Before: torch.save's RuntimeError
    traceback."""
    out = tmp_path / "exported"
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))
    try:
        code, err = cli(capsys, "export", f"checkpoint={host_run.path}", f"output={out}")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        signal.signal(signal.SIGXFSZ, old)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith(f"dlrm-cache export: error: output={out}: not written (")
    assert "nothing was replaced" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_report_of_a_train_record_without_a_number_names_the_line(capsys, host_run, tmp_path: Path):
    """Before: a KeyError traceback ('samples_per_s')."""
    run = tmp_path / "run"
    shutil.copytree(host_run.path, run, ignore=shutil.ignore_patterns("checkpoints"))
    log = run / "metrics.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    at = next(i for i, r in enumerate(records) if r["kind"] == "train")
    del records[at]["samples_per_s"]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, err = cli(capsys, "report", str(run))
    assert code == 1 and err.strip() == (
        f"dlrm-cache report: error: {log}:{at + 1}: a train record without the number "
        "'samples_per_s' (not written by dlrm-cache train, or edited)"
    )
    assert not (run / "report.md").exists()
