"""The bench and plan commands run end to end (tiny sizes: timings are not asserted)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from dlrm_cache.bench.breakdown import BETWEEN, PHASES, PhaseClock, split_step
from dlrm_cache.bench.run import bench
from dlrm_cache.config.schemas import (
    BenchConfig,
    DataConfig,
    FreqCacheEmbeddingConfig,
    PlanConfig,
    Precision,
)
from dlrm_cache.data.batch import OneIdPerSample
from dlrm_cache.data.format import SPARSE_NAMES
from dlrm_cache.data.stats import load_counts
from dlrm_cache.embedding.base import SparseOptim, TableSpec, initial_state
from dlrm_cache.embedding.direct import HostBackend
from dlrm_cache.embedding.freq_cache import plan_table
from dlrm_cache.model.dlrm import DLRM
from dlrm_cache.report.sizing import plan
from dlrm_cache.train.optim import dense_optimizer


def _cfg(**kw):
    kw = {"batch_size": 64, "iters": 3, "distinct_batches": 4, **kw}
    return OmegaConf.structured(
        BenchConfig(warmup=2, embedding_dim=8, device="cpu", figure=None, **kw)
    )


def test_bench_embedding_compares_backends_in_one_run(tmp_path: Path):
    out = tmp_path / "b.json"
    res = bench(
        _cfg(
            kind="embedding",
            num_tables=3,
            rows_per_table=5000,
            distinct_batches=40,  # new rows every step: the window cannot hold them all
            backends=["host", "hbm", "freq_cache"],
            cache_ratios=[0.05, 0.2],
            output=str(out),
        )
    )
    by = {r["variant"]: r for r in json.loads(out.read_text())}
    assert set(by) == {"host", "hbm", "freq_cache 5.0%", "freq_cache 20.0%"}
    if not torch.cuda.is_available():
        assert "needs a CUDA GPU" in by["hbm"]["error"]
    for name in ("host", "freq_cache 5.0%", "freq_cache 20.0%"):
        assert by[name]["ms_per_iter"] > 0 and by[name]["speed_vs_host"] > 0
    assert by["freq_cache 20.0%"]["hit_rate"] > by["freq_cache 5.0%"]["hit_rate"] > 0
    assert len(res) == 4


def test_bench_train_and_planning_kinds():
    res = bench(
        _cfg(
            kind="train",
            cardinality_scale=0.0002,
            backends=["host", "freq_cache"],
            bottom_mlp=[16],
            top_mlp=[16],
        )
    )
    assert all(r["ms_per_iter"] > 0 for r in res)
    res = bench(_cfg(kind="planning", cardinality_scale=0.0002, cache_ratios=[0.05]))
    r = res[0]
    assert r["plan_ms"] > 0 and r["staging_ms"] > 0 and r["floor_ms"] > 0 and 0 < r["hit_rate"] <= 1
    assert r["staging_vs_floor"] == pytest.approx(r["staging_ms"] / r["floor_ms"])


def test_bench_mlperf_hotness_counts_every_id_of_the_lists():
    """hotness=mlperf: each table carries MLPerf's ids per sample; the freq_cache counts every
    one of them (accesses per table = batch x size x batches), host and freq_cache both train."""
    from dlrm_cache.data.format import MLPERF_MULTI_HOT_SIZES

    kw = dict(cardinality_scale=0.0002, hotness="mlperf", batch_size=16)
    res = bench(_cfg(kind="embedding", **kw, num_tables=26, rows_per_table=300))
    assert all(r["ms_per_iter"] > 0 for r in res)
    cache = next(r for r in res if r["variant"].startswith("freq_cache"))
    sizes = [cache["stats"][f"accesses/{n}"] for n in SPARSE_NAMES]
    assert sizes == [16 * 3 * h for h in MLPERF_MULTI_HOT_SIZES]  # 3 timed batches
    res = bench(_cfg(kind="planning", **kw, cache_ratios=[0.05]))
    accesses = res[0]["stats"]["accesses"]  # the batches forwarded while timed, every id of them
    assert accesses > 0 and accesses % (16 * sum(MLPERF_MULTI_HOT_SIZES)) == 0


def test_plan_predicts_from_the_stats(processed_synth: Path, tmp_path: Path):
    out = tmp_path / "plan.json"
    emb = FreqCacheEmbeddingConfig(batch_size=32)
    rows = plan(
        OmegaConf.structured(
            PlanConfig(
                data=DataConfig(path=str(processed_synth)),
                embedding=emb,
                ratios=[0.01, 0.05, 0.2],
                output=str(out),
                figure=None,
            )
        )
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(rows))
    hits = [r["hit_rate"] for r in rows]
    # more slots, more hits (a small ratio's window region may be sized past a larger one's)
    by_size = [r["hit_rate"] for r in sorted(rows, key=lambda r: r["cache_rows"])]
    assert by_size == sorted(by_size) and 0 < min(hits) and max(hits) <= 1
    expected = plan_table(
        load_counts(processed_synth), [0.01, 0.05, 0.2], emb.static_fraction, emb.lookahead, 32
    )
    np.testing.assert_allclose(hits, [r["hit_rate"] for r in expected])
    assert [r["cache_rows"] for r in rows] == [r["cache_rows"] for r in expected]
    # the pooled cache's rate is at most the share of the lookups of its cache_rows hottest rows,
    # and the access-weighted mean of its per-table rates
    counts = load_counts(processed_synth)
    flat = np.sort(np.concatenate(list(counts.values())))[::-1]
    for r in rows:
        assert r["hit_rate"] <= flat[: r["cache_rows"]].sum() / flat.sum() + 1e-12
        weights = {n: c.sum() for n, c in counts.items()}
        mean = sum(r["per_table"][n] * w for n, w in weights.items()) / sum(weights.values())
        assert r["hit_rate"] == pytest.approx(mean)


def test_bench_skips_a_placement_this_machine_cannot_run_and_fails_on_crashes(capsys, monkeypatch):
    """hbm cannot run without a GPU: skipped with the reason, the other rows still run (exit 0).
    A row that crashes is not hidden: the CLI exits 1 with the reason.  Bad config values fail at
    composition now, so the crash is made by pointing freq_cache at a class that does not exist."""
    from dlrm_cache.cli import main
    from dlrm_cache.config.schemas import FreqCacheEmbeddingConfig

    common = [
        "kind=embedding",
        "num_tables=2",
        "rows_per_table=300",
        "batch_size=32",
        "embedding_dim=8",
        "warmup=1",
        "iters=2",
        "distinct_batches=2",
        "device=cpu",
    ]
    if not torch.cuda.is_available():
        main(["bench", *common, "backends=[hbm,host]"])
        out = capsys.readouterr().out
        assert "hbm                      skipped: embedding=hbm needs a CUDA GPU" in out
        assert "speed relative to host" in out
        with pytest.raises(SystemExit) as e:  # nothing could run at all
            main(["bench", *common, "backends=[hbm]"])
        assert e.value.code == 1
        assert "no placement could run on this machine" in capsys.readouterr().err
    monkeypatch.setattr(
        FreqCacheEmbeddingConfig, "_target_", "dlrm_cache.embedding.freq_cache.NoSuchBackend"
    )
    with pytest.raises(SystemExit) as e:
        main(["bench", *common, "backends=[host,freq_cache]"])
    assert e.value.code == 1
    captured = capsys.readouterr()
    assert (
        "host  " in captured.out
        and "freq_cache 1.5%          FAILED: ImportError: Error loading" in captured.out
    )
    assert "dlrm-cache bench: failed: freq_cache 1.5%: ImportError: Error loading" in captured.err
    assert "Traceback" in captured.err


def test_bench_loader_reads_every_training_batch(small_dataset: Path, tmp_path: Path):
    out = tmp_path / "l.json"
    res = bench(
        _cfg(kind="loader", data_path=str(small_dataset), batch_size=256, epochs=2, output=str(out))
    )
    assert [r["epoch"] for r in res] == [0, 1]
    assert all(r["samples"] == (6000 // 256) * 256 for r in res)  # whole batches of the train split
    # the first batch's wait is reported apart: the rest of the epoch's samples in the rest of its time
    for r in res:
        assert 0 < r["first_batch_s"] < r["seconds"]
        rest = (r["samples"] - 256) / (r["seconds"] - r["first_batch_s"])
        assert r["after_first_samples_per_s"] == pytest.approx(rest, rel=1e-9)
    assert json.loads(out.read_text())[1]["samples"] == res[1]["samples"]


def test_bench_loader_needs_a_dataset():
    with pytest.raises(ValueError, match="data_path: kind=loader needs a processed dataset"):
        bench(_cfg(kind="loader"))


def _table(printed: str, header_start: str) -> dict[str, dict[str, str]]:
    """A markdown table of the printed output, as {first cell: {column: cell}}."""
    lines = printed.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    columns = [c.strip() for c in lines[at].strip("|").split("|")]
    rows = {}
    for line in lines[at + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(columns, cells))
    return rows


def test_bench_preprocess_through_the_cli(tmp_path: Path, capsys):
    """`dlrm-cache bench kind=preprocess`: the real preprocess command, in a process of its own, on
    tiny raw input; printed: its lines/s and its CPU seconds per stage (where the time goes)."""
    from dlrm_cache.cli import main
    from dlrm_cache.data.config import SynthConfig
    from dlrm_cache.data.synth import synth

    raw = tmp_path / "raw"
    synth(
        SynthConfig(
            output=str(raw), lines=3000, cardinality_scale=0.0005, min_cardinality=8, progress=False
        )
    )
    out = tmp_path / "pp.json"
    main(
        [
            "bench",
            "kind=preprocess",
            f"preprocess_input={raw}",
            "workers=[1]",
            "repeats=1",
            "peer_lines=0",
            f"work_dir={tmp_path / 'work'}",
            f"output={out}",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ]
    )
    printed = capsys.readouterr().out
    run = _table(printed, "| run | lines | wall s | lines/s |")["workers=1"]
    assert run["lines"] == "3,000" and float(run["lines/s"].replace(",", "")) > 0
    stages = _table(printed, "| run | parse |")["workers=1"]
    for stage in ("parse", "count", "encode", "write"):
        assert float(stages[stage]) >= 0, stages
    assert "workers=1: " in printed and "lines/s (best)" in printed
    (record,) = json.loads(out.read_text())
    assert record["run"] == "workers=1" and record["lines"] == 3000
    assert {"parse", "count", "encode", "write"} <= set(record["cpu_s_per_stage"])
    assert (tmp_path / "work" / "w1" / "manifest.json").is_file()  # a real, complete dataset
    # the peak RSS is the run's own, not this process's (torch and all) it was started from
    assert record["max_rss_mb"] < _peak_rss_mb()


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_bench_preprocess_standalone_entry_is_the_same_bench(capsys):
    from dlrm_cache.bench.preprocess import main

    with pytest.raises(SystemExit, match="preprocess_input=/nonexistent/raw: no such file"):
        main(["--input", "/nonexistent/raw"])
    with pytest.raises(SystemExit, match=r"repeats=0: must be >= 1"):
        main(["--input", "/nonexistent/raw", "--repeats", "0"])


def test_bench_train_runs_every_precision_and_compile_setting_with_a_breakdown():
    res = bench(
        _cfg(
            kind="train",
            cardinality_scale=0.0002,
            backends=["host"],
            bottom_mlp=[16],
            top_mlp=[16],
            precisions=["fp32", "bf16"],
            compile=[False],
        )
    )
    assert [r["variant"] for r in res] == ["host", "host bf16"]
    assert [(r["precision"], r["compile"]) for r in res] == [("fp32", False), ("bf16", False)]
    for r in res:
        assert list(r["breakdown_ms"]) == list(PHASES) + [BETWEEN]
        assert all(r["breakdown_ms"][p] > 0 for p in PHASES)
    assert res[1]["speed_vs_host"] == pytest.approx(res[0]["ms_per_iter"] / res[1]["ms_per_iter"])


@pytest.mark.parametrize("precision", [Precision.fp32, Precision.bf16])
def test_split_step_makes_the_training_steps_update(precision):
    """The breakdown times a step cut in phases: it must compute what the trainer's step computes."""
    tables = [TableSpec(f"C{i + 1}", 40, 8) for i in range(3)]
    g = torch.Generator().manual_seed(0)
    layout = OneIdPerSample([t.name for t in tables])
    batches = [
        layout.batch(
            torch.rand(16, 13, generator=g),
            torch.randint(0, 40, (3, 16), generator=g, dtype=torch.int32),
            (torch.rand(16, generator=g) < 0.3).float(),
        )
        for _ in range(3)
    ]
    finals = []
    for split in (False, True):
        emb = HostBackend(tables, SparseOptim("rowwise_adagrad", 0.1))
        emb.import_tables(initial_state(tables, emb.optim, 0))
        torch.manual_seed(0)
        model = DLRM(emb, 13, 8, [16], [16], precision=precision)
        opt = dense_optimizer("adagrad", model.dense_parameters(), torch.device("cpu"), 0.05)
        clock = PhaseClock(torch.device("cpu"))
        for b in batches:
            if split:
                split_step(model, opt, b, clock)
            else:
                loss = F.binary_cross_entropy_with_logits(model(b.dense, b.sparse), b.labels)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        finals.append({**model.dense_state_dict(), **emb.export_tables()})
    assert finals[0].keys() == finals[1].keys()
    for name in finals[0]:
        assert torch.equal(finals[0][name], finals[1][name]), name
    assert len(clock.result()) == len(PHASES) + 1


def test_bench_rows_show_no_nan_for_what_a_placement_has_not(capsys):
    """host has no cache and a CPU run no GPU: their rows said ``hit nan (distinct ids nan)``
    and ``peak GPU nan MiB``; a cache's row shows its hit rate."""
    bench(_cfg(kind="embedding", num_tables=2, rows_per_table=500, backends=["host", "freq_cache"]))
    rows = [line for line in capsys.readouterr().out.splitlines() if "ms/iter" in line]
    host, cache = (next(r for r in rows if r.split()[0] == v) for v in ("host", "freq_cache"))
    assert "nan" not in host and " hit " not in host, host
    assert " hit 0." in cache or " hit 1." in cache, cache
    if not torch.cuda.is_available():
        assert "nan" not in cache and "peak GPU" not in cache, cache


def test_plan_per_table_rows_are_in_table_order(processed_synth: Path, capsys):
    """The per-table table lists C1, C2, ..., C10, ... (it was C1, C10, C11, ..., C2)."""
    plan(
        OmegaConf.structured(
            PlanConfig(
                data=DataConfig(path=str(processed_synth)),
                embedding=FreqCacheEmbeddingConfig(batch_size=32),
                ratios=[0.05],
                per_table=True,
                figure=None,
            )
        )
    )
    names = re.findall(r"^\| (C\d+) +\|", capsys.readouterr().out, re.M)
    assert names == SPARSE_NAMES, names


def test_per_table_totals_are_in_table_order():
    """A run's totals (summary.json, metrics.jsonl) list hit_rate/C2 before hit_rate/C10."""
    from dlrm_cache.train.metrics import StatsTotals

    totals = StatsTotals()
    totals.add({f"accesses/{n}": 1.0 for n in SPARSE_NAMES})
    assert list(totals.result()) == [f"accesses/{n}" for n in SPARSE_NAMES]
