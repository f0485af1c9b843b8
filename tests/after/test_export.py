"""`dlrm-cache export`: torchrec's own DLRM, built on the CPU from the exported files alone, loads
the state dict with strict=True and gives predict's probabilities."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from after_runs import assert_reproduces_predict, exported_model

from dlrm_cache.cli import main


def run_export(capsys, *overrides: str) -> tuple[int, str, str]:
    try:
        main(["export", *overrides])
        code = 0
    except SystemExit as e:
        code = int(e.code)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_torchrec_dlrm_reproduces_predict(
    capsys, cached_run, processed_synth: Path, tmp_path: Path
):
    out = tmp_path / "exported"
    code, stdout, err = run_export(capsys, f"checkpoint={cached_run.path}", f"output={out}")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["dlrm.json", "state_dict.pt"]
    # torchrec's model from the JSON alone (not through dlrm_cache.after.export's own builder)
    model = exported_model(out)
    assert_reproduces_predict(model, cached_run.path, processed_synth, tmp_path)


def test_export_bad_input(capsys, host_run, tmp_path: Path):
    (tmp_path / "not_ours").mkdir()
    (tmp_path / "not_ours" / "notes.txt").write_text("x")
    cases = [
        (
            [f"checkpoint={tmp_path}", f"output={tmp_path / 'e'}"],
            f"checkpoint={tmp_path}: no checkpoint there",
        ),
        (
            [f"checkpoint={host_run.path}", f"output={tmp_path / 'not_ours'}"],
            "is not an export directory",
        ),
        ([f"checkpoint={host_run.path}"], "output: required"),
    ]
    for overrides, message in cases:
        code, _, err = run_export(capsys, *overrides)
        lines = err.strip().splitlines()
        assert code == 1 and len(lines) == 1 and message in lines[0], (overrides, err)
    assert not (tmp_path / "e").exists() and (tmp_path / "not_ours" / "notes.txt").exists()


def test_a_relative_data_path_is_found_where_the_run_recorded_it(
    capsys, shared_small_dataset: Path, tmp_path: Path, monkeypatch
):
    """A run trained with data.path=ds from the directory a/: export from anywhere finds a/ds; with
    a/ moved to b/ (run and dataset together) it finds b/ds; with the dataset gone, the error names
    dataset=, which export takes like predict."""
    shutil.copytree(shared_small_dataset, tmp_path / "a" / "ds")
    monkeypatch.chdir(tmp_path / "a")
    small = ["device=cpu", "progress=false", "data.batch_size=256", "model.embedding_dim=8"]
    main(["train", "data.path=ds", "hydra.run.dir=runs/r", "max_steps=4", *small])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    def exported_from(run: Path, out: Path, *extra: str) -> str:
        code, _, err = run_export(capsys, f"checkpoint={run}", f"output={out}", *extra)
        assert code == 0, err
        return json.loads((out / "dlrm.json").read_text())["inputs"]["dataset"]

    assert exported_from(tmp_path / "a/runs/r", tmp_path / "e1") == str(tmp_path / "a/ds")
    (tmp_path / "a").rename(tmp_path / "b")
    assert exported_from(tmp_path / "b/runs/r", tmp_path / "e2") == str(tmp_path / "b/ds")
    (tmp_path / "b/ds").rename(tmp_path / "moved")
    code, _, err = run_export(capsys, f"checkpoint={tmp_path / 'b/runs/r'}", "output=e3")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "the run's data.path=ds: no dataset there" in err and "with dataset=PATH" in err
    moved = tmp_path / "moved"
    assert exported_from(tmp_path / "b/runs/r", tmp_path / "e3", f"dataset={moved}") == str(moved)
