"""Checkpoints: dense model + optimizer, the full embedding tables, and what they were trained on.

A checkpoint is a directory ``checkpoints/step_<N>/``: ``dense.pt`` (written by rank 0), one
``tables-rank<R>.pt`` per rank that owns tables (full tables in row order, whatever their placement
or cache state) and ``meta.json``, written last: the step, which file holds which table, every
file's size, the run's config and the identity of its dataset.  Tables are found by name, so a
checkpoint written by N ranks can be resumed by M ranks with any table placement.

Crash safety: everything is written (and fsync'ed) into ``.step_<N>.tmp/``, which replaces
``step_<N>/`` by :func:`~dlrm_cache.data.files.replace_dir`, so a kill at any point leaves every
earlier checkpoint complete; :func:`final_checkpoint` takes the newest complete one that the run's
log records (a resume from an older checkpoint first sets the later ones aside: :mod:`.branch`).

Security: the ``.pt`` files are read with ``torch.load(weights_only=True)``: tensors and plain
containers only, so a crafted file cannot run code; everything else is JSON.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from ..config import config_dict, flatten
from ..data.files import (
    WriteError,
    atomic_write_text,
    check_regular,
    fsync_path,
    one_line,
    recover_dir,
    replace_dir,
)
from ..data.format import Manifest
from ..layout import CKPT_DENSE, CKPT_META
from ..parallel.placement import parse_key
from ..rundir import CKPT_DIR, recorded_checkpoints
from .recorded import RecordedModel

_STEP_DIR = re.compile(r"step_(\d+)")
_LEFT_BEHIND = re.compile(r"\.(step_\d+)\.(tmp|old)")  # by a save that was killed

# What a resumed run must share with its checkpoint: the model's shapes, the optimizers whose state
# it holds (and the dense optimizer's settings, which loading its state restores), and what fixes
# the data position (global batch k of epoch e).  Everything else (learning rates, schedules,
# embedding placement, number of ranks, evaluation, logging) may change on resume.
RESUME_KEYS = (
    "model.embedding_dim",
    "model.bottom_mlp",
    "model.top_mlp",
    "model.interaction",
    "model.dcn_num_layers",
    "model.dcn_low_rank_dim",
    "optim.sparse.name",
    "optim.dense.name",
    "optim.dense.weight_decay",
    "optim.dense.momentum",
    "data.batch_size",
    "data.shuffle",
    "seed",
)

# keys a checkpoint written before they existed lacks (compared where it records them)
LATER_KEYS = ("model.interaction", "model.dcn_num_layers", "model.dcn_low_rank_dim")

# ...and what must be recorded of its dataset (newer identity keys may be absent from older checkpoints)
REQUIRED_DATASET_KEYS = ("dataset.table_sizes", "dataset.stats_digest")


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_checkpoint(
    run_dir: Path,
    step: int,
    dense: dict[str, Any],
    tables: dict[str, torch.Tensor],
    rank: int,
    meta: dict[str, Any],
) -> Path:
    """Collective under torchrun: every rank calls it with its own tables; rank 0's ``dense`` and
    ``meta`` (JSON-able: config, dataset identity, ...) are stored."""
    final = step_dir(run_dir, step)
    root = final.parent
    tmp = root / f".{final.name}.tmp"
    if rank == 0:
        _clean_left_behind(root)
        tmp.mkdir(parents=True)
    _barrier()
    files: dict[str, tuple[list[str], int]] = {}  # file -> (its entries, its size)
    try:
        if tables:
            name = f"tables-rank{rank}.pt"
            files[name] = (sorted(tables), _save(tables, tmp / name))
        if dist.is_initialized():
            gathered: list[dict] = [None] * dist.get_world_size()  # type: ignore[list-item]
            dist.all_gather_object(gathered, files)
            files = {k: v for g in gathered for k, v in g.items()}
        if rank == 0:
            files[CKPT_DENSE] = ([], _save(dense, tmp / CKPT_DENSE))
            record = {
                **meta,
                "step": step,
                "tables": {k: f for f, (keys, _) in files.items() for k in keys},
                "files": {f: size for f, (_, size) in files.items()},
            }
            atomic_write_text(tmp / CKPT_META, json.dumps(record, indent=1))
            fsync_path(tmp / CKPT_META)
            replace_dir(tmp, final)
    except OSError as e:  # disk full, quota, permissions: the earlier checkpoints stay as they were
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise WriteError(
            e.errno,
            f"checkpoint step {step} not written ({e.strerror or one_line(e)}); "
            "the earlier checkpoints are intact",
            str(e.filename or tmp),
        ) from None
    _barrier()
    return final


def step_dir(run_dir: Path, step: int) -> Path:
    """Where :func:`save_checkpoint` puts the checkpoint of ``step``."""
    return Path(run_dir) / CKPT_DIR / f"step_{step:08d}"


def _save(obj: dict[str, Any], path: Path) -> int:
    """torch.save, on the disk before the checkpoint is renamed into place; returns the size."""
    with open(path, "wb") as f:
        out = _Writes(f)
        try:
            # torch.save only calls write/flush on a file object, but its annotation says IO[bytes]
            torch.save(obj, out)  # type: ignore[arg-type]
        except RuntimeError:
            if out.error is not None:  # torch's writer reports a failed write without its reason
                raise out.error from None
            raise
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


class _Writes:
    """A file's ``write`` for torch.save that keeps the OSError (ENOSPC, EDQUOT, ...) of a failed write."""

    def __init__(self, f) -> None:
        self.f = f
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def _clean_left_behind(root: Path) -> None:
    """Temporary directories of killed saves go; a checkpoint left aside by one goes back."""
    if not root.is_dir():
        return
    for p in root.iterdir():
        m = _LEFT_BEHIND.fullmatch(p.name)
        if m and m[2] == "tmp":
            shutil.rmtree(p)
        elif m:
            recover_dir(root / m[1])


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Every directory of a step in ``root``, by step: ``step_N`` (complete or not) and what a
    killed save of it left (``.step_N.tmp``, ``.step_N.old``)."""
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.fullmatch(p.name) or _LEFT_BEHIND.fullmatch(p.name)
        if m and p.is_dir():
            found.append((int(m[1].removeprefix("step_")), p))
    return sorted(found)


def _complete(directory: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``directory`` by step: ``step_N`` with its meta.json, or the old
    ``step_N`` a killed save had set aside (before its replacement arrived)."""
    found: dict[int, Path] = {}
    if not directory.is_dir():
        return []
    for p in directory.iterdir():
        step = _STEP_DIR.fullmatch(p.name)
        aside = _LEFT_BEHIND.fullmatch(p.name)
        if not (p / CKPT_META).is_file():
            continue
        if step:
            found[int(step[1])] = p
        elif aside and aside[2] == "old" and not (directory / aside[1]).exists():
            found[int(_STEP_DIR.fullmatch(aside[1])[1])] = p  # type: ignore[index]
    return sorted(found.items())


def final_checkpoint(run_dir: Path, folder: Path | None = None) -> Path | None:
    """The run's final checkpoint: the newest complete one that its log records.

    The one function that chooses "the run's checkpoint" (predict, export, ``resume=RUN`` and
    train's refusal message all come here through :func:`find_checkpoint`).  The log's
    checkpoint records are the run's account of itself (a resume cuts them back to its
    checkpoint's), so a checkpoint they do not name is not the run's: one of a branch a resume
    abandoned (normally set aside, see :mod:`.branch`), or one copied in.  Without a log, or with
    a log that records none (checkpoints only), the newest complete one.  ``folder``: where the
    ``step_N`` directories are (default ``run_dir/checkpoints``).
    """
    found = _complete(folder if folder is not None else run_dir / CKPT_DIR)
    recorded = recorded_checkpoints(run_dir)
    if recorded:
        found = [(step, p) for step, p in found if step in recorded]
    return found[-1][1] if found else None


def find_checkpoint(resume: str) -> Path:
    """A checkpoint directory, or a run directory / its checkpoints folder / a folder of
    ``step_N`` directories: then its :func:`final_checkpoint`."""
    p = Path(resume).expanduser()
    if (p / CKPT_META).is_file():
        return p
    if (p / CKPT_DIR).is_dir():
        final = final_checkpoint(p)
    elif p.name == CKPT_DIR:
        final = final_checkpoint(p.parent, p)
    else:
        final = final_checkpoint(p, p)
    if final is None:
        raise FileNotFoundError(
            f"resume={resume}: no checkpoint there (a directory with {CKPT_META}), nor a run directory with a complete one"
        )
    return final


def load_data(path: Path, mmap: bool = False) -> Any:
    """``torch.load`` of tensors and plain containers only: a file that would build any other
    object (and so could run code) is refused, as is a damaged one, with one line naming it."""
    check_regular(path)
    try:
        with warnings.catch_warnings():
            # a foreign pickle protocol: refused below or harmless, not worth a warning
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", mmap=mmap, weights_only=True)
    except (FileNotFoundError, PermissionError) as e:
        raise type(e)(e.errno, f"{path}: {e.strerror}") from None
    except Exception as e:  # UnpicklingError, RuntimeError (zip), EOFError, OSError (mmap), ...: crafted or damaged
        detail = re.search(r"WeightsUnpickler error:\s*(.*?)(?:\. |\n\n|$)", str(e), re.S)
        if detail:
            raise ValueError(
                f"{path}: refused: it holds more than tensors and plain data "
                f"({one_line(Exception(detail[1]))}); dlrm-cache loads no code"
            ) from None
        raise ValueError(f"{path}: not a readable checkpoint file ({one_line(e)[:200]})") from None


# meta.json's schema: key -> (what it must be, the check).  Checked before any file it names is read.
def _count(v: Any, least: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


META_SCHEMA: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "step": ("an integer >= 0", _count),
    "world_size": ("an integer >= 1", lambda v: _count(v, 1)),
    "log_records": ("an integer >= 0", _count),
    "config": ("a non-empty object (the run's config)", lambda v: isinstance(v, dict) and bool(v)),
    "dataset": (
        "a non-empty object (the dataset's identity)",
        lambda v: isinstance(v, dict) and bool(v),
    ),
    "tables": (
        "an object of table entry -> file name",
        lambda v: (
            isinstance(v, dict)
            and all(isinstance(k, str) and isinstance(f, str) for k, f in v.items())
        ),
    ),
    "files": (
        "an object of file name -> size in bytes",
        lambda v: (
            isinstance(v, dict) and all(isinstance(k, str) and _count(n) for k, n in v.items())
        ),
    ),
}


def meta_problem(meta: Any, directory: Path) -> str | None:
    """What is wrong with a parsed meta.json of the checkpoint in ``directory``, or None.

    Every key of :data:`META_SCHEMA` with its type and range; every file it names (the dense
    part's included) recorded with its size, a plain name that resolves to a file inside
    ``directory`` itself (no path, no ``..``, no link out): a checkpoint reads only its own files.
    """
    if not isinstance(meta, dict):
        return f"a JSON {type(meta).__name__}, not an object"
    for key, (what, ok) in META_SCHEMA.items():
        if key not in meta:
            return f"no {key!r}"
        if not ok(meta[key]):
            return f"{key!r} must be {what}"
    home = directory.resolve()
    for name in sorted({*meta["tables"].values(), *meta["files"], CKPT_DENSE}):
        if name not in meta["files"]:
            return f"no size recorded for {name!r}"
        if (
            name in ("", ".", "..")
            or Path(name).name != name
            or (home / name).resolve().parent != home
        ):
            return f"{name!r} is not a file of this checkpoint directory"
    return None


class Checkpoint:
    """A complete checkpoint, checked when opened: its meta.json, every file's recorded size,
    and its dense part (small) loaded; the tables are read on demand."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        meta_path = self.path / CKPT_META
        check_regular(meta_path)
        try:
            self.meta: dict[str, Any] = json.loads(meta_path.read_text())
        except ValueError as e:
            raise ValueError(
                f"{meta_path}: not a dlrm-cache checkpoint's meta.json ({one_line(e)})"
            ) from None
        except OSError as e:
            raise type(e)(e.errno, f"{meta_path}: {e.strerror}") from None
        problem = meta_problem(self.meta, self.path)
        if problem is not None:
            raise ValueError(
                f"{meta_path}: not a dlrm-cache checkpoint's meta.json ({problem}); "
                "resume from another checkpoint"
            )
        self.step: int = self.meta["step"]
        stored: dict[str, str] = self.meta["tables"]
        for name in sorted({*stored.values(), CKPT_DENSE}):
            f = self.path / name
            want = self.meta["files"][name]
            have = f.stat().st_size if f.is_file() else None
            if have != want:
                found = "missing" if have is None else f"{have} bytes"
                raise ValueError(
                    f"{f}: {found} but {meta_path} records {want}"
                    " (cut short or replaced?); resume from another checkpoint"
                )
        self.dense: dict[str, Any] = load_data(self.path / CKPT_DENSE)
        self.config: dict[str, Any] = self.meta["config"]
        try:
            self.model = RecordedModel.of(self.meta)
        except ValueError as e:
            raise ValueError(f"{meta_path}: {e}; resume from another checkpoint") from None
        problem = (
            self.model.dense_problem(self.dense["model"])
            if self.model is not None and isinstance(self.dense, dict) and "model" in self.dense
            else None
        )
        if problem is not None:
            raise ValueError(
                f"{self.path / CKPT_DENSE}: not the model {meta_path} describes ({problem}); "
                "resume from another checkpoint"
            )

    def table_problem(self, key: str, value: Any) -> str | None:
        """:meth:`RecordedModel.table_problem`, where the checkpoint records a model."""
        if self.model is None:
            return (
                None
                if isinstance(value, torch.Tensor)
                else f"holds no tensor {key} though {CKPT_META} says so"
            )
        return self.model.table_problem(key, value)

    def check_tables(self) -> None:
        """Every entry of every tables file against :meth:`table_problem` (memory-mapped: only
        the files' indexes are read), so a resume refuses a bad file before anything is built."""
        stored: dict[str, str] = self.meta["tables"]
        for name in sorted(set(stored.values())):
            data = load_data(self.path / name, mmap=True)
            for key in sorted(k for k, f in stored.items() if f == name):
                value = data.get(key) if isinstance(data, dict) else None
                problem = self.table_problem(key, value)
                if problem is not None:
                    raise ValueError(
                        f"{self.path / name}: {problem}; resume from another checkpoint"
                    )

    def log_records(self, run_dir: Path) -> int | None:
        """How many records the run's metrics.jsonl held at this checkpoint, if it was written into
        ``run_dir`` (a run resumed there drops the later ones: it redoes those steps)."""
        if self.path.parent.parent.resolve() != Path(run_dir).resolve():
            return None
        return self.meta["log_records"]

    def tables(self, keys: list[str]) -> dict[str, torch.Tensor]:
        """The requested entries, reading only the files that hold them.

        A key may name a whole table (``C3.weight``) or a row range (``C3:0-500.weight``); it is
        assembled from whatever pieces the writer's sharding produced, so N-rank checkpoints
        resume on M ranks.
        """
        stored: dict[str, str] = self.meta["tables"]
        pieces: dict[tuple[str, str], list[tuple[int | None, int | None, str]]] = {}
        for k in stored:
            table, lo, hi, field = parse_key(k)
            pieces.setdefault((table, field), []).append((lo, hi, k))
        files: dict[str, dict[str, torch.Tensor]] = {}

        def load(k: str) -> torch.Tensor:
            f = stored[k]
            if f not in files:
                files[f] = load_data(self.path / f, mmap=True)
            value = files[f].get(k) if isinstance(files[f], dict) else None
            problem = self.table_problem(k, value)
            if problem is not None or not isinstance(value, torch.Tensor):
                raise ValueError(f"{self.path / f}: {problem}")
            return value

        out: dict[str, torch.Tensor] = {}
        for key in keys:
            if key in stored:
                out[key] = load(key)
                continue
            table, lo, hi, field = parse_key(key)
            have = pieces.get((table, field))
            if not have:
                raise ValueError(
                    f"resume={self.path}: the checkpoint has no {key} (written with another model or "
                    "optimizer?)"
                )
            spans = [
                (plo or 0, phi if phi is not None else load(k).shape[0], k) for plo, phi, k in have
            ]
            lo = lo or 0
            hi = hi if hi is not None else max(s[1] for s in spans)
            first = load(spans[0][2])
            result = first.new_empty((hi - lo, *first.shape[1:]))
            filled = 0
            for plo, phi, k in spans:
                a, b = max(lo, plo), min(hi, phi)
                if a < b:
                    result[a - lo : b - lo] = load(k)[a - plo : b - plo]
                    filled += b - a
            if filled != hi - lo:
                raise ValueError(
                    f"resume={self.path}: rows {lo}-{hi} of {table}.{field} are not all there"
                )
            out[key] = result
        return out


def checkpoint_meta(
    cfg: DictConfig, manifest: Manifest, world_size: int, log_records: int
) -> dict[str, Any]:
    """What :func:`save_checkpoint` records beside the tensors (the other half of a resume check)."""
    return {
        "config": config_dict(cfg),
        "cwd": os.getcwd(),  # where a relative data.path is (trained.recorded_dataset)
        "dataset": manifest.identity(),
        "world_size": world_size,
        "log_records": log_records,
    }


def open_resume(cfg: DictConfig, manifest: Manifest) -> Checkpoint:
    """The checkpoint ``resume=`` names, opened and checked against this run before anything is
    built: a different model, optimizer, data position or dataset is refused, naming every
    differing key (its state would not fit, or would silently be dropped or misread)."""
    ckpt = Checkpoint(find_checkpoint(str(cfg.resume)))
    ckpt.check_tables()
    now = {**_pick(config_dict(cfg), RESUME_KEYS), **flatten(manifest.identity(), "dataset.")}
    then = {**_pick(ckpt.config, RESUME_KEYS), **flatten(ckpt.meta["dataset"], "dataset.")}
    then.setdefault("model.interaction", "dot")  # written before the key: a dot model
    if "dot" in (now.get("model.interaction"), then["model.interaction"]):
        for k in LATER_KEYS[1:]:  # the cross network's shape: nothing to compare without one
            now.pop(k, None), then.pop(k, None)
    required = [k for k in RESUME_KEYS if k not in LATER_KEYS]
    unknown = [k for k in (*required, *REQUIRED_DATASET_KEYS) if k not in then]
    if unknown:  # nothing to compare: the resume could not be checked
        raise ValueError(
            f"{ckpt.path / CKPT_META}: records no {unknown[0]} (of the run's config or its dataset); "
            "it cannot be checked against this run, resume from another checkpoint"
        )
    if "dataset.schema_digest" in then:  # trained under a user schema: this dataset must be too
        now.setdefault("dataset.schema_digest", "")
    diff = [k for k in now if k in then and then[k] != now[k]]
    if diff:
        raise ValueError(
            f"resume={ckpt.path}: the checkpoint was written with "
            + ", ".join(f"{k}={_short(then[k])} (now {_short(now[k])})" for k in diff)
            + "; resume with the same values, or start a new run"
        )
    return ckpt


def _pick(config: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    flat = flatten(config)
    return {k: flat[k] for k in keys if k in flat}


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."
