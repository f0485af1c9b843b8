"""The training loop: from a composed config to a trained, evaluated model whose records and
summary are in its run directory (see rundir/records.py).  Building the run is train/build.py's; one step
is train/step.py's."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from ..config.schemas import backend_name, config_dict
from ..console.readable import summary_order
from ..console.say import say
from ..data.format import Manifest
from ..files.outputs import Stopped
from ..parallel.dist import DistInfo, init_distributed, resolve_device, shutdown
from ..rundir.records import (
    BEST,
    EVAL,
    FIRST_STEP,
    START,
    SUMMARY_RECORD,
    TRAIN,
    logged_records,
    write_summary,
)
from .best import prune, run_records
from .build import TrainingRun, build_run, restore
from .checkpoint import step_dir
from .claim import release as release_run_dirs
from .guard import LossGuard
from .metrics import StatsTotals, format_table, interval_line
from .pipeline import Pipeline
from .schedule import set_learning_rates
from .signals import StopAgreement, exit_preempted, stop_signals
from .step import train_step
from .timing import Throughput, begin_job, seconds_since_job_start

log = logging.getLogger(__name__)


def find_oracle(manifest: Manifest) -> float | None:
    """The planted model's AUC, when the data came from `dlrm-cache synth`."""
    for src in manifest.sources[:1]:
        p = Path(src).parent / "oracle.json"
        if p.is_file():
            try:  # null: the labels were of one class (no AUC)
                return float(json.loads(p.read_text())["oracle_auc"])
            except (KeyError, ValueError, TypeError):
                return None
    return None


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train and evaluate as ``cfg`` says; returns the final summary (also written to the run dir)."""
    begin_job()
    # torchrun: one GPU per local rank
    device = resolve_device(cfg.device, int(os.environ.get("LOCAL_RANK", "0")))
    info: DistInfo = init_distributed(device, cfg.dist_timeout_s)
    try:
        with stop_signals():
            return _train(cfg, device, info)
    finally:
        release_run_dirs()
        shutdown()


def train_steps(run: TrainingRun, step: int) -> tuple[int, Throughput, StatsTotals, float]:
    """The step loop, from ``step`` to ``run.total_steps``: returns the last step, the throughput
    clock, the embedding counters and the seconds from the command to the first step."""
    cfg, info, model, embeddings = run.cfg, run.info, run.model, run.embeddings
    steps_per_epoch = len(run.train_stream)
    bar = tqdm(
        total=run.total_steps,
        initial=step,
        disable=not (cfg.progress and info.is_main),
        unit="step",
        dynamic_ncols=True,
    )
    clock, totals, startup_s = Throughput(), StatsTotals(), math.nan
    interval = StatsTotals()  # the cache's counters since the last train record
    # summed on the device: a .item() per step would make the host wait for every step
    loss_sum, loss_n = torch.zeros((), device=run.device), 0
    guard, first = LossGuard(cfg.loss_spike_factor, cfg.data.path, cfg.data.batch_size), step
    stop = run.stop = StopAgreement(info)
    model.train()
    stop.settle()  # a signal while the run was built: no step, nothing new to save
    if not stop.signum and evaluation_owed(run, step):
        with clock.pause():
            try:
                _periodic_evaluation(run, step)
            except Stopped:  # stop.signum is set: no step done, nothing new to save
                pass
    while step < run.total_steps and not stop.signum and not run.best.exhausted:
        epoch, start = divmod(step, steps_per_epoch)
        with Pipeline(
            run.train_stream.batches(epoch, start),
            run.device,
            embeddings,
            cfg.data.prefetch_batches,
        ) as pipeline:
            for batch in pipeline:
                if math.isnan(startup_s):
                    startup_s = seconds_since_job_start()
                    run.log.write(FIRST_STEP, step=step, startup_s=startup_s)
                set_learning_rates(model, run.opt, cfg, step)
                loss = train_step(run.net, run.opt, batch)
                step += 1
                clock.samples += batch.size * info.world_size
                loss_sum += loss.detach()
                loss_n += 1
                guard.record(
                    step, loss, batch.source
                )  # no sync: checked below, where the loop reads anyway
                if step % cfg.log_every == 0 or step == run.total_steps:
                    guard.check()
                    mean_loss = (
                        loss_sum.item() / loss_n
                    )  # waits for the steps so far: then read the clock
                    rate = clock.lap()
                    interval.add(embeddings.take_stats())
                    emb_stats, interval = interval.result(), StatsTotals()
                    totals.add(emb_stats)
                    run.log.write(
                        TRAIN,
                        step=step,
                        epoch=epoch,
                        loss=mean_loss,
                        samples_per_s=rate,
                        **emb_stats,
                    )
                    bar.set_postfix(loss=f"{mean_loss:.4f}", samples_s=f"{rate:,.0f}")
                    if info.is_main:  # the bar shows it: then the log file only
                        line = interval_line(step, run.total_steps, mean_loss, rate, emb_stats)
                        say(line, console=not cfg.progress)
                    loss_sum.zero_()
                    loss_n = 0
                bar.update(1)
                if cfg.eval_every and step % cfg.eval_every == 0 and step < run.total_steps:
                    with clock.pause():
                        guard.check()
                        # the cache's counters so far are training's; evaluation's lookups are not
                        interval.add(embeddings.take_stats())
                        try:
                            _periodic_evaluation(run, step)
                        except Stopped:  # stop.signum is set: a checkpoint of this step, below
                            break
                if (
                    cfg.checkpoint_every
                    and step % cfg.checkpoint_every == 0
                    and step < run.total_steps
                    and run.saved != step  # saved for a best evaluation
                ):
                    with clock.pause():
                        guard.check()
                        run.checkpoint(step)
                if step >= run.total_steps or stop.requested() or run.best.exhausted:
                    break
        if loss_n:  # the tail since the last log line still counts towards throughput
            loss_sum.item()  # the steps have finished on the device
            clock.lap()
            loss_sum.zero_()
            loss_n = 0
    bar.close()
    guard.check()
    if stop.signum:  # SIGTERM / SIGINT: a checkpoint of this step, then exit 128 + signum
        stop.close()
        exit_preempted(
            stop.signum, step, first, run.saved == step, run.checkpoint, run.run_dir, info.is_main
        )
    return step, clock, totals, startup_s


def _periodic_evaluation(run: TrainingRun, step: int) -> None:
    """The validation split's evaluation at ``step`` of ``eval_every``, recorded, weighed
    (:func:`note_evaluation`) and said; the embeddings' counters then start again (its lookups
    are not training's)."""
    result = run.evaluate(step)
    run.embeddings.reset_stats()
    note_evaluation(run, step, result)
    if run.info.is_main:
        say(f"step {step}: val auc {result['auc']:.4f} logloss {result['logloss']:.4f}")
        if run.best.exhausted:
            say(
                f"step {step}: early stopping: {run.best.why_stopped()} "
                f"(monitor.patience={run.cfg.monitor.patience})"
            )


def note_evaluation(run: TrainingRun, step: int, result: dict[str, float]) -> bool:
    """Weigh a val evaluation of ``step`` by ``monitor.*``; a better one than every earlier is
    recorded (a ``best`` record), has a checkpoint of its step (saved now unless it has one:
    collective) and may leave an earlier one outside ``monitor.save_top_k`` (removed).  True
    when it was the best."""
    tracker, cfg = run.best, run.cfg
    if not tracker.observe(step, result):
        return False
    path = step_dir(run.run_dir, step)
    run.log.write(BEST, step=step, path=str(path), **{tracker.monitor.metric: tracker.value})
    if not run.has_checkpoint(step):
        periodic = bool(cfg.checkpoint_every) and step % cfg.checkpoint_every == 0
        run.checkpoint(step, best_only=not periodic)
    if run.info.is_main:
        prune(tracker.monitor, cfg.monitor.save_top_k, run_records(run.run_dir), path.parent)
    return True


def evaluation_owed(run: TrainingRun, step: int) -> bool:
    """Whether a run resumed in its own run directory at ``step`` must first evaluate it: an
    ``eval_every`` step whose evaluation its log does not hold.  A stop signal during that
    evaluation cut it short, and the checkpoint of the step was saved without it; done now, the
    log holds every evaluation an uninterrupted run's does.  Rank 0 reads the log and decides
    for every rank (an evaluation is collective)."""
    cfg = run.cfg
    resumed_here = run.resume is not None and run.resume.log_records(run.run_dir) is not None
    if not (resumed_here and cfg.eval_every and step % cfg.eval_every == 0):
        return False
    if not 0 < step < run.total_steps:  # the last step's evaluation is the final one
        return False
    owed = [
        run.info.is_main
        and not any(
            r is not None and r.get("kind") == EVAL and r.get("step") == step
            for r in logged_records(run.run_dir)
        )
    ]
    if run.info.distributed:
        torch.distributed.broadcast_object_list(owed, src=0)
    return bool(owed[0])


def summarize(
    run: TrainingRun, step: int, clock: Throughput, totals: StatsTotals, startup_s: float
) -> dict[str, Any]:
    """Final checkpoint and evaluation; the summary (written to the run dir, printed as a table).
    A stop signal during the evaluations ends them, and the command as in training (the final
    checkpoint is saved: a resume of it evaluates it)."""
    if run.saved != step:  # (saved when an early stop came after a checkpoint of the step)
        run.checkpoint(step)
    try:
        # an evaluation of this step done already (before an early stop; or recorded after the
        # checkpoint a resume of a stopped run continues from) is not done again
        final = run.evaluations.get((step, "val"))
        if final is None:
            final = run.evaluate(step)
            note_evaluation(run, step, final)
        tested = (
            run.evaluations.get((step, "test")) or run.evaluate(step, "test")
            if run.cfg.test and "test" in run.manifest.splits
            else {}
        )
    except Stopped as e:
        assert run.stop is not None
        run.stop.close()
        exit_preempted(e.signum, step, -1, True, run.checkpoint, run.run_dir, run.info.is_main)
    if run.stop is not None:
        run.stop.close()
    summary: dict[str, Any] = {
        "steps": step,
        "train_samples": clock.samples,
        "train_seconds": round(clock.seconds, 3),
        "train_samples_per_s": clock.samples / clock.seconds if clock.seconds > 0 else math.nan,
        "startup_s": round(startup_s, 3),
        **{f"val_{k}": v for k, v in final.items()},
    }
    summary.update(best_summary(run))
    oracle = find_oracle(run.manifest)
    if oracle is not None:
        summary["oracle_auc"] = oracle
    summary.update({f"test_{k}": v for k, v in tested.items()})
    if run.info.distributed:  # every rank's cache serves its own tables: add them up
        everyone: list = [None] * run.info.world_size
        torch.distributed.all_gather_object(everyone, totals)
        totals = totals.combine(everyone)
    summary.update({f"embedding_{k}": v for k, v in totals.result().items()})
    run.log.write(SUMMARY_RECORD, **summary)
    if run.info.is_main:
        write_summary(run.run_dir, summary)
        # per-table hit rates stay in summary.json / metrics.jsonl: too many rows for a table
        shown = [(k, v) for k, v in summary_order(summary).items() if "/" not in k]
        say(format_table(shown, title=f"dlrm-cache train: {run.run_dir}"))
    return summary


def best_summary(run: TrainingRun) -> dict[str, Any]:
    """What the summary says of the best checkpoint (none evaluated: nothing) and, with
    ``monitor.patience``, whether training stopped early."""
    out: dict[str, Any] = {}
    if run.best.best is not None:
        step, value = run.best.best
        out["best_step"] = step
        out[f"best_{run.best.monitor.metric}"] = value
        out["best_checkpoint"] = str(step_dir(run.run_dir, step))
    if run.cfg.monitor.patience:
        out["stopped_early"] = run.best.exhausted
    return out


def _train(cfg: DictConfig, device: torch.device, info: DistInfo) -> dict[str, Any]:
    run = build_run(cfg, device, info)
    step = restore(run)
    if info.is_main:
        log.info(
            "run dir %s | %d tables, %s rows | %d steps of %d | embedding=%s",
            run.run_dir,
            len(run.manifest.table_sizes),
            f"{sum(run.manifest.table_sizes):,}",
            run.total_steps,
            cfg.data.batch_size,
            backend_name(cfg.embedding._target_),
        )
    run.log.write(
        START,
        step=step,
        total_steps=run.total_steps,
        world_size=info.world_size,
        config=config_dict(cfg),
    )
    step, clock, totals, startup_s = train_steps(run, step)
    return summarize(run, step, clock, totals, startup_s)
