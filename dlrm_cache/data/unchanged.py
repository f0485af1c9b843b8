"""A dataset read while someone may rebuild it: each shard read is checked to be of the dataset the
reader started with.

`preprocess overwrite=true` (or any copy over the directory) can replace a dataset while `train`
reads it; the reader would go on with the new shards, mixing two datasets in one run.  A
:class:`DatasetFiles` records, when a stream is made, the manifest it was given and the files it
will read (device, inode, size and modification time of ``manifest.json`` and of each shard: a
replaced file is another inode, a file rewritten in place another size or time), and
:meth:`DatasetFiles.check` compares them again after every shard is read: a difference stops the
reader with :class:`DatasetChanged`, naming the file.  The data a shard was read as comes from
one file: pyarrow reads it whole before the check, and a file replaced after it had been opened
is still read as it was.
"""

from __future__ import annotations

import os
from pathlib import Path

from .format import MANIFEST, Manifest

# device, inode, size, modification time (ns)
FileStamp = tuple[int, int, int, int]


class DatasetChanged(ValueError):
    """A dataset's files changed while it was read; the message names the file."""


def stamp(path: Path) -> FileStamp | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class DatasetFiles:
    """The files one split of the dataset at ``root`` is read from, as they are now.  The
    manifest on the disk must be ``manifest`` (the one the reader was built for: a stream made
    late, as the test split's after training, must not read a dataset rebuilt meanwhile)."""

    def __init__(self, root: Path, manifest: Manifest, split: str) -> None:
        self.root = root
        self.stamps = {MANIFEST: stamp(root / MANIFEST)}
        self.stamps.update({rel: stamp(root / rel) for rel in manifest.splits[split].shards})
        if self.stamps[MANIFEST] is not None:
            try:
                now = Manifest.load(root)
            except (ValueError, OSError):
                now = None
            same = now is not None and now.identity() == manifest.identity()
            if not (same and now is not None and now.splits == manifest.splits):
                raise DatasetChanged(self._changed(MANIFEST))

    def check(self, rel: str) -> None:
        """Raise :class:`DatasetChanged` unless the manifest and the shard ``rel`` (just read) are
        the files they were when this reader started."""
        for name in (rel, MANIFEST):
            if stamp(self.root / name) != self.stamps.get(name):
                raise DatasetChanged(self._changed(name))

    def _changed(self, name: str) -> str:
        return (
            f"{self.root / name}: changed while this command read the dataset {self.root} "
            "(rebuilt, e.g. by preprocess overwrite=true?): stopped rather than mix two datasets; "
            "run it again once the dataset is complete"
        )
