"""preprocess: exact counts/ranks against an independent reference, splits, policies, re-runs."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

import dlrm_cache.data.preprocess as pp
from dlrm_cache.data.criteo import BadLineError
from dlrm_cache.data.format import MANIFEST, SPARSE_NAMES, Manifest
from dlrm_cache.data.stats import load_counts

from refdata import check_dataset, pp_config, read_split, ref_dataset, ref_parse, tiny_synth


def _fraction_split(sizes: list[int], frac: float = 6 / 7):
    total = sum(sizes)
    n_train = int(total * frac)
    n_val = (total - n_train) // 2
    offsets = np.concatenate(([0], np.cumsum(sizes)))

    def split_of(ln) -> str:
        g = offsets[ln.file] + ln.lineno
        return "train" if g < n_train else "val" if g < n_train + n_val else "test"

    return split_of


def _no_temp_files(out: Path) -> None:
    leftovers = [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    leftovers += [p for p in out.rglob("*") if p.name.startswith(".")]
    assert leftovers == []


def test_exact_counts_and_ranks(raw_small: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    manifest = pp.preprocess(OmegaConf.structured(pp_config(raw_small, out)))
    assert Manifest.load(out) == manifest

    per_file, bad, sizes = ref_parse([raw_small / "day_0"])
    counts, by_split = ref_dataset(per_file, _fraction_split(sizes))
    check_dataset(out, manifest, counts, by_split)
    assert manifest.bad_lines == dict(sorted(bad.items()))
    assert len(manifest.splits["train"].shards) > 1  # rows_per_shard=700: several shards
    assert manifest.split_spec["kind"] == "fraction" and manifest.split_spec["total_lines"] == sum(
        sizes
    )
    assert manifest.sources == [str((raw_small / "day_0").resolve())]
    # The val/test edge lines have ids never seen in training except those the synth data shares.
    test = read_split(out, manifest, "test")
    assert (test[SPARSE_NAMES].to_numpy() == np.array(manifest.table_sizes) - 1).any()

    # stats: digest, summary, load_counts (rank order, rare row last).
    import hashlib

    assert (
        manifest.stats_digest
        == hashlib.sha256((out / "stats/counts.parquet").read_bytes()).hexdigest()
    )
    summary = json.loads((out / "stats/summary.json").read_text())
    loaded = load_counts(out)
    for j, name in enumerate(SPARSE_NAMES):
        assert (
            len(loaded[name]) == manifest.table_sizes[j] == summary["features"][name]["table_size"]
        )
        np.testing.assert_array_equal(loaded[name][:-1], counts[name]["count"].to_numpy())
        assert loaded[name][-1] == 0  # min_count=1: no training id is folded
        cov = summary["features"][name]["coverage"]
        assert 0 < cov["0.1%"] <= cov["1%"] <= cov["10%"] <= 1
    assert summary["train_lines"] == manifest.splits["train"].rows


def test_min_count_and_hash_modulus(raw_small: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    manifest = pp.preprocess(pp_config(raw_small, out, min_count=3, hash_modulus=97))
    per_file, _, sizes = ref_parse([raw_small / "day_0"])
    counts, by_split = ref_dataset(per_file, _fraction_split(sizes), min_count=3, hash_modulus=97)
    check_dataset(out, manifest, counts, by_split, hash_modulus=97)
    assert max(manifest.table_sizes) <= 97 + 2  # m hashed ids + MISSING_ID + rare row

    # The rare row's count is what min_count folded away.
    loaded = load_counts(out)
    summary = json.loads((out / "stats/summary.json").read_text())["features"]
    for name in SPARSE_NAMES:
        assert loaded[name].sum() == manifest.splits["train"].rows
        assert summary[name]["rare_ids_folded"] >= (loaded[name][-1] > 0)
    assert any(loaded[n][-1] > 0 for n in SPARSE_NAMES)


def test_split_by_day(tmp_path: Path) -> None:
    raw = tiny_synth(tmp_path / "raw", lines=2400, files=3)
    paths = [raw / f"day_{i}" for i in range(3)]
    per_file, _, sizes = ref_parse(paths)

    # Default: all but the last file train, the last halved into val then test.
    m = pp.preprocess(pp_config(raw, tmp_path / "a", split="day"))
    counts, by_split = ref_dataset(
        per_file,
        lambda ln: "train" if ln.file < 2 else ("val" if ln.lineno < sizes[2] // 2 else "test"),
    )
    check_dataset(tmp_path / "a", m, counts, by_split)
    assert (
        m.split_spec["train"] == ["day_0", "day_1"]
        and m.split_spec["halved"]["day_2"]["val_lines"] == 400
    )

    # Explicit lists, each file whole.
    m = pp.preprocess(
        pp_config(
            raw,
            tmp_path / "b",
            split="day",
            train_files=["day_1"],
            val_files=["day_2"],
            test_files=["day_0"],
        )
    )
    counts, by_split = ref_dataset(per_file, lambda ln: ["test", "train", "val"][ln.file])
    check_dataset(tmp_path / "b", m, counts, by_split)
    assert m.sources == [str(p.resolve()) for p in paths]  # read in day order


def test_gzip_input_matches_plain(raw_small: Path, tmp_path: Path) -> None:
    gz_dir = tmp_path / "gz"
    gz_dir.mkdir()
    (gz_dir / "day_0.gz").write_bytes(gzip.compress((raw_small / "day_0").read_bytes()))
    plain = pp.preprocess(pp_config(raw_small, tmp_path / "plain"))
    packed = pp.preprocess(pp_config(gz_dir, tmp_path / "packed", chunk_bytes=16 << 10))
    assert packed.table_sizes == plain.table_sizes and packed.bad_lines == plain.bad_lines
    assert packed.stats_digest == plain.stats_digest
    for split in ("train", "val", "test"):
        a = read_split(tmp_path / "plain", plain, split)
        b = read_split(tmp_path / "packed", packed, split)
        assert a.equals(b)


def test_bad_lines_fail_policy(raw_small: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    with pytest.raises(BadLineError) as err:
        pp.preprocess(pp_config(raw_small, out, bad_lines="fail"))
    msg = str(err.value)
    # The second hand-written line (a non-integer in I1) is the first bad line of the file.
    assert msg.startswith(f"{(raw_small / 'day_0').resolve()}:2: non-integer in an integer field")
    assert "\n" not in msg
    assert not out.exists()
    _no_temp_files(out)


def test_bad_lines_fail_policy_clean_input(tmp_path: Path) -> None:
    raw = tiny_synth(tmp_path / "raw", lines=500)
    m = pp.preprocess(pp_config(raw, tmp_path / "ds", bad_lines="fail"))
    assert m.bad_lines == {} and sum(s.rows for s in m.splits.values()) == 500


def test_skip_policy_reports_lines(raw_small: Path, tmp_path: Path, capsys) -> None:
    pp.preprocess(pp_config(raw_small, tmp_path / "ds", bad_line_reports=3))
    out = capsys.readouterr().out
    reports = [ln for ln in out.splitlines() if ln.startswith("preprocess: skipped /")]
    assert len(reports) == 3
    assert reports[0].startswith(
        f"preprocess: skipped {(raw_small / 'day_0').resolve()}:2: non-integer"
    )


def test_rerun_reuse_mismatch_overwrite(raw_small: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "ds"
    first = pp.preprocess(pp_config(raw_small, out))
    shard = out / first.splits["train"].shards[0]
    mtime = shard.stat().st_mtime_ns
    capsys.readouterr()

    # Same inputs and settings (progress/chunking do not count): reused, nothing rewritten.
    again = pp.preprocess(pp_config(raw_small, out, chunk_bytes=1 << 20, progress=False))
    assert again == first and shard.stat().st_mtime_ns == mtime
    assert "up to date, reusing" in capsys.readouterr().out

    # Other settings without overwrite: a one-line error naming the fix; the dataset is untouched.
    with pytest.raises(pp.PreprocessError, match=r"min_count.*pass overwrite=true") as err:
        pp.preprocess(pp_config(raw_small, out, min_count=2))
    assert "\n" not in str(err.value)
    assert Manifest.load(out) == first

    # overwrite=true rebuilds, swapping the new dataset in.
    new = pp.preprocess(pp_config(raw_small, out, min_count=2, overwrite=True))
    assert new.min_count == 2 and Manifest.load(out) == new and new.table_sizes != first.table_sizes
    assert all((out / s).exists() for info in new.splits.values() for s in info.shards)
    assert sorted(p.name for p in (out / "train").iterdir()) == sorted(
        Path(s).name for s in new.splits["train"].shards
    )
    _no_temp_files(out)


def test_changed_input_is_detected(tmp_path: Path) -> None:
    raw = tiny_synth(tmp_path / "raw", lines=500)
    out = tmp_path / "ds"
    pp.preprocess(pp_config(raw, out))
    with open(raw / "day_0", "ab") as f:
        f.write(b"0" + b"\t" * 39 + b"\n")
    with pytest.raises(pp.PreprocessError, match="inputs"):
        pp.preprocess(pp_config(raw, out))


def test_crash_mid_run_then_recover(raw_small: Path, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "ds"
    real = pp._write_shard
    calls = []

    def crash_after_first(table, path):
        calls.append(path)
        if len(calls) > 1:
            raise OSError("disk full (simulated)")
        real(table, path)

    monkeypatch.setattr(pp, "_write_shard", crash_after_first)
    with pytest.raises(OSError, match="simulated"):
        pp.preprocess(pp_config(raw_small, out))
    assert not (out / MANIFEST).exists() and not out.exists()
    _no_temp_files(out)

    # A killed run (no cleanup at all) leaves its build directory: the next run removes it.
    stale = tmp_path / ".ds.tmp-999999"
    (stale / "train").mkdir(parents=True)
    (stale / "train" / ".part-00000.parquet.tmp").write_bytes(b"partial")
    monkeypatch.setattr(pp, "_write_shard", real)
    m = pp.preprocess(pp_config(raw_small, out))
    assert Manifest.load(out) == m
    _no_temp_files(out)

    # A kill while *replacing* it, between moving the old dataset aside and renaming the new one
    # in: the next run puts the old one back (and finds it up to date) instead of deleting it.
    from dlrm_cache.files.atomic import aside_path

    out.rename(aside_path(out))
    (tmp_path / ".ds.tmp-999999" / "train").mkdir(parents=True)
    assert pp.preprocess(pp_config(raw_small, out)) == m
    _no_temp_files(out)

    # A crash while *replacing* a complete dataset leaves the old one intact.
    monkeypatch.setattr(pp, "_write_shard", crash_after_first)
    calls.clear()
    with pytest.raises(OSError):
        pp.preprocess(pp_config(raw_small, out, min_count=2, overwrite=True))
    assert Manifest.load(out) == m
    _no_temp_files(out)


def test_a_build_another_running_process_holds_is_not_removed(
    raw_small: Path, tmp_path: Path
) -> None:
    """Two runs into one output: the second refuses while the first's build directory (named by
    its pid) has a live process, instead of removing it as a killed run's leftover (which failed
    the first run with a missing-file error, and could put an old dataset back under it)."""
    out = tmp_path / "ds"
    other = subprocess.Popen(["sleep", "60"])
    try:
        build = tmp_path / f".ds.tmp-{other.pid}"
        (build / "train").mkdir(parents=True)
        (build / "train" / ".part-00000.parquet.tmp").write_bytes(b"being written")
        with pytest.raises(pp.PreprocessError, match=f"another preprocess \\(pid {other.pid}\\)"):
            pp.preprocess(pp_config(raw_small, out))
        assert (build / "train" / ".part-00000.parquet.tmp").read_bytes() == b"being written"
        assert not out.exists()
    finally:
        other.kill()
        other.wait()
    # its process gone, it is a leftover like any other
    pp.preprocess(pp_config(raw_small, out))
    assert not build.exists()
    _no_temp_files(out)


def test_an_output_name_too_long_for_its_build_directory_names_the_output(
    raw_small: Path, tmp_path: Path
) -> None:
    """A name that fits (250 of 255 bytes) but not with the build directory's suffix: the error
    names the output the user gave, not the temporary name."""
    out = tmp_path / ("n" * 250)
    with pytest.raises(pp.PreprocessError, match=f"output {out}: cannot create files in "):
        pp.preprocess(pp_config(raw_small, out))
    assert not out.exists()


def test_refuses_foreign_output(raw_small: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(pp.PreprocessError, match="not a processed dataset"):
        pp.preprocess(pp_config(raw_small, out))
    assert (out / "notes.txt").exists()
    with pytest.raises(pp.PreprocessError, match="is the input"):
        pp.preprocess(pp_config(raw_small, raw_small))


def test_total_lines_given(raw_small: Path, tmp_path: Path) -> None:
    _, _, sizes = ref_parse([raw_small / "day_0"])
    m = pp.preprocess(pp_config(raw_small, tmp_path / "a", total_lines=sum(sizes)))
    ref = pp.preprocess(pp_config(raw_small, tmp_path / "b"))
    assert m.splits["train"].rows == ref.splits["train"].rows and m.stats_digest == ref.stats_digest
    with pytest.raises(pp.PreprocessError, match="total_lines"):
        pp.preprocess(pp_config(raw_small, tmp_path / "c", total_lines=sum(sizes) - 5))


def test_shards_are_finite_and_typed(raw_small: Path, tmp_path: Path) -> None:
    m = pp.preprocess(pp_config(raw_small, tmp_path / "ds"))
    for info in m.splits.values():
        for s in info.shards:
            t = pq.read_table(tmp_path / "ds" / s)
            for name in t.column_names:
                v = t.column(name).to_numpy()
                assert np.isfinite(v).all() if v.dtype.kind == "f" else v.min() >= 0
    shutil.rmtree(tmp_path / "ds")


def test_no_training_lines_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "train.txt").write_text("0" + "\t" * 39 + "\n")  # 1 line: it goes to test
    with pytest.raises(pp.PreprocessError, match="no valid training lines"):
        pp.preprocess(pp_config(tmp_path / "train.txt", tmp_path / "ds"))
    assert not (tmp_path / "ds").exists()
    _no_temp_files(tmp_path / "ds")
