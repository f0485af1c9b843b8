"""The console: what a command says to the person running it, the same lines in the job's log file,
progress, and the known, harmless third-party messages dropped where they are emitted.

``say`` writes a line on stdout (above a progress bar when one is showing) and, through Hydra's
file handler (``train.log``), into the log file, so the file holds every line the console shows.

Each entry names one message (a regex anchored at its start), the logger or warning category that
carries it, and why it is harmless.  Everything else, including other messages of the same loggers
and categories, still shows.  ``quiet_known_noise()`` runs before any command imports torch or
fbgemm (cli.main), because the fbgemm message is logged while ``fbgemm_gpu`` is imported.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass

from tqdm import tqdm


@dataclass(frozen=True)
class LogNoise:
    logger: str  # the logger the record is emitted on ("root": fbgemm calls logging.warning)
    message: (
        str  # regex matched at the start of the message, leading whitespace/colour codes skipped
    )
    why: str


@dataclass(frozen=True)
class WarningNoise:
    category: type[Warning]
    message: (
        str  # regex matched at the start of the warning text (warnings.filterwarnings semantics)
    )
    why: str


LOG_NOISE = (
    LogNoise(
        "root",
        r"_fbgemm_torch_compat_table has no entry for ",
        "fbgemm_gpu/__init__.py: fbgemm-gpu 1.6.0's own version table stops at 1.5, so every library it "
        "loads (4-14 per process) warns that it cannot check the torch pairing; the pair is pinned "
        "(torch 2.11 + fbgemm-gpu 1.6.0) and a real mismatch fails at import with undefined symbols",
    ),
    LogNoise(
        "torch.fx._symbolic_trace",
        r"is_fx_tracing will return true for both fx\.symbolic_trace",
        "torch deprecation notice triggered inside torchrec (modules/regroup.py) at the first forward; "
        "nothing to change in dlrm-cache",
    ),
)

WARNING_NOISE = (
    WarningNoise(
        UserWarning,
        r"TBE B200 optimization: ",
        "fbgemm-gpu 1.6.0's backward kernels (gen_embedding_backward_*_cuda.cu) TORCH_WARN whether a "
        "B200-only tuning applies, at the first backward on any GPU; informational",
    ),
    WarningNoise(
        UserWarning,
        r"torch\.searchsorted\(\): boundary tensor is non-contiguous",
        "torch's notice, once per process, when the freq_cache plans a multi-hot batch: the tables' "
        "starts it searches are a strided view of the batch's offsets (one per table), which "
        "searchsorted copies itself; nothing for a user to change",
    ),
)

# fbgemm wraps its message in newlines, indentation and ANSI colour codes
_LEADING_NOISE = re.compile(r"^(?:\s|\x1b\[[0-9;]*m)*")


class KnownMessageFilter(logging.Filter):
    """Drops the records of one logger whose message starts with one of ``patterns``."""

    def __init__(self, patterns: list[str]) -> None:
        super().__init__()
        self.patterns = [re.compile(p) for p in patterns]

    def filter(self, record: logging.LogRecord) -> bool:
        text = _LEADING_NOISE.sub("", record.getMessage(), count=1)
        return not any(p.match(text) for p in self.patterns)


def quiet_known_noise() -> None:
    """Install the filters for LOG_NOISE and WARNING_NOISE (idempotent)."""
    by_logger: dict[str, list[str]] = {}
    for n in LOG_NOISE:
        by_logger.setdefault(n.logger, []).append(n.message)
    for name, patterns in by_logger.items():
        logger = logging.getLogger(None if name == "root" else name)
        for old in [f for f in logger.filters if isinstance(f, KnownMessageFilter)]:
            logger.removeFilter(old)
        logger.addFilter(KnownMessageFilter(patterns))
    for w in WARNING_NOISE:
        warnings.filterwarnings("ignore", message=w.message, category=w.category)


class ReaderMayLeave:
    """stdout or stderr of a command whose reader may stop reading (``dlrm-cache ... 2>&1 | head
    -1``, a closed terminal) or that cannot be written at all (a descriptor a wrapper left open
    read-only): the first write or flush that fails so sends the rest of that stream to /dev/null,
    and the command goes on.  What a command prints is a report of work that its files hold (a dataset, a run,
    predictions) and its progress; a reader that leaves early must not stop that work half-way,
    nor turn a complete output into exit status 1."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            self._unwritable(e)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            self._unwritable(e)

    def _unwritable(self, e: OSError) -> None:
        if e.errno not in (errno.EPIPE, errno.EBADF, errno.EIO):  # EIO: a terminal hung up
            raise e
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def standard_streams() -> None:
    """The CLI's first step (idempotent): stdin, stdout and stderr usable whatever the command was
    started with, stdout and stderr each a :class:`ReaderMayLeave`.

    A standard descriptor the command was started without (``2>&-``, a daemon's closed fds) is
    opened on /dev/null: else the progress bars' writes to Python's ``sys.stderr`` (None) fail
    the command, and the next file opened (a shard being written) would take descriptor 2, where
    any library's C-level message to stderr would land in it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_RDWR)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
    if sys.stdin is None:
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own stream)
    if sys.stdout is None:
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
    if not isinstance(sys.stdout, ReaderMayLeave):
        sys.stdout = ReaderMayLeave(sys.stdout)
    if not isinstance(sys.stderr, ReaderMayLeave):
        sys.stderr = ReaderMayLeave(sys.stderr)


def say(text: str, console: bool = True) -> None:
    """``text`` (one or more lines) on stdout, unless not ``console``, and in the job's log files
    (the file handlers Hydra's job logging installed on the root logger; none outside a job)."""
    if console:
        tqdm.write(text)
    record = logging.LogRecord("dlrm_cache", logging.INFO, __file__, 0, text, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


class Progress:
    """Progress through ``total`` items: a tqdm bar with ``bar``; else, for a pass long enough to
    wait for (``lines_from`` items or more), a line at each quarter (with the rate and the time
    left), said on the console and in the log file.  ``enabled=False``: nothing at all."""

    QUARTERS = (0.25, 0.5, 0.75)

    def __init__(
        self, total: int, what: str, bar: bool, enabled: bool = True, lines_from: int = 8
    ) -> None:
        self.total, self.what, self.done = total, what, 0
        self.bar = (
            tqdm(total=total, desc=what, unit="batch", dynamic_ncols=True, leave=False)
            if (enabled and bar)
            else None
        )
        marks = self.QUARTERS if enabled and not bar and total >= lines_from else ()
        self.marks = [max(1, round(q * total)) for q in marks]
        self.t0 = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        while self.marks and self.done >= self.marks[0]:
            self.marks.pop(0)
            elapsed = time.perf_counter() - self.t0
            left = elapsed * (self.total - self.done) / self.done
            say(
                f"{self.what}: {self.done:,}/{self.total:,} batches "
                f"({100 * self.done / self.total:.0f}%), {elapsed:.1f} s, about {left:.0f} s left"
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
