"""A raw dataset's layout (label, dense and sparse columns) resolved from its config, and the one
mapping of raw sparse values to int64 ids.

Ids, per sparse value (the contract every reader and predict's raw-input parsing share):

* Criteo text: 1-8 hex digits, the id is that number (``criteo.parse_hex``);
* other text, and parquet strings/binaries: the 64-bit FNV-1a hash of the value's bytes (UTF-8
  for text) with its top bit cleared, so ids are >= 0 (stable across runs, machines and versions;
  not Python's ``hash()``);
* parquet integers: the value with its top bit cleared (a non-negative value is its own id);
* then, with a modulus m (the column's ``hash``, else ``hash_modulus``): id mod m.

An empty one-hot field (text ``""``, parquet null) is :data:`.format.MISSING_ID`, a value of its
own; an empty multi-hot field is an empty list.  A multi-hot text field holds its ids separated by
:data:`LIST_SEPARATOR`.

A dataset built under a schema other than the default Criteo one records it in ``schema.json``
(:data:`SCHEMA_FILE`), with the training split's mean/std of every ``standardize`` column, so
``predict`` maps raw input the same way.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .format import DENSE_NAMES, LABEL, SPARSE_NAMES

LIST_SEPARATOR = "|"  # between the ids of a multi-hot field in raw text
SCHEMA_FILE = "schema.json"  # in a dataset built under a non-default schema
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_TOP_BIT_CLEAR = np.uint64(0x7FFFFFFFFFFFFFFF)


class SchemaError(ValueError):
    """A schema that cannot describe a dataset; the message names the key."""


@dataclass
class Schema:
    """A resolved schema: what the readers and the pipeline need, in feature order."""

    format: str = "criteo"
    header: bool = False
    columns: list[str] = field(default_factory=list)  # the text file's columns, in order
    label: str = LABEL
    dense: list[str] = field(default_factory=lambda: list(DENSE_NAMES))
    transforms: list[str] = field(default_factory=lambda: ["log1p"] * len(DENSE_NAMES))
    sparse: list[str] = field(default_factory=lambda: list(SPARSE_NAMES))
    multi_hot: list[str] = field(default_factory=list)
    hashes: list[int] = field(default_factory=lambda: [0] * len(SPARSE_NAMES))  # 0: none
    # standardize columns: name -> [mean, std] over the training split (set by preprocess)
    moments: dict[str, list[float]] = field(default_factory=dict)

    @property
    def fast(self) -> bool:
        """Criteo text, one-hot: read by :func:`.criteo.parse_block` (else :mod:`.tabular`)."""
        return self.format == "criteo" and not self.multi_hot

    @property
    def is_default(self) -> bool:
        """Criteo's layout under one ``hash_modulus``: the dataset is what preprocess always
        built (no ``schema.json``, the settings record has no ``schema``)."""
        return self.fast and len(set(self.hashes)) == 1

    @property
    def id_high(self) -> int:
        """An upper bound of the ids before hashing (the count merge cuts buckets below it)."""
        return 1 << 32 if self.format == "criteo" else (1 << 63) - 1

    @property
    def text(self) -> bool:
        return self.format != "parquet"

    @property
    def delimiter(self) -> str:
        return "," if self.format == "csv" else "\t"

    def multi_hot_mask(self) -> list[bool]:
        return [n in self.multi_hot for n in self.sparse]

    def record(self) -> dict[str, Any]:
        return asdict(self)

    def digest(self) -> str:
        """sha256 of the schema's record (key order aside): a dataset's manifest holds it, so a
        dataset rebuilt under another schema (a transform, hash or moments changed) is another
        dataset to the runs trained on it."""
        import hashlib

        return hashlib.sha256(json.dumps(self.record(), sort_keys=True).encode()).hexdigest()

    def save(self, directory: Path) -> None:
        from ..files.atomic import atomic_write_text

        atomic_write_text(directory / SCHEMA_FILE, json.dumps(self.record(), indent=2))

    @classmethod
    def load(cls, dataset: Path, hash_modulus: int = 0) -> Schema:
        """The dataset's schema (without ``schema.json``: Criteo's, every column under the
        manifest's ``hash_modulus``)."""
        path = dataset / SCHEMA_FILE
        if path.exists():
            return cls(**json.loads(path.read_text()))
        return cls(hashes=[hash_modulus] * len(SPARSE_NAMES))


def resolve(cfg: Any, hash_modulus: int) -> Schema:
    """The :class:`Schema` of a ``SchemaConfig`` (or a dict of one); ``hash_modulus`` is the
    modulus of every sparse column without its own ``hash``.  Raises :class:`SchemaError`."""
    fmt = str(_attr(cfg, "format"))
    sparse = [
        (str(_attr(c, "name")), bool(_attr(c, "multi_hot")), int(_attr(c, "hash")))
        for c in _attr(cfg, "sparse")
    ]
    dense = [(str(_attr(c, "name")), str(_attr(c, "transform"))) for c in _attr(cfg, "dense")]
    for name, _, h in sparse:
        if h < 0:
            raise SchemaError(
                f"schema.sparse: {name!r} has hash={h}; a modulus is >= 1 (0: hash_modulus)"
            )
    if fmt == "criteo":
        if _attr(cfg, "header") or list(_attr(cfg, "columns")) or _attr(cfg, "label") != LABEL:
            raise SchemaError("schema: format=criteo has no header, fixed columns and 'label'")
        return _criteo(sparse, dense, hash_modulus)
    if not sparse:
        raise SchemaError(f"schema.sparse: format={fmt} needs at least one sparse column")
    s = Schema(
        format=fmt,
        header=bool(_attr(cfg, "header")),
        columns=[str(c) for c in _attr(cfg, "columns")],
        label=str(_attr(cfg, "label")),
        dense=[n for n, _ in dense],
        transforms=[t for _, t in dense],
        sparse=[n for n, _, _ in sparse],
        multi_hot=[n for n, multi, _ in sparse if multi],
        hashes=[h or hash_modulus for _, _, h in sparse],
    )
    _check_names(s)
    return s


def _attr(c: Any, key: str) -> Any:
    return c[key] if isinstance(c, dict) else getattr(c, key)


def _criteo(sparse: list[tuple[str, bool, int]], dense: list, hash_modulus: int) -> Schema:
    if dense:
        raise SchemaError("schema.dense: format=criteo has its own dense columns (I1..I13)")
    s = Schema(hashes=[hash_modulus] * len(SPARSE_NAMES))
    for name, multi, h in sparse:
        if name not in SPARSE_NAMES:
            raise SchemaError(f"schema.sparse: {name!r} is not one of Criteo's C1..C26")
        if multi:
            s.multi_hot.append(name)
        if h:
            s.hashes[SPARSE_NAMES.index(name)] = h
    s.multi_hot.sort(key=SPARSE_NAMES.index)
    return s


def _check_names(s: Schema) -> None:
    names = [s.label, *s.dense, *s.sparse]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SchemaError(f"schema: column {dup[0]!r} is named twice")
    if s.columns and not s.header:
        missing = [n for n in names if n not in s.columns]
        if missing:
            raise SchemaError(f"schema.columns: has no column {missing[0]!r}")
    if s.format == "parquet" and (s.header or s.columns):
        raise SchemaError("schema: header/columns are for text formats (parquet names its columns)")


def file_columns(s: Schema) -> list[str]:
    """A text file's columns without a header: ``columns``, else label, dense..., sparse..."""
    return list(s.columns) or [s.label, *s.dense, *s.sparse]


def fnv1a(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """64-bit FNV-1a of each value ``data[offsets[i]:offsets[i+1]]``, top bit cleared (int64).

    One vector step per byte position, over the values that long (cost ~ the bytes hashed)."""
    starts, lens = offsets[:-1], np.diff(offsets)
    h = np.full(len(lens), _FNV_OFFSET, dtype=np.uint64)
    order = np.argsort(-lens, kind="stable")  # longest first: the live values are a prefix
    by_len = lens[order]
    for k in range(int(by_len[0]) if len(lens) else 0):
        live = order[: np.searchsorted(-by_len, -k, side="left")]
        h[live] = (h[live] ^ data[starts[live] + k].astype(np.uint64)) * _FNV_PRIME
    return (h & _TOP_BIT_CLEAR).astype(np.int64)


def int_ids(values: np.ndarray) -> np.ndarray:
    """Integer values as ids: top bit cleared (a non-negative value is its own id)."""
    return (values.astype(np.int64).view(np.uint64) & _TOP_BIT_CLEAR).astype(np.int64)
