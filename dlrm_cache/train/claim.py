"""A run directory belongs to one run: claimed (and locked) before a run writes anything into it.

* **Ownership.**  A directory holding another run's files (``metrics.jsonl``, ``summary.json``,
  ``checkpoints/``, ``abandoned/``) is refused, naming it, unless the run resumes from a checkpoint
  of that very directory (``resume=``; from an older one, what the run recorded after it is set
  aside first, see :mod:`.branch`) or says ``overwrite=true`` (then those files are removed first).  Hydra's
  own files (``.hydra/``, ``train*.log``) do not make a directory taken: Hydra writes them before
  any command code runs.
* **Hydra's snapshot.**  Hydra writes ``.hydra/`` before any command code runs, so
  :func:`hydra_subdir` (train.yaml's ``output_subdir``) tells it to write none into a directory
  that holds a run: a refused run leaves the snapshot as it was, a resumed run keeps its original
  one, and ``overwrite=true`` writes the new run's own after removing the old run's files.
* **Lock.**  While a job trains, its rank 0 holds an exclusive ``flock`` on ``<run_dir>/.lock``
  (removed when the run ends; the kernel drops the lock when the process dies, however it dies,
  so a file left by a killed run locks nothing).  A
  second job into the directory is refused at once; the ranks of one job share the directory
  (rank 0 decides for all of them and every rank raises the same error).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from ..console.typed import typed_override
from ..files.atomic import atomic_write_text
from ..files.layout import SNAPSHOT
from ..rundir.records import ABANDONED, CKPT_DIR, METRICS, SUMMARY

if TYPE_CHECKING:
    from ..parallel.dist import DistInfo

# (torch is imported where it is used: Hydra calls hydra_subdir() for every command, which must
# not pay for importing torch)
LOCK = ".lock"
# What makes a directory a run's: the files a run writes (report reads them; a resume continues
# them; a resume from an older checkpoint sets a branch aside in abandoned/).
RUN_FILES = (METRICS, SUMMARY, CKPT_DIR, ABANDONED)

_held: dict[Path, int] = {}  # run directory -> the descriptor holding its lock (this process)


class RunDirTaken(ValueError):
    """The run directory holds another run, or another process trains in it: the message says
    which and what to do."""


def claim_run_dir(
    run_dir: Path,
    resume_from: Path | None,
    overwrite: bool,
    info: DistInfo,
    config: DictConfig | None = None,
) -> None:
    """Lock ``run_dir`` for this job and make sure it holds no other run (removing it under
    ``overwrite``, then writing Hydra's snapshot of ``config`` if Hydra runs this job).
    ``resume_from``: the checkpoint directory the run resumes from, if any.  Collective under
    torchrun.  Undone by :func:`release`."""
    error: str | None = None
    if info.is_main:
        try:
            _lock(run_dir)
            if _check_owner(run_dir, resume_from, overwrite) and config is not None:
                _snapshot(run_dir, config)
            if resume_from is not None and _own(run_dir, resume_from):
                from .branch import set_aside_branch

                set_aside_branch(run_dir, resume_from)
        except (RunDirTaken, OSError) as e:
            release(run_dir)
            error = str(e) if isinstance(e, RunDirTaken) else f"run dir {run_dir}: {e}"
    if info.distributed:
        import torch.distributed as dist

        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error is not None:
        raise RunDirTaken(error)


def release(run_dir: Path | None = None) -> None:
    """Give up the lock on ``run_dir`` (every lock this process holds when None); the lock
    file goes, removed while still locked (see :func:`_lock`)."""
    for d in [Path(run_dir).resolve()] if run_dir is not None else list(_held):
        fd = _held.pop(d, None)
        if fd is not None:
            (d / LOCK).unlink(missing_ok=True)
            os.close(fd)  # closing the descriptor drops the flock


def _lock(run_dir: Path) -> None:
    """flock ``run_dir/.lock``.  A holder removes the file before it unlocks, so a lock taken
    on a file that is no longer at that path (removed meanwhile) is taken again on the new one."""
    run_dir.mkdir(parents=True, exist_ok=True)
    key = run_dir.resolve()
    path = run_dir / LOCK
    while key not in _held:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirTaken(
                f"run dir {run_dir} is in use: {holder} trains in it (it holds {path}); "
                "wait for it to finish or choose another hydra.run.dir"
            ) from None
        except OSError:
            os.close(fd)
            raise
        mine = os.fstat(fd)
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
            os.close(fd)  # removed by the holder we waited for: lock the file there now
            continue
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        _held[key] = fd


def hydra_subdir() -> str | None:
    """Where Hydra writes its snapshot of this job: ``.hydra``, or None (none) when the job's
    output directory already holds a run."""
    from hydra.core.hydra_config import HydraConfig

    try:
        out = Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # not a Hydra job, or the config resolved before Hydra set the directory
        return SNAPSHOT
    return None if _holds_run(out) else SNAPSHOT


def output_dir(resume: str | None, fresh: str) -> str:
    """train's output directory (train.yaml's ``hydra.run.dir``): the run directory ``resume=``
    names, so the run continues in place (its log, checkpoints and summary), else ``fresh`` (a new
    directory per job).  A checkpoint directory (``RUN/checkpoints/step_N``) starts a new run
    from that checkpoint and leaves RUN as it is; ``hydra.run.dir=`` overrides both."""
    if resume and _holds_run(Path(resume)):
        return str(resume)
    return fresh


def _snapshot(run_dir: Path, config: DictConfig) -> None:
    """Hydra's three snapshot files, as Hydra writes them into a fresh run directory."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.instance().cfg
    out = run_dir / SNAPSHOT
    out.mkdir(exist_ok=True)
    for name, node in (
        ("config.yaml", config),
        ("hydra.yaml", hydra_cfg),
        ("overrides.yaml", HydraConfig.get().overrides.task),
    ):
        atomic_write_text(out / name, OmegaConf.to_yaml(node))


def _run_files(run_dir: Path) -> list[str]:
    """The files of a run that ``run_dir`` holds (none: no run is there)."""
    return [name for name in RUN_FILES if _present(run_dir / name)]


def _holds_run(run_dir: Path) -> bool:
    return bool(_run_files(run_dir))


def _check_owner(run_dir: Path, resume_from: Path | None, overwrite: bool) -> bool:
    """Raise :class:`RunDirTaken` if ``run_dir`` holds another run; True if it held one that
    ``overwrite`` removed."""
    found = _run_files(run_dir)
    if not found:
        return False
    ours = resume_from is not None and _own(run_dir, resume_from)
    if overwrite and resume_from is not None and _removed_with(run_dir, found, resume_from):
        raise RunDirTaken(
            f"overwrite=true would delete the checkpoint resume= continues from ({resume_from}); "
            "choose one of them"
        )
    if ours:
        return False
    if overwrite:
        for name in found:
            _remove(run_dir / name)
        return True
    from .checkpoint import find_checkpoint

    try:
        newest = find_checkpoint(str(run_dir)).name
        last = (
            f"its last checkpoint is {newest}; resume it with {typed_override('resume', run_dir)}, "
        )
    except FileNotFoundError:
        last = "it has no complete checkpoint; "
    raise RunDirTaken(
        f"run dir {run_dir} holds another run ({', '.join(found)}): {last}"
        "replace it with overwrite=true, or choose another hydra.run.dir"
    )


def _removed_with(run_dir: Path, found: list[str], checkpoint: Path) -> bool:
    """``checkpoint`` lies inside one of the run files ``found`` in ``run_dir`` (its own
    ``checkpoints/``, or an abandoned branch's in ``abandoned/``), which ``overwrite`` removes."""
    target = Path(checkpoint).resolve()
    return any(target.is_relative_to((run_dir / name).resolve()) for name in found)


def _own(run_dir: Path, checkpoint: Path) -> bool:
    """``checkpoint`` is one of ``run_dir``'s own (``run_dir/checkpoints/step_N``)."""
    return Path(checkpoint).resolve().parent.parent == run_dir.resolve()


def _present(path: Path) -> bool:
    if path.is_dir():
        return any(path.iterdir())
    return path.exists() and (not path.is_file() or path.stat().st_size > 0)


def _remove(path: Path) -> None:
    """A directory is first renamed aside, so a kill midway leaves no half-deleted checkpoints
    under the name a resume would look for."""
    if path.is_dir() and not path.is_symlink():
        aside = path.with_name(f".{path.name}.removing")
        shutil.rmtree(aside, ignore_errors=True)
        path.rename(aside)
        shutil.rmtree(aside)
    else:
        path.unlink()


def checked_run_dir(run_dir: str, data_path: str | None) -> str:
    """``run_dir`` (Hydra's output directory of a train job), or :class:`UnsafeOutput` when the
    outputs rule refuses it: the dataset ``data_path``, a directory containing it (which
    ``overwrite=true`` would empty), or a directory inside a dataset or a checkpoint.  Hydra asks
    it before it writes anything there but the directory itself (train.yaml's log file name),
    which is then removed again if empty.  The one check of train's run directory."""
    from ..files.outputs import RUN, UnsafeOutput, check_output

    _launched[:] = [Path(run_dir)]
    reads = [("dataset", data_path)] if data_path else []
    try:
        check_output(run_dir, "hydra.run.dir", reads, makes=RUN, inside=(RUN,))
    except UnsafeOutput:
        with contextlib.suppress(OSError):
            os.rmdir(run_dir)  # Hydra made it for this job: only if nothing is in it
        raise
    return run_dir


_launched: list[Path] = []  # the run directory Hydra made for this job (checked_run_dir)


def discard_failed_launch(out: Path | None = None) -> None:
    """Remove the run directory of a train job that failed before it wrote anything (bad config,
    missing data, a full disk under Hydra's own files): one that holds only what Hydra wrote for
    the job (``.hydra/``, ``train*.log``), and its date directory (``runs/train/<date>/``) if that
    is left empty.  ``out``: that directory (default: Hydra's output directory of this job).
    Rank 0 only; a directory holding anything else (a run, a lock, a user's file) is left as it
    is."""
    from hydra.core.hydra_config import HydraConfig

    if int(os.environ.get("RANK", "0")) != 0:
        return
    if out is None:
        if not HydraConfig.initialized():
            return
        out = Path(HydraConfig.get().runtime.output_dir)
    out = out.resolve()
    try:
        names = [p.name for p in out.iterdir()]
    except OSError:
        return
    hydras = all(n == SNAPSHOT or (n.startswith("train") and n.endswith(".log")) for n in names)
    if not hydras or out == Path.cwd().resolve():
        return
    shutil.rmtree(out, ignore_errors=True)
    parent = out.parent
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", parent.name):
        with contextlib.suppress(OSError):
            parent.rmdir()  # only if empty
