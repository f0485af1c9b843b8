"""TensorBoard scalars from train's records, without TensorBoard or TensorFlow installed.

An event file is a sequence of TFRecords (``uint64 length``, ``masked crc32c`` of the length,
the bytes, ``masked crc32c`` of the bytes), each holding one ``Event`` protobuf; the first says
``file_version: "brain.Event:2"``, the others carry a ``Summary`` of ``simple_value`` scalars.  The
few protobuf fields needed are encoded by hand here (and decoded by :func:`read_scalars`, which
checks every CRC), so the only cost of the option is this module: no new dependency.

:class:`TensorBoardLog` turns every record train writes to metrics.jsonl into scalars at its
``step``, tagged so that TensorBoard's cards (grouped by a tag's first part) put the few numbers
that matter apart from the bookkeeping (:func:`scalar_tag`): ``main/`` (training loss, samples/s,
the cache hit rate, validation and test AUC and log loss), ``cache/`` (the cache's other
counters), ``tables/`` (per-table counters), ``time/`` (durations: start-up, stalls),
``<split>/`` (an evaluation's other numbers), ``summary/``.  Values are float32 in the file;
metrics.jsonl stays the source of truth.  Each record is flushed as it is written, so
``tensorboard --logdir runs/`` shows a run live.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..console.readable import is_seconds

FILE_VERSION = "brain.Event:2"
EVENTS_GLOB = "events.out.tfevents.*"
_SKIP_FIELDS = {"kind", "time", "step", "split"}  # not scalars: the record's identity


# ------------------------------------------------------------------------------------ crc32c
def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord uses it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


# ------------------------------------------------------------------------------------ protobuf
def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64: two's complement, 10 bytes
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def scalar_value(tag: str, value: float) -> bytes:
    """Summary.Value {tag = 1; simple_value = 2 (float)}."""
    return _bytes_field(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", value)


def event(
    wall_time: float,
    step: int,
    *,
    file_version: str | None = None,
    scalars: list[tuple[str, float]] | None = None,
) -> bytes:
    """Event {wall_time = 1 (double); step = 2; file_version = 3 | summary = 5 {value = 1 ...}}."""
    out = _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _varint(2 << 3 | 0) + _varint(step)
    if file_version is not None:
        out += _bytes_field(3, file_version.encode())
    if scalars:
        out += _bytes_field(5, b"".join(_bytes_field(1, scalar_value(t, v)) for t, v in scalars))
    return out


# ------------------------------------------------------------------------------------ writing
# (record kind or split, field) -> its tag among the cards that matter
MAIN_TAGS = {
    ("train", "loss"): "main/loss",
    ("train", "samples_per_s"): "main/samples_per_s",
    ("train", "hit_rate"): "main/hit_rate",
    ("val", "auc"): "main/val_auc",
    ("val", "logloss"): "main/val_logloss",
    ("test", "auc"): "main/test_auc",
    ("test", "logloss"): "main/test_logloss",
}


def scalar_tag(prefix: str, field: str) -> str:
    """The tag of ``field`` of a record of kind (or evaluation split) ``prefix``."""
    if (prefix, field) in MAIN_TAGS:
        return MAIN_TAGS[prefix, field]
    if prefix == "summary":
        return f"summary/{field}"
    if "/" in field:  # hit_rate/C3, accesses/C3
        return f"tables/{field}"
    if is_seconds(field):
        return f"time/{field}"
    if prefix == "train" and field != "epoch":  # the embedding counters of the interval
        return f"cache/{field}"
    return f"{prefix}/{field}"


def record_scalars(record: dict[str, Any]) -> list[tuple[str, float]]:
    """The numbers of a metrics.jsonl record as (tag, value); strings, lists, dicts are left out."""
    prefix = str(record["split"]) if "split" in record else str(record.get("kind", "record"))
    return [
        (scalar_tag(prefix, k), float(v))
        for k, v in record.items()
        if k not in _SKIP_FIELDS and isinstance(v, (int, float)) and not isinstance(v, bool)
    ]


def record_step(record: dict[str, Any]) -> int:
    """The step a record's scalars are shown at (the summary: at the run's last step)."""
    return int(record.get("step", record.get("steps", 0)))


class TensorBoardLog:
    """Appends records to one new event file in ``directory`` (a resumed run starts another file;
    TensorBoard reads them all)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        stamp = f"{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        name = f"events.out.tfevents.{stamp}.dlrm-cache"
        self.path = Path(directory) / name
        self._append(tfrecord(event(time.time(), 0, file_version=FILE_VERSION)))

    def __call__(self, record: dict[str, Any]) -> None:
        scalars = record_scalars(record)
        if scalars:
            self._append(tfrecord(event(time.time(), record_step(record), scalars=scalars)))

    def _append(self, data: bytes) -> None:
        with open(self.path, "ab") as f:  # flushed per record: a live run is visible at once
            f.write(data)


def attach(log: Any, enabled: bool, run_dir: str | os.PathLike) -> None:
    """With ``enabled`` (``logger.tensorboard``), mirror every record ``log`` (train's metrics.jsonl
    writer) writes from now on into TensorBoard scalars beside it, only where ``log`` writes
    (rank 0)."""
    if enabled and log.enabled:
        log.sinks.append(TensorBoardLog(run_dir))


def cut_back(run_dir: str | os.PathLike, keep: int) -> None:
    """The event files in ``run_dir`` cut back to the scalars of the first ``keep`` records of its
    metrics.jsonl, as a resume cuts the log back to its checkpoint's records: the steps it redoes
    (or a branch replaces) are then shown once, as the log records them, not twice.

    Each event is matched, in file order, to the next record of the log that holds the same step
    and scalars; an event of a later record, or of none (cut from the log before), is dropped.
    Each file is rewritten whole under a temporary name: a kill leaves it as it was or cut.
    """
    from ..files.atomic import atomic_file
    from .records import logged_records

    files = sorted(Path(run_dir).glob(EVENTS_GLOB))
    if not files:
        return
    logged = enumerate(logged_records(Path(run_dir)))
    wanted = [(i, _record_key(r)) for i, r in logged if r is not None and record_scalars(r)]
    at = 0
    for path in files:
        bodies = list(read_records(path))
        kept = bodies[:1]  # the file_version event
        for body in bodies[1:]:
            key = _event_key(body)
            j = next((j for j in range(at, len(wanted)) if wanted[j][1] == key), None)
            if j is None:
                continue
            at = j + 1
            if wanted[j][0] < keep:
                kept.append(body)
        if len(kept) != len(bodies):
            with atomic_file(path, "wb") as f:
                f.write(b"".join(tfrecord(body) for body in kept))


def _record_key(record: dict[str, Any]) -> tuple[int, tuple[tuple[str, bytes], ...]]:
    """A record's step and scalars as its event stores them (float32 bytes)."""
    return record_step(record), tuple((t, _f32(v)) for t, v in record_scalars(record))


def _event_key(body: bytes) -> tuple[int, tuple[tuple[str, bytes], ...]]:
    step, scalars = 0, []
    for number, _wire, value in _fields(body):
        if number == 2:
            step = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 5:
            for n, _, v in _fields(value):
                if n == 1:
                    fields = {k: x for k, _, x in _fields(v)}
                    value = struct.unpack("<f", fields[2])[0]
                    scalars.append((fields[1].decode(), _f32(value)))
    return step, tuple(scalars)


def _f32(value: float) -> bytes:
    """A scalar as an event stores it; every NaN alike (the log writes each as null)."""
    return b"nan" if math.isnan(value) else struct.pack("<f", value)


# ------------------------------------------------------------------------------------ reading
@dataclass(frozen=True)
class Scalar:
    wall_time: float
    step: int
    tag: str
    value: float


def read_records(path: str | os.PathLike) -> Iterator[bytes]:
    """The TFRecords of a file, every CRC checked (ValueError names the file and offset)."""
    data = Path(path).read_bytes()
    at = 0
    while at < len(data):
        if at + 12 > len(data):
            raise ValueError(f"{path}: record at byte {at} is cut short")
        head = data[at : at + 8]
        (length,) = struct.unpack("<Q", head)
        (head_crc,) = struct.unpack("<I", data[at + 8 : at + 12])
        body = data[at + 12 : at + 12 + length]
        tail = data[at + 12 + length : at + 16 + length]
        if (
            head_crc != masked_crc32c(head)
            or len(tail) != 4
            or struct.unpack("<I", tail)[0] != masked_crc32c(body)
        ):
            raise ValueError(f"{path}: bad record at byte {at} (CRC mismatch or cut short)")
        yield body
        at += 16 + length


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a protobuf message: ints, 8/4-byte blobs, bytes."""
    at = 0
    while at < len(buf):
        key, at = _read_varint(buf, at)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, at = _read_varint(buf, at)
        elif wire == 1:
            value, at = buf[at : at + 8], at + 8
        elif wire == 5:
            value, at = buf[at : at + 4], at + 4
        elif wire == 2:
            n, at = _read_varint(buf, at)
            value, at = buf[at : at + n], at + n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def _read_varint(buf: bytes, at: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = buf[at]
        at += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, at


def read_scalars(path: str | os.PathLike) -> list[Scalar]:
    """Every scalar of an event file, in file order (the file_version record checked)."""
    out: list[Scalar] = []
    for k, body in enumerate(read_records(path)):
        wall_time, step, version, values = math.nan, 0, None, []
        for number, _wire, value in _fields(body):
            if number == 1:
                wall_time = struct.unpack("<d", value)[0]
            elif number == 2:
                step = value - (1 << 64) if value >= 1 << 63 else value
            elif number == 3:
                version = value.decode()
            elif number == 5:
                values += [v for n, _, v in _fields(value) if n == 1]
        if k == 0 and version != FILE_VERSION:
            raise ValueError(f"{path}: first record is not file_version {FILE_VERSION!r}")
        for v in values:
            fields = {n: x for n, _, x in _fields(v)}
            out.append(
                Scalar(wall_time, step, fields[1].decode(), struct.unpack("<f", fields[2])[0])
            )
    return out
