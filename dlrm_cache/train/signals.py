"""Preemption: SIGTERM (what schedulers send before they kill), SIGINT (Ctrl-C) and SIGHUP (the
terminal was closed) stop `train` after the current step with a checkpoint of it, instead of
losing everything since the last one.

While :func:`stop_signals` is active the signals only set a flag.  The step loop asks
:class:`StopAgreement` after every step (and evaluation after every batch, and the loop once
before its first step, :meth:`StopAgreement.settle`); it answers with the signal to stop on, the same on every
rank under torchrun (each rank may be signalled at a slightly different moment, and a rank that
stopped alone would leave the others waiting in a collective): the ranks exchange their flags
with an asynchronous all-reduce on a gloo group of their own, answered one step later, so no
step waits for it.  The loop then saves a checkpoint of that step with the usual crash-safe
protocol (every rank) and :func:`exit_preempted` prints where it is and how to resume, and exits
with 128 + the signal number (143 for SIGTERM, 130 for SIGINT, 129 for SIGHUP), as a process
killed by it would.

A second signal ends the process at once, by the signal's default action: the checkpoint being
written is crash-safe, the previous one stays complete.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import NoReturn

import torch
import torch.distributed as dist

from ..concurrency.streams import streams_for
from ..console.say import say
from ..console.typed import typed_override
from ..files.outputs import signal_handlers
from ..parallel.dist import DistInfo
from .checkpoint import step_dir

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_received: list[int] = []  # the stop signals received while stop_signals() is active


@contextmanager
def stop_signals() -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP set a flag inside the block (only the main thread may install handlers:
    elsewhere the block changes nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    try:
        with signal_handlers(STOP_SIGNALS, _on_signal):
            yield
    finally:
        _received.clear()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _received:  # the second one: the default action (the process ends by this signal)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _received.append(signum)
    if int(os.environ.get("RANK", "0")) == 0:
        _tell(
            f"dlrm-cache train: {signal.Signals(signum).name} received: stopping after the current "
            "step or evaluation batch, with a checkpoint of the step (a second signal stops at once)"
        )


def _tell(line: str) -> None:
    """``line`` on stderr and in the job's log file (``train.log`` holds what the console shows)."""
    print(line, file=sys.stderr, flush=True)
    say(line, console=False)


class StopAgreement:
    """``requested()`` after every step: the signal every rank stops on now, or None."""

    def __init__(self, info: DistInfo) -> None:
        self.signum: int | None = None
        self._group = dist.new_group(backend="gloo") if info.distributed else None
        # a host tensor over a gloo group: never a device synchronization, whatever the device
        self._host = streams_for(torch.device("cpu")).on_host
        self._pending: tuple[dist.Work, torch.Tensor] | None = None

    def requested(self) -> int | None:
        if self.signum is not None:
            return self.signum
        mine = _received[0] if _received else 0
        if self._group is None:
            self.signum = mine or None
            return self.signum
        agreed = self._collect()  # the flags all ranks sent one step ago
        with self._host():
            flag = torch.tensor([mine], dtype=torch.int64)
            self._pending = (
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True),
                flag,
            )
        self.signum = agreed or None
        return self.signum

    def settle(self) -> int | None:
        """``requested()``, answered now (one blocking exchange): before the first step, so a
        signal received while the run was being built stops it before any step is done."""
        if self.signum is None:
            mine = _received[0] if _received else 0
            agreed = self._collect()
            if self._group is not None:
                with self._host():
                    flag = torch.tensor([mine], dtype=torch.int64)
                    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
                    mine = int(flag.item())
            self.signum = (agreed or mine) or None
        return self.signum

    def _collect(self) -> int:
        if self._pending is None:
            return 0
        work, flag = self._pending
        self._pending = None
        work.wait()
        with self._host():
            return int(flag.item())

    def close(self) -> None:
        """Wait for the exchange in flight (every rank has one: they all asked as often)."""
        self._collect()
        if self._group is not None:
            dist.destroy_process_group(self._group)
            self._group = None


def exit_preempted(
    signum: int,
    step: int,
    start: int,
    saved_at_step: bool,
    checkpoint: Callable[[int], None],
    run_dir: Path,
    is_main: bool,
) -> NoReturn:
    """After the loop stopped on ``signum`` at ``step`` (the run began at ``start``): save a
    checkpoint of ``step`` unless one was just saved (``saved_at_step``) or no step was done,
    say where and how to resume (rank 0), and exit as the signal would have."""
    name = signal.Signals(signum).name
    if step == start:
        where = f"no step done since step {start}: nothing new to save" + (
            f"; resume with {typed_override('resume', run_dir)}" if start else ""
        )
    else:
        if not saved_at_step:
            checkpoint(step)
        where = (
            f"checkpoint of step {step} in {step_dir(run_dir, step)}; continue with the same "
            f"command and {typed_override('resume', run_dir)}"
        )
    if is_main:
        _tell(f"dlrm-cache train: stopped by {name}: {where}")
    raise SystemExit(128 + signum)
