"""The output directory: reuse when up to date, refuse foreign directories, atomic replacement.

The dataset is built in a temporary sibling directory (shards under temporary names, the manifest
last) and then renamed into place, so ``output`` is either absent, the old complete dataset or the
new one; leftovers of a killed run are removed by the next run, and a build of the same output by a
process that still runs is refused (one run per output at a time).  An
existing complete dataset is reused when its recorded inputs (path, size and a hash of the first
and last MiB of each file) and settings match, else the run stops unless ``overwrite=true``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...config.schemas import config_dict
from ...files.atomic import WriteError, out_of_room, recover_dir
from .. import criteo
from ..format import MANIFEST, Manifest
from ..reuse import compare, remove_stale
from ..schema import SCHEMA_FILE, Schema
from .errors import PreprocessError
from .sources import fingerprint

if TYPE_CHECKING:
    from .workers import Runner

SETTINGS = "preprocess.json"  # inputs + settings of the build, compared on re-runs
_OWN_ENTRIES = {"train", "val", "test", "stats", MANIFEST, SETTINGS, SCHEMA_FILE}
# Settings that cannot change the output (acceptance of a line is a property of the line alone, so
# chunk_bytes is one of them; the output is the same for every worker count).  Every other setting
# is recorded and compared on re-runs, so a setting added later counts as changing the output
# unless it is listed here.
_NOT_OUTPUT_KEYS = frozenset(
    {
        "input",
        "output",
        "bad_line_reports",
        "chunk_bytes",
        "overwrite",
        "progress",
        "workers",
        # a raw-text build refuses them; the multi-hot materialization records its own settings
        "multi_hot_sizes",
        "multi_hot_distribution",
        "multi_hot_seed",
    }
)


def settings(cfg: Any, files: list[Path], schema: Schema) -> dict[str, Any]:
    """What the output is a function of: the inputs' fingerprints and the settings that
    change it (the resolved schema, unless it is the default Criteo one: such a record is the
    same as before schemas existed, so those datasets are reused)."""
    d = config_dict(cfg)
    d.pop("schema", None)
    if not schema.is_default:
        d["schema"] = schema.record()
    return {
        "inputs": [fingerprint(p) for p in files],
        "line_policy": criteo.LINE_POLICY_VERSION,
        **{k: v for k, v in sorted(d.items()) if k not in _NOT_OUTPUT_KEYS},
    }


def check_reuse(out: Path, wanted: dict[str, Any], overwrite: bool) -> Manifest | None:
    """The existing dataset if it can be reused; None if it must be (re)built."""
    if not (out / MANIFEST).exists() or overwrite:
        return None
    recorded = compare(out / SETTINGS, wanted)
    if recorded.matches:
        return Manifest.load(out)
    # a key only the record has differs too (a user schema's record against Criteo's none)
    changed = list(recorded.changed)
    raise PreprocessError(
        f"{out} already holds a dataset built from other inputs/settings "
        f"({', '.join(changed) or 'unknown'}); "
        "pass overwrite=true to rebuild it"
    )


def build_dir(out: Path, pid: int) -> Path:
    """Where a run builds the dataset before renaming it to ``out``."""
    return out.parent / f".{out.name}.tmp-{pid}"


def clean_stale(out: Path) -> None:
    """Remove build directories left by killed runs, and finish a replacement a kill interrupted
    (the old dataset back if the new one never arrived).  A build directory whose process (the
    pid its name holds) still runs is another run's build of ``out``: refused, since removing it
    would fail that run, and recovering its replacement could put the old dataset back."""
    stale = re.compile(rf"\.{re.escape(out.name)}\.tmp-(\d+)")
    builds = {
        p: int(m.group(1))
        for p in (out.parent.iterdir() if out.parent.is_dir() else ())
        if (m := stale.fullmatch(p.name)) and p.is_dir()
    }
    for p, pid in builds.items():
        if pid != os.getpid() and _running(pid):
            raise PreprocessError(
                f"output {out}: another preprocess (pid {pid}) is building it in {p}; wait for "
                f"it to end (if no process {pid} writes it, remove {p})"
            )
    recover_dir(out)
    remove_stale(out.parent, lambda p: p in builds)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def check_replaceable(out: Path) -> None:
    """Refuse to replace a directory that holds anything but a (partial) dataset of ours."""
    if not out.exists():
        return
    if not out.is_dir():
        raise PreprocessError(f"output {out} exists and is not a directory")
    foreign = [
        p.name for p in out.iterdir() if p.name not in _OWN_ENTRIES and not p.name.startswith(".")
    ]
    if foreign:
        raise PreprocessError(
            f"output {out} holds files that are not a processed dataset "
            f"({', '.join(sorted(foreign)[:3])}); "
            "choose another output"
        )


def prepare(
    out: Path, wanted: dict[str, Any], overwrite: bool, runner: Runner
) -> tuple[Manifest | None, Path | None]:
    """On every rank: ``(the up-to-date dataset at out, None)`` when it can be reused (said on
    rank 0), else ``(None, the empty build directory)``; rank 0 makes room first (leftovers of
    killed runs removed; another dataset replaced only with ``overwrite``) and creates the build
    directory before anything is read, so an output that cannot be written fails at once."""
    reused, root = None, None
    if runner.is_main:
        out.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(out)
        reused = check_reuse(out, wanted, overwrite)
        if reused is None:
            check_replaceable(out)
            root = build_dir(out, os.getpid())
            try:
                root.mkdir()
            except OSError as e:  # permission; a name that fits but not with the temporary suffix
                raise PreprocessError(
                    f"output {out}: cannot create files in {out.parent} ({e.strerror})"
                ) from None
    reused, root = runner.share((reused, root))
    if reused is not None and runner.is_main:
        print(f"preprocess: up to date, reusing {out}")
    return reused, root


def publish(root: Path, out: Path, runner: Runner, make: Callable[[], Manifest]) -> Manifest:
    """``make()`` builds a dataset in ``root`` on every rank, and rank 0 renames it to ``out`` once
    every rank's part is in: the old dataset stays complete until the new one is in
    (:func:`...files.atomic.replace_dir`).  On any failure the workers are stopped first (nothing keeps
    writing into it) and ``root`` is removed."""
    from ...files.atomic import replace_dir

    try:
        manifest = make()
        runner.gather(None)  # every rank's shards are in before rank 0 renames
        if runner.is_main:
            replace_dir(root, out)
    except BaseException as e:
        why = out_of_room(e, root.parent)  # numpy's short write names no file, no disk
        if runner.is_main:
            runner.close(failed=True)
            shutil.rmtree(root, ignore_errors=True)
        if why is not None:
            raise WriteError(
                f"output {out}: not written: a write into {root} failed ({why}); "
                "nothing was replaced, the build directory is removed"
            ) from None
        raise
    return manifest
