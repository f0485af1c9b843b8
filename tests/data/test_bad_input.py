"""preprocess against bad input, as a careless user or a hostile file gives it.

Odd lines under ``bad_lines=skip`` are skipped and reported, whatever ``chunk_bytes`` is; a file
that cannot be used stops the command with one line naming it, exit status 1, and nothing (not even
a temporary directory) left behind.  kill -9 at random points leaves a state the next run repairs.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from launching import ForkedCli, child_env, run_cli

import dlrm_cache.data.preprocess as pp
from dlrm_cache.data.format import MANIFEST, Manifest

from refdata import GOOD, check_dataset, pp_config, read_split, ref_dataset, ref_parse, tiny_synth

# Lines that once crashed preprocess or were accepted depending on their block.
ODD_LINES = [
    GOOD.replace("\t5\t", "\t 5\t", 1).encode(),  # pyarrow's int64 parser takes the space
    GOOD.replace("\t5\t", "\t0x5\t", 1).encode(),  # ... and hex
    GOOD.replace("\t5\t", "\t9223372036854775808\t", 1).encode(),  # just past int64
    GOOD.replace("\t5\t", "\t9223372036854775807\t", 1).encode(),  # int64's limit: a good line
    GOOD.replace("\t5\t", "\t\xff5\t", 1).encode("latin-1"),  # not UTF-8
    b"\xff\xfe\x00binary\t1\t2",  # not UTF-8 and the wrong field count
    b"1\t" + b"7" * (10 << 20),  # a 10 MB line
    GOOD.replace("0000000a", "0000\x00\x00\x00a", 1).encode(),  # NUL bytes
    b"\xef\xbb\xbf" + GOOD.encode(),  # a byte order mark that does not start the file
]


def _odd_raw(d: Path) -> Path:
    """tiny_synth lines with ODD_LINES spread over the splits, a BOM first and CRLF in places."""
    tiny_synth(d)
    path = d / "day_0"
    lines = path.read_bytes().split(b"\n")[:-1]
    for k, odd in enumerate(ODD_LINES):
        lines.insert(1 + k * len(lines) // len(ODD_LINES), odd)
    lines = [ln + b"\r" if k % 7 == 0 else ln for k, ln in enumerate(lines)]
    path.write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n")
    (d / "oracle.json").unlink()
    return d


def _shards_equal(a: Path, b: Path, manifest: Manifest) -> None:
    for split in ("train", "val", "test"):
        assert read_split(a, manifest, split).equals(read_split(b, manifest, split)), split
    assert pq.read_table(a / "stats/counts.parquet").equals(
        pq.read_table(b / "stats/counts.parquet")
    )


def _no_leftovers(out: Path) -> None:
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")] == []


def test_odd_lines_skipped_and_reported_whatever_chunk_bytes(tmp_path: Path, capsys) -> None:
    raw = _odd_raw(tmp_path / "raw")
    good, bad, sizes = ref_parse([raw / "day_0"])
    assert bad["line too long"] == 1 and bad["non-integer in an integer field"] == 4
    total = sum(sizes)
    n_train = int(total * 6 / 7)
    n_val = (total - n_train) // 2

    def split_of(ln) -> str:
        return "train" if ln.lineno < n_train else "val" if ln.lineno < n_train + n_val else "test"

    counts, by_split = ref_dataset(good, split_of)
    manifests = []
    for chunk_bytes in (1 << 10, 1 << 16, 32 << 20):
        out = tmp_path / f"ds{chunk_bytes}"
        manifests.append(pp.preprocess(pp_config(raw, out, chunk_bytes=chunk_bytes)))
        check_dataset(out, manifests[-1], counts, by_split)
        assert manifests[-1].bad_lines == dict(sorted(bad.items()))
        _shards_equal(out, tmp_path / "ds1024", manifests[0])
    assert manifests[1:] == manifests[:-1]
    printed = capsys.readouterr().out
    assert f"{raw / 'day_0'}:" in printed and "line too long" in printed
    # The same dataset whatever chunk_bytes: a re-run with another value is rightly up to date.
    pp.preprocess(pp_config(raw, tmp_path / "ds1024", chunk_bytes=1 << 20))
    assert "up to date" in capsys.readouterr().out


def test_dataset_of_another_line_policy_is_not_reused(tmp_path: Path) -> None:
    raw = tiny_synth(tmp_path / "raw", lines=300)
    out = tmp_path / "ds"
    pp.preprocess(pp_config(raw, out))
    settings = json.loads((out / pp.SETTINGS).read_text())
    settings["line_policy"] -= 1  # as written by a build whose acceptance of lines differed
    (out / pp.SETTINGS).write_text(json.dumps(settings))
    with pytest.raises(pp.PreprocessError, match=r"line_policy.*overwrite=true"):
        pp.preprocess(pp_config(raw, out))


# ------------------------------------------------------------------------------ the command line
def _cli(*args: str, cwd: Path, drop_root_powers: bool = False) -> subprocess.CompletedProcess:
    """The CLI in this process, or (``drop_root_powers`` under root) a child process that meets
    permission bits like a user."""
    if not (drop_root_powers and os.geteuid() == 0):
        return run_cli(*args, cwd=cwd, plain_errors=True)
    # root reads any file: without these capabilities it meets permission bits like a user
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot make a file unreadable")
    cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-m",
           "dlrm_cache", *args]  # fmt: skip
    env = child_env(plain_errors=True)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _one_line_error(res: subprocess.CompletedProcess, *needles: str) -> None:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 1, res.stderr
    assert len(lines) == 1 and lines[0].startswith("dlrm-cache preprocess: error: "), res.stderr
    for needle in needles:
        assert needle in lines[0]


def _gz(tmp: Path, cut: bool) -> Path:
    data = gzip.compress(("\n".join([GOOD] * 3000) + "\n").encode())
    p = tmp / "day_0.gz"
    p.write_bytes(
        data[: len(data) // 2]
        if cut
        else data[:20] + bytes(b ^ 0x5A for b in data[20:300]) + data[300:]
    )
    return p


def _binary(tmp: Path) -> Path:
    p = tmp / "train.txt"
    p.write_bytes(random.Random(0).randbytes(200_000))
    return p


def _parquet(tmp: Path) -> Path:
    import pyarrow as pa

    p = tmp / "part-00000.parquet"
    pq.write_table(pa.table({"label": [0.0, 1.0] * 500, "C1": list(range(1000))}), p)
    return p


def _write(name: str, data: bytes):
    def make(tmp: Path) -> Path:
        (tmp / name).write_bytes(data)
        return tmp / name

    return make


HEADER = "\t".join(["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))])
NO_LABEL = "\t".join(GOOD.split("\t")[1:])

# (case, make the input under a directory -> path given as input=, extra args, words the error names)
CORPUS = [
    ("truncated gzip", lambda t: _gz(t, cut=True), [], ["truncated or corrupt gzip"]),
    ("corrupt gzip", lambda t: _gz(t, cut=False), [], ["truncated or corrupt gzip"]),
    ("binary file", _binary, [], ["no valid training lines", "wrong field count"]),
    ("parquet file", _parquet, [], ["no valid training lines", "wrong field count"]),
    ("empty file", _write("train.txt", b""), [], ["the input has no lines"]),
    (
        "header and no label column",
        _write("train.txt", ("\n".join([HEADER] + [NO_LABEL] * 50) + "\n").encode()),
        [],
        ["wrong field count: 42", "39 fields", "without the label column", "label not 0/1: 1"],
    ),
    (
        "header line",
        _write("train.txt", ("\n".join([HEADER, GOOD]) + "\n").encode()),
        ["train_fraction=0.5"],
        ["label not 0/1: 1", "line 1 looks like a header"],
    ),
    (
        "fail on a binary line",
        _write("train.txt", b"\n".join([GOOD.encode(), b"\xff\x00\t\x01", GOOD.encode()])),
        ["bad_lines=fail"],
        [":2: wrong field count"],
    ),
    (
        "directory without data",
        lambda t: (t / "empty_dir").mkdir() or t / "empty_dir",
        [],
        ["no day_N"],
    ),
    ("special file", lambda t: Path("/dev/null"), [], ["not a regular file or a directory"]),
]


@pytest.mark.parametrize("case,make,extra,needles", CORPUS, ids=[c[0] for c in CORPUS])
def test_unusable_input_is_one_line_and_leaves_nothing(
    tmp_path: Path, case, make, extra, needles
) -> None:
    inp = make(tmp_path)
    out = tmp_path / "ds"
    res = _cli(
        "preprocess", f"input={inp}", f"output={out}", "progress=false", *extra, cwd=tmp_path
    )
    _one_line_error(res, str(inp), *needles)
    assert not out.exists()
    _no_leftovers(out)


@pytest.mark.parametrize("what", ["file", "directory", "output directory"])
def test_unreadable_input_or_unwritable_output_is_one_line(tmp_path: Path, what: str) -> None:
    tiny_synth(tmp_path / "raw", lines=200)
    (tmp_path / "out").mkdir()
    denied = {
        "file": tmp_path / "raw" / "day_0",
        "directory": tmp_path / "raw",
        "output directory": tmp_path / "out",
    }[what]
    denied.chmod(0o555 if what == "output directory" else 0)
    try:
        res = _cli(
            "preprocess",
            f"input={tmp_path / 'raw'}",
            f"output={tmp_path / 'out' / 'ds'}",
            "progress=false",
            cwd=tmp_path,
            drop_root_powers=True,
        )
    finally:
        denied.chmod(0o755)
    _one_line_error(res, "Permission denied", str(denied))
    assert not (tmp_path / "out" / "ds").exists()
    _no_leftovers(tmp_path / "out" / "ds")


def test_skipped_lines_are_reported_without_tracebacks(tmp_path: Path) -> None:
    raw = _odd_raw(tmp_path / "raw")
    # a child process: "Exception ignored" (an unraisable exception, or one at the interpreter's
    # exit) reaches a process's stderr, while pytest records it as a warning in its own
    res = run_cli("preprocess", f"input={raw}", f"output={tmp_path / 'ds'}", "progress=false",
                  cwd=tmp_path, plain_errors=True, process=True)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr
    assert (
        f"skipped {raw / 'day_0'}:" in res.stdout
        and "line too long (more than 65536 bytes)" in res.stdout
    )
    assert Manifest.load(tmp_path / "ds").bad_lines["line too long"] == 1


# ------------------------------------------------------------------------------ kill -9
def _files_building(parent: Path) -> int:
    """Files in the build directory of output ds (-1 while there is none; os.walk yields nothing
    for a directory renamed meanwhile)."""
    for build in parent.glob(".ds.tmp-*"):
        return sum(len(files) for _, _, files in os.walk(build))
    return -1


KILL_SMALL = dict(chunk_bytes=8 << 10, rows_per_shard=600)  # the builds of the tests below


@pytest.fixture(scope="module")
def raw_12k(tmp_path_factory) -> Path:
    """12,000 synthetic lines, written once for the tests below, which only read them."""
    return tiny_synth(tmp_path_factory.mktemp("raw12k") / "raw", lines=12_000)


@pytest.fixture(scope="module")
def kill_ref(raw_12k: Path, tmp_path_factory) -> tuple[Path, Manifest]:
    """The reference dataset of the kill -9 tests (KILL_SMALL), built once, read only."""
    ref = tmp_path_factory.mktemp("kill_ref") / "ref"
    return ref, pp.preprocess(pp_config(raw_12k, ref, **KILL_SMALL))


def test_a_rebuild_in_the_same_process_encodes_with_its_own_tables(
    raw_12k: Path, tmp_path: Path
) -> None:
    """``workers=1`` runs every job in this process, and a build's id tables always sit at the same
    paths there (its build directory is named by the pid): a rebuild of the output with other
    settings must encode with its own tables, not those mapped for the build before it (it did,
    with exit 0: the shards held the older build's ids)."""
    raw, small = raw_12k, dict(KILL_SMALL, workers=1)
    ref = pp.preprocess(pp_config(raw, tmp_path / "ref", **small))
    out = tmp_path / "ds"
    pp.preprocess(pp_config(raw, out, **small, min_count=2))
    assert pp.preprocess(pp_config(raw, out, **small, overwrite=True)) == ref
    _shards_equal(out, tmp_path / "ref", ref)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kill_9_at_a_random_point_then_rerun(raw_12k: Path, kill_ref, tmp_path: Path, seed: int):
    """Killed while building (even seeds: a new output; odd: replacing an older dataset), the
    output is absent or a complete dataset, and the re-run gives the reference dataset exactly."""
    raw, small, (ref_dir, ref) = raw_12k, KILL_SMALL, kill_ref
    out = tmp_path / "ds"
    if seed % 2:
        pp.preprocess(pp_config(raw, out, **small, min_count=2))  # the older dataset being replaced
    args = [f"{k}={v}" for k, v in small.items()] + ["overwrite=true", "progress=false"]
    proc = ForkedCli("preprocess", f"input={raw}", f"output={out}", *args, cwd=tmp_path)
    # Kill once the build directory holds a random number of files (0: just created, the last:
    # the manifest; during the swap the directory is gone and the kill lands on the rename).
    target = random.Random(seed).randint(0, sum(1 for p in ref_dir.rglob("*") if p.is_file()))
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        if _files_building(tmp_path) >= target:
            break
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    if out.exists():  # never half a dataset
        m = Manifest.load(out)
        assert m == ref or m.min_count == 2
    m = pp.preprocess(pp_config(raw, out, **small, overwrite=True))
    assert m == ref
    _shards_equal(out, ref_dir, ref)
    _no_leftovers(out)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in ref_dir.iterdir())
    assert (out / MANIFEST).exists()
