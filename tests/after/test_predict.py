"""`dlrm-cache predict` as a user runs it: the run's own test metrics reproduced, raw text scored as
its preprocessed lines, every placement's checkpoint read, bad input refused in one line."""

from __future__ import annotations

import gzip
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from after_runs import compose_config

from dlrm_cache.after.predict import predict
from dlrm_cache.cli import main

# placed among the test lines of the raw files below: each is skipped, the rest keep their batches
BAD = [b"1\t2\t3", b"2" + b"\t" * 39, b"0" + b"\t" * 13 + b"zz" + b"\t" * 25]


def run_predict(capsys, *overrides: str) -> tuple[int, str, str]:
    try:
        main(["predict", "progress=false", *overrides])
        code = 0
    except SystemExit as e:
        code = int(e.code)
    out = capsys.readouterr()
    return code, out.out, out.err


def predict_in_process(*overrides: str) -> dict:
    return predict(compose_config("predict", ["progress=false", *overrides]))


@pytest.fixture(scope="module")
def split_predictions(
    host_run, processed_synth: Path, tmp_path_factory
) -> tuple[dict, pd.DataFrame]:
    out = tmp_path_factory.mktemp("pred") / "test.parquet"
    summary = predict_in_process(
        f"checkpoint={host_run.path}", f"input={processed_synth}", f"output={out}"
    )
    return summary, pd.read_parquet(out)


def with_bad_lines(lines: list[bytes]) -> list[bytes]:
    return lines[:5] + BAD + lines[5:1500] + BAD[:1] + lines[1500:]


def test_split_reproduces_the_runs_test_metrics_exactly(host_run, split_predictions):
    summary, frame = split_predictions
    reported = host_run.summary
    # the model, batches and metric code of `train test=true`: the same numbers, not close ones
    assert summary["auc"] == reported["test_auc"]
    assert summary["logloss"] == reported["test_logloss"]
    assert summary["accuracy"] == reported["test_accuracy"]
    assert summary["samples"] == reported["test_samples"] == len(frame)
    assert list(frame.columns) == ["row", "probability", "label"]
    assert frame["row"].tolist() == list(range(len(frame)))
    assert frame["probability"].dtype == np.float32 and frame["probability"].between(0, 1).all()


def test_raw_gz_scores_as_its_preprocessed_lines(
    capsys, split_predictions, raw_test_lines, host_run, tmp_path
):
    _, split = split_predictions
    raw = tmp_path / "test.gz"
    raw.write_bytes(gzip.compress(b"\n".join(with_bad_lines(raw_test_lines)) + b"\n"))
    out = tmp_path / "raw.parquet"
    code, stdout, err = run_predict(
        capsys, f"checkpoint={host_run.path}", f"input={raw}", f"output={out}"
    )
    assert code == 0, err
    frame = pd.read_parquet(out)
    # bit for bit: the same rows in the same batches (the bad lines are skipped before batching)
    np.testing.assert_array_equal(frame["probability"].to_numpy(), split["probability"].to_numpy())
    np.testing.assert_array_equal(frame["label"].to_numpy(), split["label"].to_numpy())
    # line numbers are the file's: the 3 bad lines after line 5 and the one after line 1503 are gone
    expected = [n for n in range(1, len(raw_test_lines) + 5) if n not in (6, 7, 8, 1504)]
    assert frame["line"].tolist() == expected
    assert (
        "skipped 4 malformed lines" in stdout
        and f"{raw}:6: wrong field count (3 fields, expected 40)" in stdout
    )


def test_unlabelled_lines_like_kaggle_test_txt(
    capsys, raw_test_lines, split_predictions, host_run, tmp_path
):
    """39 fields (no label), plain text, CSV output."""
    _, split = split_predictions
    text = tmp_path / "test.txt"
    text.write_bytes(b"\n".join(line.split(b"\t", 1)[1] for line in raw_test_lines) + b"\n")
    out = tmp_path / "pred.csv"
    code, stdout, err = run_predict(
        capsys, f"checkpoint={host_run.path}", f"input={text}", f"output={out}"
    )
    assert code == 0, err
    frame = pd.read_csv(out)
    assert list(frame.columns) == ["line", "probability"]  # no label: no metrics either
    assert "| auc " not in stdout and "dlrm-cache predict" in stdout
    assert frame["line"].tolist() == list(range(1, len(raw_test_lines) + 1))
    np.testing.assert_allclose(
        frame["probability"].to_numpy(), split["probability"].to_numpy(), rtol=0, atol=1e-6
    )


def test_a_sweep_directory_as_checkpoint_names_its_runs(
    capsys, host_run, processed_synth, tmp_path
):
    """checkpoint=<a -m sweep directory> said "no checkpoint there ... nor a run directory": the
    line now says it is a sweep and names a run to give."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "0").symlink_to(host_run.path, target_is_directory=True)
    out = tmp_path / "p.csv"
    code, _, err = run_predict(
        capsys, f"checkpoint={sweep}", f"input={processed_synth}", f"output={out}"
    )
    assert code == 1 and not out.exists()
    assert err.strip() == (
        f"dlrm-cache predict: error: checkpoint={sweep}: a sweep directory (runs 0); name one of "
        f"its runs, e.g. checkpoint={sweep / '0'}"
    )


def test_lines_of_one_class_have_no_auc(capsys, raw_test_lines, host_run, tmp_path):
    """AUC needs both classes: lines of clicks only were reported "auc 0" after torchmetrics' "No
    negative samples in targets" warning; now n/a (null in the summary), and no warning."""
    clicks = [line for line in raw_test_lines if line.startswith(b"1\t")][:20]
    text = tmp_path / "clicks.txt"
    text.write_bytes(b"\n".join(clicks) + b"\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torchmetrics' warning fails the test
        summary = predict_in_process(
            f"checkpoint={host_run.path}", f"input={text}", f"output={tmp_path / 'p.csv'}"
        )
    assert summary["samples"] == 20 and np.isnan(summary["auc"]), summary
    assert 0 < summary["logloss"] < 10
    code, stdout, err = run_predict(
        capsys, f"checkpoint={host_run.path}", f"input={text}", f"output={tmp_path / 'q.csv'}"
    )
    assert code == 0, err
    assert "| auc " in stdout and "n/a" in stdout.split("| auc ", 1)[1].split("\n", 1)[0]


@pytest.mark.parametrize("run", ["cached_run", "row_sharded_run"])
def test_every_placement_predicts_what_its_run_reported(run, request, processed_synth, tmp_path):
    """freq_cache tables (flushed into the checkpoint) and a checkpoint of row-range pieces in two
    files are read as whole tables."""
    trained = request.getfixturevalue(run)
    summary = predict_in_process(
        f"checkpoint={trained.path}", f"input={processed_synth}", f"output={tmp_path / 'p.parquet'}"
    )
    assert summary["auc"] == trained.summary["test_auc"]
    assert summary["logloss"] == trained.summary["test_logloss"]
    assert summary["samples"] == trained.summary["test_samples"]


def test_a_checkpoint_directory_and_other_splits(host_run, processed_synth, tmp_path):
    ckpt = host_run.path / "checkpoints" / "step_00000030"
    summary = predict_in_process(
        f"checkpoint={ckpt}",
        f"input={processed_synth}",
        "split=val",
        f"output={tmp_path / 'val.parquet'}",
        "batch_size=333",
    )
    assert summary["step"] == 30 and summary["samples"] == host_run.summary["val_samples"]
    assert summary["auc"] == pytest.approx(host_run.summary["val_auc"], abs=1e-6)


def test_bad_input_is_one_line_and_writes_nothing(
    capsys, host_run, processed_synth, small_dataset, raw_test_lines, tmp_path
):
    out = tmp_path / "out" / "pred.parquet"
    common = [f"checkpoint={host_run.path}", f"output={out}"]
    raw = tmp_path / "raw.txt"
    raw.write_bytes(b"\n".join(with_bad_lines(raw_test_lines)) + b"\n")
    wide = tmp_path / "wide.txt"
    wide.write_bytes(b"\t".join([b"1"] * 30) + b"\n" + raw_test_lines[0] + b"\n")
    (tmp_path / "empty_run").mkdir()
    (tmp_path / "a_file").write_text("x")
    cases = [
        (
            [f"checkpoint={tmp_path / 'empty_run'}", f"input={raw}", f"output={out}"],
            f"checkpoint={tmp_path / 'empty_run'}: no checkpoint there",
        ),
        (
            common + [f"input={raw}", f"dataset={small_dataset}"],
            f"trained on another dataset than dataset={small_dataset}",
        ),
        (
            common + [f"input={small_dataset}"],
            f"trained on another dataset than input={small_dataset}",
        ),
        (common + [f"input={wide}"], f"{wide}:1: 30 fields; a raw Criteo line has 40"),
        # fail policy, small chunks: batches were written before line 6 stopped the run
        (
            common + [f"input={raw}", "bad_lines=fail", "chunk_bytes=100", "batch_size=2"],
            f"{raw}:6: wrong field count (3 fields, expected 40)",
        ),
        (common + [f"input={processed_synth}", "split=nope"], "split=nope:"),
        (
            common + [f"input={tmp_path / 'missing.txt'}"],
            "missing.txt: no such file or processed dataset",
        ),
        (
            [
                f"checkpoint={host_run.path}",
                f"input={raw}",
                f"output={tmp_path / 'a_file' / 'p.parquet'}",
            ],
            "a_file/p.parquet: cannot write there",
        ),
        (
            [f"checkpoint={host_run.path}", f"input={raw}", f"output={tmp_path / 'empty_run'}"],
            "is a directory",
        ),
        (
            [f"checkpoint={host_run.path}", f"input={raw}"],
            "output: required, e.g. output=predictions.parquet",
        ),
    ]
    for overrides, message in cases:
        code, _, err = run_predict(capsys, *overrides)
        lines = err.strip().splitlines()
        assert code == 1 and len(lines) == 1, (overrides, err)
        assert lines[0].startswith("dlrm-cache predict: error:") and message in lines[0], (
            overrides,
            lines[0],
        )
    assert not out.exists() and not (out.parent.exists() and any(out.parent.iterdir()))


def test_no_line_to_score_is_an_error_with_the_count_per_reason(
    capsys, host_run, raw_test_lines, tmp_path
):
    """Every label invalid: exit status 1, preprocess's count per reason, no output (not an empty
    file and status 0)."""
    raw = tmp_path / "bad_labels.txt"
    raw.write_bytes(b"\n".join(b"2" + line[1:] for line in raw_test_lines[:300]) + b"\n")
    out = tmp_path / "p.parquet"
    code, _, err = run_predict(
        capsys, f"checkpoint={host_run.path}", f"input={raw}", f"output={out}"
    )
    assert code == 1 and err.strip().splitlines() == [
        f"dlrm-cache predict: error: input={raw}: no line to score: all 300 lines are malformed. "
        f"label not 0/1: 300 (first: {raw}:1: label not 0/1 (label='2'))"
    ]
    assert list(tmp_path.iterdir()) == [raw]


def test_an_empty_label_is_scored_as_unlabelled(
    capsys, host_run, raw_test_lines, split_predictions, tmp_path
):
    """Inference logs: a line whose label field is empty is scored (label null) and left out of the
    metrics, which are those of the labelled lines."""
    from torchmetrics.functional.classification import binary_auroc

    _, split = split_predictions
    blank = set(range(0, len(raw_test_lines), 3))
    lines = [line[1:] if i in blank else line for i, line in enumerate(raw_test_lines)]
    raw = tmp_path / "log.txt"
    raw.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "p.parquet"
    summary = predict_in_process(f"checkpoint={host_run.path}", f"input={raw}", f"output={out}")
    frame = pd.read_parquet(out)
    assert frame["line"].tolist() == list(range(1, len(lines) + 1))  # every line scored
    np.testing.assert_array_equal(frame["probability"].to_numpy(), split["probability"].to_numpy())
    unknown = frame["label"].isna().to_numpy()
    assert np.flatnonzero(unknown).tolist() == sorted(blank)
    known = frame[~unknown]
    assert (known["label"].to_numpy() == split["label"].to_numpy()[~unknown]).all()
    assert summary["scored"] == len(lines) and summary["labelled"] == len(known)
    assert summary["samples"] == len(known)
    auc = binary_auroc(
        torch.tensor(known["probability"].to_numpy()),
        torch.tensor(known["label"].to_numpy().astype(np.int64)),
    ).item()
    assert summary["auc"] == pytest.approx(auc, abs=1e-7)
    # every label empty: scored, no metrics
    raw.write_bytes(b"\n".join(line[1:] for line in raw_test_lines) + b"\n")
    capsys.readouterr()
    code, stdout, err = run_predict(
        capsys, f"checkpoint={host_run.path}", f"input={raw}", f"output={out}"
    )
    assert code == 0 and "| auc " not in stdout, err
    assert pd.read_parquet(out)["label"].isna().all()


def test_raw_input_of_a_materialized_multi_hot_set_is_refused(
    capsys, processed_synth, raw_test_lines, tmp_path
):
    """A set made by ``multi_hot_sizes=`` from a processed dataset holds lists drawn from that
    dataset's rows: raw lines cannot be mapped to them, so predict says so (instead of scoring
    them one id per feature through statistics of other ids)."""
    from after_runs import _train, train_overrides

    from dlrm_cache.data.config import PreprocessConfig
    from dlrm_cache.data.preprocess import preprocess

    mh = tmp_path / "mh"
    sizes = [2] + [1] * 25
    preprocess(
        PreprocessConfig(
            input=str(processed_synth), output=str(mh), multi_hot_sizes=sizes, progress=False
        )
    )
    run = tmp_path / "run"
    _train(train_overrides(mh, run, ["max_steps=1", "test=false"]))
    raw = tmp_path / "raw.txt"
    raw.write_bytes(b"\n".join(raw_test_lines) + b"\n")
    out = tmp_path / "p.parquet"
    # predict's own stderr only: an in-process Hydra run of an earlier test may have left a log
    # handler on its closed capture, which the in-process train above reports on stderr
    capsys.readouterr()
    code, _, err = run_predict(capsys, f"checkpoint={run}", f"input={raw}", f"output={out}")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"input={raw}: the run's dataset" in err and "score a processed split" in err, err
    assert not out.exists()
    # its processed split is scored
    assert predict_in_process(f"checkpoint={run}", f"input={mh}", f"output={out}")["scored"] > 0
