"""Training's clocks: samples per second over the steps alone, and a job's start-up time."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path


class Throughput:
    """Training samples per second between log lines: only time spent in steps counts.

    The clock is read after the device has finished the steps (the loss readback waits for them);
    evaluation and checkpoints in between are excluded with :meth:`pause`.
    """

    def __init__(self) -> None:
        self.seconds = 0.0  # training time so far
        self.samples = 0  # training samples so far (all ranks)
        self._t0 = time.perf_counter()
        self._samples0 = 0

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """The time spent inside the ``with`` block is not training time."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self._t0 += time.perf_counter() - t

    def lap(self) -> float:
        """Samples/s since the last lap (call after a device sync); adds the interval to
        ``seconds``."""
        now = time.perf_counter()
        elapsed = now - self._t0
        self.seconds += elapsed
        rate = (self.samples - self._samples0) / max(elapsed, 1e-9)
        self._t0, self._samples0 = now, self.samples
        return rate


def seconds_since_process_start() -> float:
    """Wall time since this process started (the command, interpreter start-up included; 10 ms
    resolution, from the kernel's process start time in /proc); NaN where there is no /proc."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # no /proc (not Linux)
        return math.nan
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


_job_origin: float | None = None  # time.time() at which the current job started


def begin_job() -> None:
    """A train job starts: its start-up is counted from here, except for the process's first job,
    whose start-up is the command's (interpreter and imports included).  A ``-m`` sweep runs its
    jobs in one process: the later ones did not wait for the earlier ones' training."""
    global _job_origin
    first = _job_origin is None
    since = seconds_since_process_start() if first else math.nan
    _job_origin = time.time() - (since if math.isfinite(since) else 0.0)


def seconds_since_job_start() -> float:
    """Wall time since :func:`begin_job` (since the process started where no job has begun)."""
    if _job_origin is None:
        return seconds_since_process_start()
    return time.time() - _job_origin
