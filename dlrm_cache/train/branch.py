"""A resume from an older checkpoint of its own run directory branches the run.

The rule: a run resumed into its own run directory from the checkpoint of step K continues the run
from K, and what the run recorded after K no longer describes it.  Before anything of the new
branch is written (right after the run directory is claimed, before the log is cut back to K's
records), rank 0 moves what the abandoned branch left to ``abandoned/after_step_<K>/``:

* ``checkpoints/step_N`` for every N > K (complete or not, and what a killed save of it left),
* ``summary.json`` (the abandoned branch's end),
* ``metrics.jsonl``: a copy of the whole log as it was (and of Hydra's ``.hydra/`` and the
  TensorBoard event files, which the resume then cuts back as it cuts the log),

which is a run directory of its own (`report`, `predict` and `export` read it; its final checkpoint
is the abandoned branch's last).  Nothing is deleted; a second branch from the same step goes to
``after_step_<K>.2``, and so on.  When nothing lies after K (the usual resume of a stopped run)
nothing moves.

So the run directory's final checkpoint (:func:`.checkpoint.final_checkpoint`, the newest complete
one the log records) is the one its summary and log describe, and its best (:mod:`.best`, derived
from the log and the checkpoints in place) is one of its own, never one set aside.  Each move is one rename; a kill in
the middle of the set-aside leaves the log uncut (it still names the later checkpoints, of which
the final one is then chosen) and the next resume from K moves the rest.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from ..files.atomic import atomic_file
from ..files.layout import CKPT_META, SNAPSHOT
from ..rundir.records import ABANDONED, CKPT_DIR, METRICS, SUMMARY
from ..rundir.tensorboard import EVENTS_GLOB
from .checkpoint import step_dirs

log = logging.getLogger(__name__)


def set_aside_branch(run_dir: Path, resume_from: Path) -> Path | None:
    """Move what ``run_dir`` recorded after the checkpoint ``resume_from`` (one of its own) to a new
    ``abandoned/after_step_<K>``; returns that directory, or None when nothing lay after it."""
    step = int(json.loads((resume_from / CKPT_META).read_text())["step"])
    later = [(n, p) for n, p in step_dirs(run_dir / CKPT_DIR) if n > step]
    summary = run_dir / SUMMARY
    if not later and not summary.exists():
        return None
    dest = _new_branch_dir(run_dir, step)
    (dest / CKPT_DIR).mkdir(parents=True)
    # the log and its TensorBoard scalars, whole (the resume then cuts back the run's own)
    for src_path in [run_dir / METRICS, *run_dir.glob(EVENTS_GLOB)]:
        if src_path.is_file():
            with atomic_file(dest / src_path.name, "wb") as f, open(src_path, "rb") as src:
                shutil.copyfileobj(src, f)
    if (run_dir / SNAPSHOT).is_dir():  # Hydra's record of the run (report reads its cwd)
        shutil.copytree(run_dir / SNAPSHOT, dest / SNAPSHOT)
    steps = ", ".join(str(n) for n in sorted({n for n, _ in later}))
    moved = [f"the checkpoints of steps {steps}"] if later else []
    if summary.exists():
        summary.rename(dest / SUMMARY)
        moved.append(SUMMARY)
    for _, p in reversed(later):
        p.rename(dest / CKPT_DIR / p.name)
    log.info(
        "resumed from step %d of this run: what it recorded after that step (%s) is set aside in %s",
        step,
        " and ".join(moved),
        dest,
    )
    return dest


def _new_branch_dir(run_dir: Path, step: int) -> Path:
    base = run_dir / ABANDONED / f"after_step_{step:08d}"
    dest, n = base, 1
    while dest.exists():
        n += 1
        dest = base.with_name(f"{base.name}.{n}")
    return dest
