"""Where a command may write its output, and that a stopped command leaves none of it behind.

The rule, for every output a user names (`preprocess`'s, `predict`'s, `export`'s and `report`'s
``output``, `plan`'s and `bench`'s ``output`` and ``figure``, `train`'s run directory): the output, with every link followed,

* is none of the paths the command reads, and contains none of them (the output is replaced when
  complete: writing it would destroy its own input, and ``overwrite=true`` removes a run
  directory's files first).  Paths are the same when their real paths are, or when they are one
  file by device and inode (a bind mount shows one directory at two paths; a hard link is two
  names of one file): the real path alone misses both;
* lies inside none of the tool's directories (:mod:`.layout`): a checkpoint, a run directory or a
  processed dataset belongs to the command that made it, whose readers trust every file in it
  (a prediction file in a checkpoint directory is one `rm` of a tidy-up away from a lost model,
  and replacing ``tables-rank0.pt`` loses it at once).  The output may *be* such a directory only
  when the command makes that kind (`preprocess` replaces a dataset it built, `train` writes a
  run, `report` writes into one), and lie inside one only where the command says so (a run's
  ``abandoned/after_step_K`` is a run inside a run).

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

from .atomic import file_id
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


def same(a: Path, b: Path) -> bool:
    """``a`` and ``b`` (real paths) are one file or directory: the same path, or the same device
    and inode (a bind mount, a hard link).  A path that does not exist is only itself."""
    if a == b:
        return True
    ida = file_id(a)
    return ida is not None and ida == file_id(b)


def check_output(
    output: str | os.PathLike,
    key: str,
    reads: Iterable[tuple[str, str | os.PathLike]] = (),
    makes: str | None = None,
    inside: tuple[str, ...] = (),
) -> Path:
    """``output`` resolved, or :class:`UnsafeOutput` when the rule above refuses it.

    ``key``: the option that named it (``output``, ``hydra.run.dir``); ``reads``: (what it is,
    path) of everything the command reads (``("input", ...)``, ``("checkpoint", ...)``);
    ``makes``: the kind of directory the command writes, which the output may be (``"dataset"``
    for `preprocess`); ``inside``: the kinds it may lie inside.
    """
    out = real(output)
    for what, path in reads:
        p = real(path)
        if same(p, out):
            raise UnsafeOutput(
                f"{key}={output}: is the {what} {p} this command reads; choose another output"
            )
        if any(same(out, d) for d in p.parents):
            raise UnsafeOutput(
                f"{key}={output}: would contain the {what} {p}; choose another output"
            )
    for d in (out, *out.parents):
        kind = kind_of(d)
        if kind is None or (d == out and kind == makes) or (d != out and kind in inside):
            continue
        where = (
            f"is the {kind} directory {d}" if d == out else f"lies inside the {kind} directory {d}"
        )
        raise UnsafeOutput(
            f"{key}={output}: {where}; nothing is written into a {kind} but by the command that "
            "makes it: choose an output outside it"
        )
    return out


def check_writable(output: str | os.PathLike, key: str) -> None:
    """:class:`UnsafeOutput` when ``output`` cannot be made where it is named: its nearest existing
    directory (itself, or an ancestor the command would create it under) takes no new files (a
    read-only file system, no permission); said before the work, naming the key, not as the
    ``[Errno 30]`` of the first write after it."""
    d = real(output)
    while not d.exists() and d != d.parent:
        d = d.parent
    if not d.is_dir():  # an existing file: replaced by a rename in its directory
        d = d.parent
    if not os.access(d, os.W_OK | os.X_OK):
        why = "a read-only file system" if _read_only(d) else "no permission to write"
        raise UnsafeOutput(f"{key}={output}: cannot create files in {d} ({why})")


def _read_only(d: Path) -> bool:
    try:
        return bool(os.statvfs(d).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_files(cfg: Any, keys: Iterable[str], reads: Iterable[tuple[str, Any]] = ()) -> None:
    """:func:`check_output` for each file output ``keys`` of ``cfg`` that is set (`plan`'s and
    `bench`'s ``output`` and ``figure``), before the command does its work: none is a directory
    nor lies in one of the tool's, and none is (or contains) what the command reads (``reads``:
    (what, path or None))."""
    given = [(what, p) for what, p in reads if p]
    for key in keys:
        value = cfg.get(key)
        if not value:
            continue
        check_output(str(value), key, given)
        if real(str(value)).is_dir():
            raise UnsafeOutput(f"{key}={value}: is a directory; name a file")
        check_writable(str(value), key)


class Stopped(BaseException):
    """The command was stopped by a signal (``signum``); like KeyboardInterrupt, not an error of
    the input, and raised wherever the main thread is, so cleanup code runs.  ``wrote``: the
    output the command had already renamed into place (complete) when the signal came, if any."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.wrote: Path | None = None


@contextlib.contextmanager
def reported_if_written(output: Path, made: list[tuple[int, int]]) -> Iterator[None]:
    """A :class:`Stopped` leaving the block says whether ``output`` is the one this command made
    (``made``: the device and inode of its temporary file or directory, once created), renamed
    into place: a signal may come at any moment, the rename's included, so this is asked of the
    file system rather than of the code's progress."""
    try:
        yield
    except Stopped as e:
        if made and file_id(output) == made[0]:
            e.wrote = output
        raise


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
