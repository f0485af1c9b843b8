"""A saved checkpoint, read back: its ``meta.json`` checked, then its files, weights only.

Everything a checkpoint directory holds is checked before it is used: ``meta.json`` against
:data:`META_SCHEMA` (types, ranges, every file named with its size and sha256, no file outside
the directory), each file's size, each file's sha256 before it is first read, then the tensors
against the model the checkpoint records.  The ``.pt`` files are read with
``torch.load(weights_only=True)``: tensors and plain containers only, so a crafted file cannot
run code.  A checkpoint written before digests were recorded (no ``digests`` in its meta.json) is
read with its sizes checked only.  Writing and finding checkpoints: :mod:`.checkpoint`.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..files.atomic import check_regular, one_line, sha256_file
from ..files.layout import CKPT_DENSE, CKPT_META
from ..parallel.placement import parse_key
from ..rundir.records import CHECKPOINT, METRICS, logged_records
from .optim import dense_optimizer_problem
from .recorded import RecordedModel


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


# optional (checkpoints written before it lack it): file name -> sha256 of its bytes, every file
DIGESTS = "digests"


def _digests(v: Any) -> bool:
    hexdigit = set("0123456789abcdef")
    return isinstance(v, dict) and all(
        isinstance(d, str) and len(d) == 64 and set(d) <= hexdigit for d in v.values()
    )


def meta_problem(meta: Any, directory: Path) -> str | None:
    """What is wrong with a parsed meta.json of the checkpoint in ``directory``, or None.

    Every key of :data:`META_SCHEMA` with its type and range; every file it names (the dense
    part's included) recorded with its size (and its sha256, where :data:`DIGESTS` is recorded),
    a plain name that resolves to a file inside ``directory`` itself (no path, no ``..``, no link
    out): a checkpoint reads only its own files.
    """
    if not isinstance(meta, dict):
        return f"a JSON {type(meta).__name__}, not an object"
    for key, (what, ok) in META_SCHEMA.items():
        if key not in meta:
            return f"no {key!r}"
        if not ok(meta[key]):
            return f"{key!r} must be {what}"
    if DIGESTS in meta and not _digests(meta[DIGESTS]):
        return f"{DIGESTS!r} must be an object of file name -> sha256 (64 hex digits)"
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
        if DIGESTS in meta and name not in meta[DIGESTS]:
            return f"no sha256 recorded for {name!r} in {DIGESTS!r}"
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
        self._verified: set[str] = set()  # the files whose sha256 was checked
        self._log_checked = False
        self.dense: dict[str, Any] = self._load(CKPT_DENSE)
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

    def _load(self, name: str, mmap: bool = False) -> Any:
        """:func:`load_data` of the checkpoint's file ``name``, its sha256 checked against
        meta.json's the first time it is read (a byte flipped on the disk is not a weight)."""
        path = self.path / name
        want = self.meta.get(DIGESTS, {}).get(name)
        if want is not None and name not in self._verified:
            if sha256_file(path) != want:
                raise ValueError(
                    f"{path}: its sha256 is not the one {self.path / CKPT_META} records (damaged "
                    "or replaced since it was saved); resume from another checkpoint"
                )
            self._verified.add(name)
        return load_data(path, mmap=mmap)

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
            data = self._load(name, mmap=True)
            for key in sorted(k for k, f in stored.items() if f == name):
                value = data.get(key) if isinstance(data, dict) else None
                problem = self.table_problem(key, value)
                if problem is not None:
                    raise ValueError(
                        f"{self.path / name}: {problem}; resume from another checkpoint"
                    )

    def check_optimizer(self) -> None:
        """The dense optimizer's state (what only a resume loads) against the recorded model and
        ``optim.dense`` settings, so a resume refuses a bad one before anything is built."""
        name = self.config.get("optim", {}).get("dense", {}).get("name")
        if self.model is None or name is None:
            return  # recorded nothing to check it against (refused elsewhere when it matters)
        momentum = self.config["optim"]["dense"].get("momentum", 0.0)
        state = self.dense.get("optimizer") if isinstance(self.dense, dict) else None
        problem = dense_optimizer_problem(state, list(self.model.dense.values()), name, momentum)
        if problem is not None:
            raise ValueError(
                f"{self.path / CKPT_DENSE}: its optimizer state is not optim.dense.name={name}'s "
                f"for this model ({problem}); resume from another checkpoint"
            )

    def log_records(self, run_dir: Path) -> int | None:
        """How many records the run's metrics.jsonl held at this checkpoint, if it was written into
        ``run_dir`` (a run resumed there drops the later ones: it redoes those steps).  Checked
        against the log the first time: it holds that many records, the checkpoint's own among
        them where it records checkpoints (a count beyond the log would keep the later steps'
        records mid-file)."""
        if self.path.parent.parent.resolve() != Path(run_dir).resolve():
            return None
        n: int = self.meta["log_records"]
        if not self._log_checked:
            records = logged_records(Path(run_dir))  # none: no log to cut back
            saves = [i for i, r in enumerate(records) if r and r.get("kind") == CHECKPOINT]
            mine = [i for i in saves if records[i].get("step") == self.step]  # type: ignore[union-attr]
            if records and (n > len(records) or (saves and not any(i < n for i in mine))):
                raise ValueError(
                    f"{self.path / CKPT_META}: log_records {n}, but the first {n} of the "
                    f"{len(records)} records of {Path(run_dir) / METRICS} do not hold this "
                    f"checkpoint's (step {self.step}); resume from another checkpoint"
                )
            self._log_checked = True
        return n

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
                files[f] = self._load(f, mmap=True)
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
