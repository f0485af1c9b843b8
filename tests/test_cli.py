"""The command line as a user meets it: dispatcher, config composition and its failures, packaging."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from launching import REPO, child_env, run_cli
from omegaconf.errors import ValidationError

from dlrm_cache.commands.store import config_dir, register_configs

cli = run_cli  # the CLI in this process (tests/launching.py)


def compose_train(overrides):
    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def test_help_and_unknown_command(tmp_path):
    res = cli("--help", cwd=tmp_path, process=True)  # `python -m dlrm_cache` itself
    assert res.returncode == 0 and "preprocess" in res.stdout and "freq_cache" in res.stdout
    res = cli("trian", cwd=tmp_path)
    assert res.returncode == 2 and "unknown command 'trian' (did you mean 'train'?)" in res.stderr


def test_cfg_job_from_any_directory(tmp_path):
    res = cli(
        "train",
        "embedding=freq_cache",
        "model.embedding_dim=64",
        "optim.sparse.lr=0.5",
        "--cfg",
        "job",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert "FreqCacheBackend" in res.stdout and "embedding_dim: 64" in res.stdout
    assert "lr: 0.5" in res.stdout


@pytest.mark.parametrize(
    "override, error",
    [
        (["embedding=freq_cache", "embedding.polcy=lru"], "polcy"),
        (["model.embedding_dim=abc"], "embedding_dim"),
        (["data.batch_size=1.5"], "batch_size"),
        (["embedding=nope"], "nope"),
        (["optim.sparse.momentum=0.9"], "momentum"),
    ],
)
def test_bad_overrides_fail_at_composition(override, error):
    with pytest.raises((ConfigCompositionException, ValidationError)) as e:
        compose_train(override)
    assert error in str(e.value) + str(e.value.__cause__)


def test_cli_bad_override_is_one_clear_error(tmp_path):
    res = cli("train", "embedding=freq_cache", "embedding.cache_ratio=lots", cwd=tmp_path)
    assert res.returncode != 0
    assert "cache_ratio" in res.stderr and "Traceback" not in res.stderr


def test_every_backend_config_composes():
    for name, target in [
        ("host", "HostBackend"),
        ("hbm", "HbmBackend"),
        ("uvm_cache", "UvmCacheBackend"),
        ("freq_cache", "FreqCacheBackend"),
    ]:
        cfg = compose_train([f"embedding={name}"])
        assert cfg.embedding._target_.endswith(target)


def test_wheel_ships_configs(tmp_path):
    """A non-editable install finds its configs: build the wheel, run the CLI from its contents."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "whl"),
            str(REPO),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    wheel = next((tmp_path / "whl").glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert (
        "dlrm_cache/configs/train.yaml" in names
        and "dlrm_cache/configs/embedding/freq_cache.yaml" in names
    )
    # every package of the source tree ships (pyproject lists them one by one)
    packages = {str(p.relative_to(REPO)) for p in (REPO / "dlrm_cache").rglob("__init__.py")}
    assert packages <= set(names), sorted(packages - set(names))
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    res = subprocess.run(
        [sys.executable, "-m", "dlrm_cache", "train", "--cfg", "job"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "HostBackend" in res.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "data.path=/nonexistent/ds"], "/nonexistent/ds/manifest.json: no manifest"),
        (
            ["preprocess", "input=/nonexistent/raw", "output=/tmp/never"],
            "input /nonexistent/raw does not exist",
        ),
        (
            ["plan", "data.path=/nonexistent/ds"],
            "/nonexistent/ds/manifest.json: no manifest; run `dlrm-cache preprocess` first (or point data.path at",
        ),
        (["bench", "kind=preprocess"], "preprocess_input: kind=preprocess needs raw Criteo text"),
        (
            ["bench", "kind=preprocess", "preprocess_input=/nonexistent/raw"],
            "preprocess_input=/nonexistent/raw: no such file or directory",
        ),
        # Hydra's own composition errors, one line too
        (
            ["train", "embedding=nope"],
            "Could not find 'embedding/nope'; choose one of: freq_cache, hbm, host, uvm_cache",
        ),
        (
            ["train", "data.batch_size=abc"],
            "override data.batch_size=abc: Value 'abc' of type 'str' could not be",
        ),
        # a path with characters the override grammar reserves: which override, and the quotes
        (
            ["preprocess", "input=/data/day=1/raw", "output=/tmp/never"],
            "override input=/data/day=1/raw: mismatched input '=' expecting <EOF>; a value with "
            "characters Hydra's override grammar reserves",
        ),
        (
            ["preprocess", "input=/data/a,b/raw", "output=/tmp/never"],
            "a list is key=[a,b], a sweep needs -m; a value with characters Hydra's override "
            "grammar reserves (, = [ ] { } ( ) ' \" \\ or non-ASCII letters: a path's) is a "
            "string inside quotes, the override itself quoted for the shell: 'key=\"value\"'",
        ),
        (
            ["bench", "nosuchkey=1"],
            "Could not override 'nosuchkey': Key 'nosuchkey' not in 'BenchConfig'",
        ),
        # a misspelt key: the key it most likely meant (before: only "not in 'TrainConfig'")
        (
            ["train", "max_step=3"],
            "Key 'max_step' not in 'TrainConfig' (did you mean max_steps?)",
        ),
        (
            ["train", "embedding=freq_cache", "embedding.cach_ratio=0.1"],
            "not in 'FreqCacheEmbeddingConfig' (did you mean embedding.cache_ratio?)",
        ),
        (
            ["train", "embeding=hbm"],
            "Key 'embeding' not in 'TrainConfig' (did you mean embedding?)",
        ),
        (
            ["train", "max_step=3", "--help"],
            "Key 'max_step' not in 'TrainConfig' (did you mean max_steps?)",
        ),
        (
            ["train", "-m", "embedding=freq_cache", "embedding.policy=lru,often"],
            "Invalid value 'often', expected one of",
        ),
        pytest.param(
            ["train", "device=cuda:0"],
            "device=cuda:0: CUDA is not available",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA"),
        ),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, message):
    res = cli(*args, cwd=tmp_path)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and message in lines[0]
        and lines[0].startswith(f"dlrm-cache {args[0]}: error:")
    ), res.stderr


def test_a_reader_that_leaves_stops_no_command(tmp_path):
    """stdout (and stderr: the progress bars) a pipe whose reader has gone (`dlrm-cache ... 2>&1 |
    head -1`), or stderr closed (`2>&-`): the command goes on and ends as it would have (its
    output complete, exit status 0), instead of a BrokenPipeError traceback (the usage) or a build
    dropped at its first progress bar or its report table (preprocess: no dataset)."""
    raw, out = tmp_path / "raw", tmp_path / "ds"
    env = child_env()
    env.pop("DLRM_CACHE_TRACEBACK", None)

    def close_stderr():
        os.close(2)

    for args, stderr, before in (
        (["--help"], subprocess.PIPE, None),
        (
            ["synth", f"output={raw}", "lines=3000", "cardinality_scale=0.001"],
            subprocess.STDOUT,
            None,
        ),
        (
            ["preprocess", f"input={raw}", f"output={out}", "rows_per_shard=1000"],
            None,
            close_stderr,
        ),
    ):
        p = subprocess.Popen(
            [sys.executable, "-m", "dlrm_cache", *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            preexec_fn=before,
            text=True,
        )
        p.stdout.close()  # the reader is gone before the command writes its first line
        err = p.stderr.read() if p.stderr else ""
        assert p.wait(timeout=120) == 0 and "Traceback" not in err and "pipe" not in err, args
    res = cli("verify", str(out), cwd=tmp_path)
    assert res.returncode == 0 and "every page checksum and the manifest agree" in res.stdout


def test_synth_and_preprocess_write_nothing_where_they_run(tmp_path):
    """Their outputs record their settings (oracle.json, preprocess.json): nothing else is
    written, so they also run from a directory the user may not write (Hydra's default made
    outputs/<command>/<time>/cli.log there, and failed in a read-only one)."""
    work, data = tmp_path / "work", tmp_path / "data"
    work.mkdir()
    for args in (
        ["synth", f"output={data / 'raw'}", "lines=2000", "cardinality_scale=0.001"],
        ["preprocess", f"input={data / 'raw'}", f"output={data / 'ds'}"],
    ):
        res = cli(*args, "progress=false", cwd=work)
        assert res.returncode == 0, res.stderr
    assert list(work.iterdir()) == []
    assert (data / "ds" / "manifest.json").is_file()


def test_a_non_ascii_path_under_a_non_utf8_file_system_encoding_is_one_line(tmp_path):
    """With the file system encoding not UTF-8 (here ``PYTHONUTF8=0`` under the C locale) a
    non-ASCII path decodes into escapes no file name has, and pyarrow, which takes UTF-8 names,
    found every shard of an intact dataset missing or damaged ("preprocess again"): the command
    now stops first, in one line that says how to run it."""
    data = tmp_path / "données"
    data.mkdir()
    env = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    r = run_cli("verify", str(data), cwd=tmp_path, env_extra=env, plain_errors=True, process=True)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert "non-ASCII" in lines[0] and "PYTHONUTF8=1" in lines[0], lines[0]
    # under UTF-8 the same path is an ordinary one (here: not a dataset yet)
    r = run_cli("verify", str(data), cwd=tmp_path, env_extra={"PYTHONUTF8": "1"},
                plain_errors=True, process=True)  # fmt: skip
    assert r.returncode == 1 and "non-ASCII" not in r.stderr and "manifest" in r.stderr, r.stderr


def test_plan_and_bench_write_only_their_outputs(processed_synth, tmp_path):
    """plan and bench made outputs/<command>/<time>/cli.log wherever they ran, also after a
    failure; like the other commands they now write only what they make (the figure)."""
    for args, code in (
        (["plan", "data.path=missing"], 1),
        (["bench", "kind=loader"], 1),  # needs data_path
        (["plan", f"data.path={processed_synth}", "ratios=[0.05]", "figure=null"], 0),
    ):
        res = cli(*args, cwd=tmp_path, plain_errors=True)
        assert res.returncode == code, res.stderr
        assert list(tmp_path.iterdir()) == [], args
    res = cli("plan", f"data.path={processed_synth}", "ratios=[0.05]", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (figure,) = tmp_path.rglob("*.*")
    assert figure.relative_to(tmp_path).parts[:2] == ("outputs", "plan")
    assert figure.name == "plan.png" and f"figure {figure.relative_to(tmp_path)}" in res.stdout


def test_plan_and_bench_outputs_follow_the_outputs_rule(processed_synth, tmp_path):
    """plan output= the dataset's manifest.json replaced it with the plan (the dataset it read was
    gone), bench output= a run's summary.json replaced that, and a figure= directory failed after
    the work with "[Errno 21] Is a directory": each is now one line naming the key, before any
    work, and the file named is left as it was."""
    data = tmp_path / "data"
    shutil.copytree(processed_synth, data)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    (run / "summary.json").write_text("{}")
    (tmp_path / "adir").mkdir()
    manifest = (data / "manifest.json").read_bytes()
    plan = ["plan", f"data.path={data}", "ratios=[0.05]"]
    bench = ["bench", "kind=embedding", "iters=1", "rows_per_table=64", "device=cpu"]
    for args, message in (
        ([*plan, f"output={data / 'manifest.json'}", "figure=null"], "lies inside the dataset"),
        ([*plan, f"figure={data / 'stats' / 'plan.png'}"], "lies inside the dataset"),
        ([*plan, f"output={data}", "figure=null"], "is the dataset"),
        ([*plan, "figure=adir"], "figure=adir: is a directory; name a file"),
        ([*bench, f"output={run / 'summary.json'}", "figure=null"], "lies inside the run"),
        ([*bench, "figure=adir"], "figure=adir: is a directory; name a file"),
    ):
        res = cli(*args, cwd=tmp_path, plain_errors=True)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 1 and len(lines) == 1 and message in lines[0], (args, res.stderr)
        assert lines[0].startswith(f"dlrm-cache {args[0]}: error: "), lines
        assert res.stdout == "", (args, res.stdout)  # refused before the work
    assert (data / "manifest.json").read_bytes() == manifest
    assert not (data / "stats" / "plan.png").exists()
    assert (run / "summary.json").read_text() == "{}"
    assert list((tmp_path / "adir").iterdir()) == []


def test_a_sweep_whose_jobs_share_an_output_is_refused_before_any_job(tmp_path):
    """`synth -m seed=1,2 output=raw` ran both jobs into one directory, the second replacing the
    first's files, exit 0 (plan's output= and figure= likewise): one line naming the key, before
    any job (nothing written); a sweep that gives every job its own output runs."""
    synth = ["synth", "-m", "lines=200", "cardinality_scale=0.001", "progress=false"]
    for args, key in (
        ([*synth, "seed=1,2", "output=raw"], "output=raw: the 2 jobs"),
        ([*synth, "seed=1,2", "output=a,b"], "output=a,b: the 4 jobs"),
        (["plan", "-m", "embedding.lookahead=1,2", "output=p.json", "figure=null"], "output=p."),
        (["plan", "-m", "embedding.lookahead=1,2", "figure=p.png"], "figure=p.png: the 2 jobs"),
    ):
        res = cli(*args, cwd=tmp_path, plain_errors=True)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 1 and len(lines) == 1, (args, res.stderr)
        assert lines[0].startswith(f"dlrm-cache {args[0]}: error: {key}"), lines
        assert "would write fewer outputs than jobs" in lines[0]
        assert list(tmp_path.iterdir()) == [], args
    res = cli(*synth, "output=a,b", cwd=tmp_path, plain_errors=True)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "a" / "day_0").is_file() and (tmp_path / "b" / "day_0").is_file()


def test_an_output_where_nothing_can_be_written_is_one_line_before_the_work(
    processed_synth, read_only_dir, tmp_path
):
    """synth, plan and bench failed with a bare "[Errno 30] Read-only file system: '.x.tmp'"
    naming no key (plan and bench after all their work); now one line naming the key, first."""
    ro = read_only_dir
    plan = ["plan", f"data.path={processed_synth}", "ratios=[0.05]"]
    bench = ["bench", "kind=embedding", "iters=1", "rows_per_table=64", "device=cpu"]
    for args, key in (
        (["synth", "lines=100", f"output={ro / 'raw'}", "progress=false"], f"output={ro / 'raw'}"),
        ([*plan, f"output={ro / 'p.json'}", "figure=null"], f"output={ro / 'p.json'}"),
        ([*plan, f"figure={ro / 'sub' / 'p.png'}"], f"figure={ro / 'sub' / 'p.png'}"),
        ([*bench, f"output={ro / 'b.json'}", "figure=null"], f"output={ro / 'b.json'}"),
    ):
        res = cli(*args, cwd=tmp_path, plain_errors=True)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 1 and len(lines) == 1, (args, res.stderr)
        assert lines[0].startswith(f"dlrm-cache {args[0]}: error: {key}: cannot create files in")
        assert res.stdout == "", (args, res.stdout)
    assert list(ro.iterdir()) == []


def test_a_bool_key_takes_only_true_or_false(tmp_path):
    """``progress=yes`` was taken as true (OmegaConf reads yes/no/on/off/1/0 as bools), so a
    bool key passed values a typo would not: it is one line naming the key, before a run starts."""
    for typed in ("progress=yes", "test=1", "data.shuffle=off"):
        res = cli("train", "data.path=missing", typed, cwd=tmp_path, plain_errors=True)
        key = typed.split("=")[0]
        assert res.returncode == 1, res.stderr
        assert res.stderr.strip() == f"dlrm-cache train: error: {typed}: {key} is true or false"
        assert not [p for p in tmp_path.rglob("*") if not p.is_dir()]  # no run directory
