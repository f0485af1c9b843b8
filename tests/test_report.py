"""`dlrm-cache report` and the plan/bench figures, from real short runs: the files are PNGs and the
numbers drawn are the ones in the runs' files (checked on the plotted series, not on pixels)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from launching import child_env, run_cli
from omegaconf import OmegaConf
from PIL import Image
from tiny import TINY_MODEL

from dlrm_cache.bench.run import bench, bench_series
from dlrm_cache.cli import main, split_run_dirs
from dlrm_cache.commands.store import config_dir, register_configs
from dlrm_cache.config.schemas import (
    BenchConfig,
    DataConfig,
    FreqCacheEmbeddingConfig,
    ModelConfig,
    PlanConfig,
)
from dlrm_cache.data.stats import load_counts
from dlrm_cache.embedding.base import SparseOptim
from dlrm_cache.embedding.freq_cache.layout import plan_table
from dlrm_cache.report.runs import compare, find_runs, load_run
from dlrm_cache.report.series import run_panels, sweep_panels, worst_hit_tables
from dlrm_cache.report.sizing import plan, plan_series
from dlrm_cache.train.loop import train

RATIOS = [0.02, 0.05, 0.2]
SMALL = [
    "device=cpu",
    "progress=false",
    "data.batch_size=256",
    *TINY_MODEL,
    "max_steps=12",
    "log_every=3",
    "eval_every=6",
]


cli = run_cli  # the CLI in this process (tests/launching.py)


@pytest.fixture(scope="session")
def sweep(processed_synth: Path, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One real `dlrm-cache train -m` over three cache ratios (a Hydra sweep directory), in a
    process of its own: its first job's start-up includes the interpreter and the imports."""
    root = tmp_path_factory.mktemp("sweep")
    # data.path relative to where train ran, as `make` runs it: report finds the stats from anywhere
    res = cli(
        "train",
        "-m",
        "embedding=freq_cache",
        f"embedding.cache_ratio={','.join(map(str, RATIOS))}",
        f"data.path={processed_synth.name}",
        f"hydra.sweep.dir={root / 'multirun'}",
        *SMALL,
        cwd=processed_synth.parent,
        process=True,
    )
    assert res.returncode == 0, res.stderr
    return root / "multirun", res


@pytest.fixture(scope="session")
def host_run(processed_synth: Path, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("host") / "run"
    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(
            config_name="train",
            overrides=[f"data.path={processed_synth}", f"run_dir={run}", *SMALL],
        )
    train(cfg)
    return run


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_png(path: Path) -> None:
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] >= 600 and im.size[1] >= 300
        im.load()  # decodes the whole image


def report_cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        main(["report", *args])
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_train_says_where_its_files_are_and_the_console_is_clean(sweep):
    root, res = sweep
    me = f"{sys.executable} -m dlrm_cache"  # as the test ran it (tests/test_readme_commands.py)
    if shutil.which("python") == sys.executable:
        me = "python -m dlrm_cache"
    for job in range(3):
        assert f"plots:     {me} report {root / str(job)}\n" in res.stdout
    assert f"sweep:     {me} report {root}   (once every job has finished)" in res.stdout
    # torchrec's first forward triggers torch.fx's is_fx_tracing notice: filtered at its logger
    assert "is_fx_tracing" not in res.stderr and "Traceback" not in res.stderr
    assert res.stderr.strip() == "", res.stderr


def test_the_summary_reads_as_numbers_for_people(sweep):
    """Console table, summary.json and report.md: what matters first, integers for counts, seconds
    and bytes in units, the placement by the name typed; summary.json keeps plain numbers."""
    root, res = sweep
    first = ["val_auc", "val_logloss", "train_samples_per_s", "embedding_hit_rate"]
    tables = res.stdout.split("dlrm-cache train: ")[1:]
    assert len(tables) == 3
    for job, table in enumerate(tables):
        summary = json.loads((root / str(job) / "summary.json").read_text())
        assert list(summary)[:4] == first  # the file in the same order, its values plain numbers
        assert isinstance(summary["embedding_cache_bytes"], float)
        rows = dict(re.findall(r"^\| (\S+) +\| +(.+?) \|$", table, re.M))
        assert list(rows)[:4] == first
        assert rows["val_auc"] == f"{summary['val_auc']:.4f}"
        assert rows["train_samples_per_s"] == f"{summary['train_samples_per_s']:,.0f}"
        assert rows["steps"] == "12" and rows["train_samples"] == f"{12 * 256:,}"
        assert rows["embedding_accesses"] == f"{26 * 12 * 256:,}"
        assert re.fullmatch(r"\d[\d.]* (s|ms)", rows["startup_s"]), rows["startup_s"]
        assert re.fullmatch(r"\d[\d.]* (s|ms)", rows["train_seconds"]), rows["train_seconds"]
        mb = summary["embedding_cache_bytes"] / 1e6
        assert rows["embedding_cache_bytes"] == (f"{mb:,.1f} MB" if mb >= 1 else f"{mb:.3f} MB")
    assert res.stdout.count("embedding=freq_cache\n") == 3 and "Backend" not in res.stdout
    code, _, err = report_cli_in(root / "0")
    assert code == 0, err
    md = (root / "0" / "report.md").read_text()
    assert "\nfreq_cache cache_ratio=0.02 | 12 steps" in md
    rows = re.findall(r"^\| (\S+) \| (.+) \|$", md, re.M)[1:]
    assert [k for k, _ in rows[:4]] == first
    assert dict(rows)["embedding_cache_bytes"].endswith(" MB")


def report_cli_in(run: Path) -> tuple[int, str, str]:
    res = cli("report", str(run), cwd=run)
    return res.returncode, res.stdout, res.stderr


def test_one_run_panels_are_the_runs_records(sweep):
    run_dir = sweep[0] / "0"
    run = load_run(run_dir)
    recs = records(run_dir)
    train_recs = [r for r in recs if r["kind"] == "train"]
    evals = [r for r in recs if r["kind"] == "eval"]
    summary = json.loads((run_dir / "summary.json").read_text())
    panels = {p.key: p for p in run_panels(run, worst_tables=2)}
    assert list(panels) == [
        "loss",
        "samples_per_s",
        "val_auc",
        "val_logloss",
        "hit_rate",
        "rows_moved",
        "waits",
    ]

    steps = [3, 6, 9, 12]
    assert [r["step"] for r in train_recs] == steps
    (loss,) = panels["loss"].lines
    assert loss.x == steps and loss.y == [r["loss"] for r in train_recs]
    assert panels["samples_per_s"].lines[0].y == [r["samples_per_s"] for r in train_recs]
    assert panels["val_auc"].lines[0].x == [6, 12] == [r["step"] for r in evals]
    assert panels["val_auc"].lines[0].y == [r["auc"] for r in evals]
    assert panels["val_auc"].hlines == [
        (f"planted model (oracle) AUC {summary['oracle_auc']:.4f}", summary["oracle_auc"])
    ]
    assert panels["val_logloss"].lines[0].y == [r["logloss"] for r in evals]
    # the two tables with the lowest hit rate over the run: the summary's, recomputed by train
    tables = sorted(
        (k[len("embedding_hit_rate/") :] for k in summary if k.startswith("embedding_hit_rate/")),
        key=lambda t: summary[f"embedding_hit_rate/{t}"],
    )[:2]
    hit = panels["hit_rate"].lines
    assert [line.label for line in hit] == ["all tables (lookups)"] + [f"table {t}" for t in tables]
    assert hit[0].y == [r["hit_rate"] for r in train_recs]
    assert hit[1].y == [r[f"hit_rate/{tables[0]}"] for r in train_recs]
    # counters cover log_every=3 steps each: drawn per step
    loaded, written = panels["rows_moved"].lines
    assert loaded.y == pytest.approx([r["rows_loaded"] / 3 for r in train_recs])
    assert written.y == pytest.approx([r["rows_written_back"] / 3 for r in train_recs])
    assert sum(loaded.y) > 0
    stall, wait = panels["waits"].lines
    assert stall.y == pytest.approx([1000 * r["stall_s"] / 3 for r in train_recs])
    assert wait.y == pytest.approx([1000 * r["transfer_wait_s"] / 3 for r in train_recs])


def test_hit_rates_are_the_raw_counters_weighted_by_accesses(sweep):
    """log_every=3, eval_every=6: the interval after each evaluation once counted an empty
    interval's 0.0 per table with weight 1 (per-table rates halved).  Recomputed here from the
    counts: one lookup per sample per table, per-table hits adding up to the pooled hits."""
    for job in range(3):
        run_dir = sweep[0] / str(job)
        train_recs = [r for r in records(run_dir) if r["kind"] == "train"]
        summary = json.loads((run_dir / "summary.json").read_text())
        names = [k.split("/", 1)[1] for k in summary if k.startswith("embedding_hit_rate/")]
        assert len(names) == 26
        for r in train_recs:
            each = r["accesses"] / 26  # every sample looks up one row of every table
            per_table = [r.get(f"hit_rate/{t}", 0) * each for t in names]
            assert per_table == pytest.approx([round(h) for h in per_table], abs=1e-6)
            assert sum(per_table) == pytest.approx(r["hit_rate"] * r["accesses"], abs=1e-6)
        assert all(r[f"accesses/{t}"] == r["accesses"] / 26 for r in train_recs for t in names)
        for t in names:
            accesses = sum(r[f"accesses/{t}"] for r in train_recs)
            assert accesses == summary["train_samples"] == summary[f"embedding_accesses/{t}"]
            hits = sum(round(r[f"hit_rate/{t}"] * r[f"accesses/{t}"]) for r in train_recs)
            assert summary[f"embedding_hit_rate/{t}"] == pytest.approx(hits / accesses, abs=1e-12)
        assert summary["embedding_accesses"] == 26 * summary["train_samples"]


def test_startup_is_measured_per_job_of_a_sweep(sweep):
    """The jobs of `train -m` run in one process: a later job's start-up does not include the
    earlier jobs (it was the time since the process started: 2.7 -> 7.2 -> 11.0 s)."""
    root = sweep[0]
    startup = []
    for job in range(3):
        recs = records(root / str(job))
        (first,) = [r for r in recs if r["kind"] == "first_step"]
        # the log opens after the job has started: its clock is a lower bound
        assert first["startup_s"] >= first["time"]
        startup.append(first["startup_s"])
    # job 0 waited for the interpreter and the imports; jobs 1 and 2 only for their build
    assert startup[1] < startup[0] and startup[2] < startup[0], startup


def test_host_run_has_no_cache_panels(host_run):
    run = load_run(host_run)
    assert [p.key for p in run_panels(run)] == ["loss", "samples_per_s", "val_auc", "val_logloss"]
    assert worst_hit_tables(run, 3) == []


def test_resumed_run_counts_steps_from_its_restart(sweep, tmp_path):
    """A resumed run appends a start record: per-step counters restart from its step."""
    run_dir = tmp_path / "resumed"
    shutil.copytree(sweep[0] / "0", run_dir)
    recs = records(run_dir)
    start, train_recs = recs[0], [r for r in recs if r["kind"] == "train"]
    lines = [start, train_recs[0], {**start, "step": 5}, {**train_recs[1], "step": 9}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    rows = {p.key: p for p in run_panels(load_run(run_dir))}["rows_moved"].lines[0]
    assert rows.x == [3, 9]
    assert rows.y == pytest.approx(
        [train_recs[0]["rows_loaded"] / 3, train_recs[1]["rows_loaded"] / 4]
    )


def test_sweep_panels_are_the_summaries_and_the_plan(sweep, processed_synth):
    runs, sweep_dir = find_runs([sweep[0]])
    assert sweep_dir == sweep[0] and [r.path.name for r in runs] == ["0", "1", "2"]
    s = compare(runs)
    assert s.keys == ["embedding.cache_ratio"] and s.numeric and s.x == RATIOS
    summaries = [json.loads((sweep[0] / str(i) / "summary.json").read_text()) for i in range(3)]
    panels = {p.key: p for p in sweep_panels(s)}
    assert list(panels) == ["val_auc", "samples_per_s", "hit_rate", "rows_loaded"]
    assert panels["val_auc"].lines[0].y == [x["val_auc"] for x in summaries]
    assert panels["samples_per_s"].lines[0].y == [x["train_samples_per_s"] for x in summaries]
    measured, predicted = panels["hit_rate"].lines
    assert measured.x == predicted.x == RATIOS
    assert measured.y == [x["embedding_hit_rate"] for x in summaries]
    # plan's prediction for the cache each run had: its window sized for batches of 256
    lookahead = FreqCacheEmbeddingConfig.lookahead
    assert predicted.y == [
        plan_table(load_counts(processed_synth), [r], 0.5, lookahead, 256)[0]["hit_rate"]
        for r in RATIOS
    ]
    assert panels["rows_loaded"].lines[0].y == pytest.approx(
        [x["embedding_rows_loaded"] / x["steps"] for x in summaries]
    )
    assert panels["hit_rate"].x_percent and panels["hit_rate"].xscale == "log"


def test_report_command_writes_pngs_and_markdown(sweep, capsys):
    root = sweep[0]
    code, out, err = report_cli(capsys, str(root))
    assert code == 0, err
    assert_png(root / "report.png")
    md = (root / "report.md").read_text()
    assert "![runs compared](report.png)" in md
    for i, ratio in enumerate(RATIOS):  # one table row per run, with its own numbers
        s = json.loads((root / str(i) / "summary.json").read_text())
        assert (
            f"| {root.parent.name}/multirun/{i} | {ratio:g} | 12 | {s['val_auc']:.4f} | {s['val_logloss']:.4f} |"
            in md
        )
    code, out, err = report_cli(capsys, str(root / "1"))
    assert (
        code == 0
        and out.strip()
        == f"dlrm-cache report: wrote {root / '1' / 'report.png'} and {root / '1' / 'report.md'}"
    )
    assert_png(root / "1" / "report.png")
    summary = json.loads((root / "1" / "summary.json").read_text())
    assert f"| val_auc | {summary['val_auc']:.4f} |" in (root / "1" / "report.md").read_text()


def test_report_several_runs_positional_and_as_override(sweep, host_run, tmp_path, capsys):
    """Run directories compared side by side; `report A B` is the same as `report runs=[A,B]`."""
    out_dir = tmp_path / "cmp"
    code, _, err = report_cli(capsys, str(sweep[0] / "0"), str(host_run), f"output={out_dir}")
    assert code == 0, err
    assert_png(out_dir / "report.png")
    s = compare([load_run(sweep[0] / "0"), load_run(host_run)])
    assert not s.numeric and "embedding._target_" in s.keys and s.x == [0, 1]
    assert s.labels == ["freq_cache\ncache_ratio=0.02", "host"]  # as the user typed them
    assert split_run_dirs([str(host_run), "b", "output=x", "runs=[c]"]) == (
        [str(host_run), "b"],
        ["output=x", "runs=[c]"],
    )
    code, _, err = report_cli(
        capsys, f"runs=[{sweep[0] / '0'},{host_run}]", f"output={tmp_path / 'cmp2'}"
    )
    assert code == 0, err
    assert (tmp_path / "cmp2" / "report.md").read_text().replace("cmp2", "cmp") == (
        out_dir / "report.md"
    ).read_text()


def test_run_dirs_after_an_override_and_a_sweep_among_runs(sweep, host_run, tmp_path, capsys):
    """`report output=X RUN` failed with Hydra's "Error parsing override 'RUN'" (a path after an
    override was taken as one), and `report RUN SWEEP` said of the sweep directory that it is
    "nor a sweep directory"."""
    out_dir = tmp_path / "after"
    code, _, err = report_cli(capsys, f"output={out_dir}", str(host_run))
    assert code == 0, err
    assert_png(out_dir / "report.png")
    assert split_run_dirs(["output=x", "a", "--cfg", "job", "b"]) == (
        ["a", "b"],
        ["output=x", "--cfg", "job"],
    )
    code, _, err = report_cli(capsys, str(host_run), str(sweep[0]), f"output={tmp_path / 'mix'}")
    assert code == 1
    assert err.strip() == (
        f"dlrm-cache report: error: {sweep[0]}: a sweep directory is reported alone "
        f"(dlrm-cache report {sweep[0]}); to compare some of its jobs with other runs, name the "
        "jobs' directories"
    )
    assert not (tmp_path / "mix").exists()


def test_report_reads_the_null_auc_of_an_empty_validation_split(dataset_writer, tmp_path, capsys):
    """train writes a non-finite metric (the AUC of no samples) as null; report reads its runs."""
    data, run = tmp_path / "ds", tmp_path / "run"
    dataset_writer(data, {"train": 1200, "val": 0}, [50, 200, 30])
    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        overrides = [f"data.path={data}", f"run_dir={run}", *SMALL, "max_steps=4", "eval_every=2"]
        train(compose(config_name="train", overrides=overrides))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["val_auc"] is None and summary["val_samples"] == 0
    assert [r["auc"] for r in records(run) if r["kind"] == "eval"] == [None, None]
    code, _, err = report_cli(capsys, str(run))
    assert code == 0, err
    assert_png(run / "report.png")
    assert "| val_auc | n/a |" in (run / "report.md").read_text()
    shutil.copytree(run, tmp_path / "again", ignore=shutil.ignore_patterns("report.*"))
    code, _, err = report_cli(capsys, str(run), str(tmp_path / "again"), f"output={tmp_path}")
    assert code == 0, err
    assert "| 4 | n/a | n/a |" in (tmp_path / "report.md").read_text()


def test_report_cli_positional_run_dir(sweep, tmp_path):
    res = cli("report", str(sweep[0] / "2"), f"output={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert_png(tmp_path / "report.png")
    assert (
        not list(tmp_path.glob("*.log")) and not (tmp_path / "outputs").exists()
    )  # nothing but the report


def _bad_runs(tmp_path: Path, sweep_dir: Path) -> dict[str, tuple[list[str], str]]:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    other = tmp_path / "other"
    shutil.copytree(sweep_dir / "1", other)
    recs = records(other)
    recs[0]["config"]["data"]["path"] = "/somewhere/else"
    (other / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    garbled = tmp_path / "garbled"
    garbled.mkdir()
    (garbled / "metrics.jsonl").write_text('{"kind": "start", "config": {}}\n{"kind": "tra')
    return {
        "not a run": ([str(tmp_path / "nothing")], f"{tmp_path / 'nothing'}: not a run directory"),
        "empty": ([str(empty)], f"{empty / 'metrics.jsonl'}: empty"),
        "mixed": (
            [str(sweep_dir / "0"), str(other)],
            "runs of different datasets cannot be compared",
        ),
        "garbled": ([str(garbled)], f"{garbled / 'metrics.jsonl'}:2: not a JSON record"),
        "no runs": ([], "runs: name at least one run directory"),
    }


@pytest.mark.parametrize("case", ["not a run", "empty", "mixed", "garbled", "no runs"])
def test_bad_input_is_one_line(case, sweep, tmp_path, capsys):
    args, message = _bad_runs(tmp_path, sweep[0])[case]
    code, out, err = report_cli(capsys, *args, f"output={tmp_path / 'out'}")
    assert code == 1
    lines = err.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("dlrm-cache report: error: ")
        and message in lines[0]
    ), err
    assert not (tmp_path / "out").exists()


def test_an_output_that_is_a_file_is_one_line_and_left_alone(sweep, tmp_path, capsys):
    """Before: ``[Errno 17] File exists: '...'``, naming no key."""
    taken = tmp_path / "preds.csv"
    taken.write_text("kept\n")
    code, out, err = report_cli(capsys, str(sweep[0] / "1"), f"output={taken}")
    assert code == 1
    assert err.strip() == (
        f"dlrm-cache report: error: output={taken}: is a file; report writes report.png and "
        "report.md into a directory"
    )
    assert taken.read_text() == "kept\n"


def test_an_output_where_nothing_can_be_written_is_one_line(host_run, read_only_dir, capsys):
    """Before: "[Errno 30] Read-only file system: '...'", naming no key."""
    rep = read_only_dir / "rep"
    code, _, err = report_cli(capsys, str(host_run), f"output={rep}")
    assert code == 1
    assert err.strip().startswith(
        f"dlrm-cache report: error: output={rep}: cannot create files in {read_only_dir}"
    ), err


def test_plan_figure_draws_the_plan(processed_synth, tmp_path):
    ratios = [0.01, 0.05, 0.2]
    cfg = OmegaConf.structured(
        PlanConfig(
            data=DataConfig(path=str(processed_synth)),
            model=ModelConfig(embedding_dim=16),
            embedding=FreqCacheEmbeddingConfig(batch_size=256),
            ratios=ratios,
            per_table=True,
            figure=str(tmp_path / "plan.png"),
        )
    )
    rows = plan(cfg)
    assert_png(tmp_path / "plan.png")
    series = plan_series(rows, SparseOptim("rowwise_adagrad").row_bytes(16), 16, per_table=True)
    # the cache plan sizes: its window region for the configured look-ahead and batch included
    emb = cfg.embedding
    expected = plan_table(
        load_counts(processed_synth), ratios, emb.static_fraction, emb.lookahead, emb.batch_size
    )
    assert series["ratio"] == ratios
    assert series["hit_rate"] == [r["hit_rate"] for r in expected]
    assert series["hit_rate_per_table_caches"] == [r["hit_rate_per_table_caches"] for r in expected]
    # rows of 16 floats + one rowwise-Adagrad float
    assert series["cache_mib"] == pytest.approx(
        [r["cache_rows"] * 17 * 4 / 2**20 for r in expected]
    )
    assert series["per_table"]["C3"] == [r["per_table"]["C3"] for r in expected]
    assert len(series["per_table"]) == 26


def test_bench_figure_draws_the_table(tmp_path):
    cfg = OmegaConf.structured(
        BenchConfig(
            kind="embedding",
            num_tables=3,
            rows_per_table=500,
            warmup=2,
            iters=3,
            distinct_batches=4,
            batch_size=64,
            embedding_dim=8,
            device="cpu",
            backends=["host", "hbm", "freq_cache"],
            cache_ratios=[0.05],
            figure=str(tmp_path / "bench.png"),
        )
    )
    results = bench(cfg)
    assert_png(tmp_path / "bench.png")
    s = bench_series(results)
    ran = [r for r in results if "error" not in r]
    assert s["variant"] == [r["variant"] for r in ran]
    assert s["baseline"] == ("hbm" if "hbm" in s["variant"] else "host")
    assert s["ms_per_iter"] == [r["ms_per_iter"] for r in ran]
    assert s["relative"] == [r[f"speed_vs_{s['baseline']}"] for r in ran]
    assert s["relative"][s["variant"].index(s["baseline"])] == 1.0
    assert [v for v, _ in s["skipped"]] == [r["variant"] for r in results if "error" in r]


def test_commands_do_not_import_the_plotting_module():
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, dlrm_cache.cli, dlrm_cache.train.loop, dlrm_cache.report.sizing, "
            "dlrm_cache.bench.run, dlrm_cache.report.report; print('dlrm_cache.plots.draw' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        env=child_env(),
    )
    assert res.stdout.strip() == "False", res.stderr


def test_unfinished_job_of_a_sweep_is_listed_and_left_out(sweep, tmp_path, capsys):
    copy = tmp_path / "multirun"
    shutil.copytree(sweep[0], copy, ignore=shutil.ignore_patterns("checkpoints", "report.*"))
    (copy / "1" / "summary.json").unlink()
    s = compare(find_runs([copy])[0])
    assert s.x == [RATIOS[0], RATIOS[2]] and s.unfinished == [copy / "1"]
    code, _, err = report_cli(capsys, str(copy))
    assert code == 0, err
    assert (
        f"Not finished (no summary.json), left out: {copy / '1'}"
        in (copy / "report.md").read_text()
    )


def test_runs_on_one_dataset_read_from_two_paths_are_compared(
    host_run, processed_synth, tmp_path, capsys
):
    """One run read the dataset, another a copy of it elsewhere: report refused them as "runs of
    different datasets" (it compared the paths); the identity is the manifest's (a digest)."""
    copy = tmp_path / "copy"
    shutil.copytree(processed_synth, copy)
    other = tmp_path / "other"
    shutil.copytree(host_run, other)
    recs = records(other)
    recs[0]["config"]["data"]["path"] = str(copy)
    (other / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    code, out, err = report_cli(capsys, str(host_run), str(other), f"output={tmp_path / 'out'}")
    assert code == 0 and err == "", err
    assert (tmp_path / "out" / "report.md").is_file()
