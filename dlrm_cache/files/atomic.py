"""Outputs that readers never see half-written, and paths checked before they are read.

Every file dlrm-cache writes goes through :func:`atomic_file` (a temporary name beside it, renamed
into place) and every directory it replaces through :func:`replace_dir`; JSON through
:func:`to_json` (no bare ``NaN``).  An error about a file is one line (:func:`one_line`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


class WriteError(OSError):
    """An output that could not be written (disk full, quota, file size limit): the message names
    it and says what was kept."""


def one_line(e: BaseException) -> str:
    """An exception's message on one line (for errors that name a file)."""
    return " ".join(str(e).split()) or type(e).__name__


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success it is renamed into place (readers never
    see a half-written file), on failure removed.  Permissions follow the umask like open()'s."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text)


def to_json(
    obj: Any, indent: int | None = None, default: Callable[[Any], Any] | None = None
) -> str:
    """JSON any parser reads (Python's ``json`` writes a bare ``NaN`` otherwise): a non-finite
    float (the AUC of no samples, a rate over no time, a diverged loss) is written as ``null``."""

    def plain(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x

    fallback = None if default is None else (lambda x: plain(default(x)))
    return json.dumps(plain(obj), indent=indent, default=fallback, allow_nan=False)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def replace_dir(new: str | os.PathLike, final: str | os.PathLike) -> None:
    """Move the complete directory ``new`` to ``final``, replacing what was there.

    A kill at any point leaves a complete directory at ``final``, or (between the two renames) the
    old one at :func:`aside_path` that :func:`recover_dir` puts back: the old directory is moved
    aside, the new one renamed in, and only then the old one deleted.
    """
    new, final = Path(new), Path(final)
    fsync_path(new)  # its entries are on the disk before it is renamed in
    recover_dir(final)
    aside = aside_path(final)
    if final.exists():
        final.rename(aside)
    new.rename(final)
    fsync_path(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def aside_path(final: str | os.PathLike) -> Path:
    """Where :func:`replace_dir` keeps the old directory while the new one is renamed in."""
    final = Path(final)
    return final.parent / f".{final.name}.old"


def recover_dir(final: str | os.PathLike) -> None:
    """Finish what a killed :func:`replace_dir` left: the old directory back if the new one never
    arrived, else the rest of the old one removed."""
    final, aside = Path(final), aside_path(final)
    if not aside.exists():
        return
    if final.exists():
        shutil.rmtree(aside)
    else:
        aside.rename(final)


def resolve_path(path: str | os.PathLike, key: str) -> Path:
    """``path`` made absolute with every link followed; a link loop (Python 3.11 raises
    RuntimeError for one) is a ValueError naming the config ``key``."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as e:
        raise ValueError(f"{key}={path}: cannot be resolved ({one_line(e)})") from None


def check_regular(path: str | os.PathLike) -> None:
    """Raise ValueError naming ``path`` when it is a FIFO, a device or a socket (through links):
    reading one may wait forever for a writer or never end (``/dev/zero``), where a stop signal
    that only sets a flag cannot end it.  A missing file or a directory is left to the read that
    follows (its error names the file)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise ValueError(f"{path}: {kind}, not a regular file; point it at the file itself")


def sha256_file(path: str | os.PathLike) -> str:
    check_regular(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
    return h.hexdigest()


def file_id(path: str | os.PathLike) -> tuple[int, int] | None:
    """The device and inode of ``path`` (links followed): what makes two paths one file, a bind
    mount's and a hard link's included; None when there is nothing there."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


# what a write that ran out of room fails with (disk full, quota, file size limit)
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def out_of_room(e: BaseException, where: str | os.PathLike) -> str | None:
    """Why a write into ``where`` (a directory) failed, naming its file system and the bytes left
    there, when it ran out of room; None for any other error.  numpy's short write says only
    "N requested and M written" (no errno): a short write is a full disk or a quota too."""
    text = one_line(e)
    if not isinstance(e, OSError):
        return None
    if e.errno not in NO_ROOM and " requested and " not in text and "No space left" not in text:
        return None
    mount = Path(os.path.realpath(where))
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        free = f"{shutil.disk_usage(mount).free:,} bytes free"
    except OSError:
        free = "free space unknown"
    return f"{text}: out of room on the file system at {mount}, {free}"


def torch_save(obj: Any, path: str | os.PathLike) -> tuple[int, str]:
    """``torch.save`` to ``path``, on the disk when it returns: its size and sha256.  A failed
    write is the OSError it was (ENOSPC, EDQUOT, ...): torch's writer reports it as a RuntimeError
    without its reason."""
    import torch

    with open(path, "wb") as f:
        out = _Writes(f)
        try:
            # torch.save only calls write/flush on a file object, but its annotation says IO[bytes]
            torch.save(obj, out)  # type: ignore[arg-type]
        except RuntimeError:
            if out.error is not None:
                raise out.error from None
            raise
        f.flush()
        os.fsync(f.fileno())
        return f.tell(), out.digest.hexdigest()


class _Writes:
    """A file's ``write`` for torch.save that hashes what it writes and keeps the OSError of a
    failed write."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.error: OSError | None = None
        self.digest = hashlib.sha256()

    def write(self, data: Any) -> int:
        try:
            n = self.f.write(data)
        except OSError as e:
            self.error = e
            raise
        self.digest.update(memoryview(data).cast("B")[:n])
        return n

    def flush(self) -> None:
        self.f.flush()


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a written file, or a directory's entries, to the disk (a rename must not be able to
    outlive what it renames)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
