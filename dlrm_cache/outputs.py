"""Where a command may write its output, and that a stopped command leaves none of it behind.

The rule, for every command that writes an output a user names (`preprocess`, `predict`,
`export`): the output, with every link followed,

* is none of the paths the command reads, and contains none of them (the output is replaced when
  complete: writing it would destroy its own input);
* lies inside none of the tool's directories (:mod:`.layout`): a checkpoint, a run directory or a
  processed dataset belongs to the command that made it, whose readers trust every file in it
  (a prediction file in a checkpoint directory is one `rm` of a tidy-up away from a lost model,
  and replacing ``tables-rank0.pt`` loses it at once).  The output may *be* such a directory only
  when the command makes that kind (`preprocess` replaces a dataset it built).

A hard link to an input is harmless: outputs are written under a temporary name and renamed into
place, which replaces the output's name, never the input's contents.

:func:`stop_on_signals` turns SIGTERM and SIGHUP (which would end the process at once) into an
exception, as Python already does for SIGINT, so the ``with``/``except`` blocks that remove
temporary files run however the command is stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from .layout import CKPT_DENSE, CKPT_META, MANIFEST, METRICS

# kind -> what a user calls it in messages
CHECKPOINT, RUN, DATASET = "checkpoint", "run", "dataset"


class UnsafeOutput(ValueError):
    """An output that would overwrite what the command reads or land in a directory the tool owns;
    the message names the key, the path and the directory."""


def real(path: str | os.PathLike) -> Path:
    """``path`` absolute, every link followed (a link loop stays as it is: nothing resolves it)."""
    return Path(os.path.realpath(os.path.expanduser(path)))


def kind_of(directory: Path) -> str | None:
    """:data:`CHECKPOINT`, :data:`RUN` or :data:`DATASET` when ``directory`` is one of the tool's, by
    the files that mark each (both of a checkpoint's, whose names alone are common ones)."""
    if (directory / CKPT_META).is_file() and (directory / CKPT_DENSE).is_file():
        return CHECKPOINT
    if (directory / METRICS).is_file():
        return RUN
    if (directory / MANIFEST).is_file():
        return DATASET
    return None


def check_output(
    output: str | os.PathLike,
    key: str,
    reads: Iterable[tuple[str, str | os.PathLike]] = (),
    makes: str | None = None,
) -> Path:
    """``output`` resolved, or :class:`UnsafeOutput` when the rule above refuses it.

    ``key``: the option that named it (``output``); ``reads``: (what it is, path) of everything the
    command reads (``("input", ...)``, ``("checkpoint", ...)``); ``makes``: the kind of directory the
    command writes, which the output may replace (``"dataset"`` for `preprocess`).
    """
    out = real(output)
    for what, path in reads:
        p = real(path)
        if p == out:
            raise UnsafeOutput(
                f"{key}={output}: is the {what} {p} this command reads; choose another output"
            )
        if out in p.parents:
            raise UnsafeOutput(
                f"{key}={output}: would contain the {what} {p}; choose another output"
            )
    for d in (out, *out.parents):
        kind = kind_of(d)
        if kind is None or (d == out and kind == makes):
            continue
        where = (
            f"is the {kind} directory {d}" if d == out else f"lies inside the {kind} directory {d}"
        )
        raise UnsafeOutput(
            f"{key}={output}: {where}; nothing is written into a {kind} but by the command that "
            "makes it: choose an output outside it"
        )
    return out


def check_apart(run_dir: str | os.PathLike, data_path: str | os.PathLike) -> None:
    """A run directory and a dataset stay apart, or :class:`UnsafeOutput`: a run in a dataset
    (or in ``data_path``) is deleted by `preprocess overwrite=true` of it, a dataset in a run
    directory by `train overwrite=true` there."""
    run, data = real(run_dir), real(data_path)
    inside = next((d for d in (run, *run.parents) if d == data or kind_of(d) == DATASET), None)
    if inside is not None:
        where = "is" if inside == run else "lies inside"
        raise UnsafeOutput(
            f"run dir {run}: {where} the dataset {inside}, which `preprocess overwrite=true` "
            "replaces whole: choose a hydra.run.dir outside it"
        )
    if run in data.parents:
        raise UnsafeOutput(
            f"data.path={data_path}: lies inside the run directory {run}, which `train "
            "overwrite=true` empties: move the dataset out of it, or choose another hydra.run.dir"
        )


class Stopped(BaseException):
    """The command was stopped by a signal (``signum``); like KeyboardInterrupt, not an error of
    the input, and raised wherever the main thread is, so cleanup code runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Inside the block, ``signals`` raise :class:`Stopped` in the main thread (SIGINT already
    raises KeyboardInterrupt); the previous handlers come back after it."""

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum)

    with signal_handlers(signals, stop):
        yield


@contextlib.contextmanager
def signal_handlers(signals: tuple[int, ...], handler: Callable[..., Any]) -> Iterator[None]:
    """``handler`` for ``signals`` inside the block, the previous handlers back after it (main
    thread only, as ``signal.signal``)."""
    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
