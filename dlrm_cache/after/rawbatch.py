"""Blocks of raw input's good lines (:class:`~.rawinput.Rows`) -> the model's batches, each of
exactly ``batch_size`` rows (the last one: the rest).

A batch has the layout the loader gives the processed split of the same dataset, built by the
loader's own code: one id per sample and feature in :class:`~..data.batch.OneIdPerSample`'s KJT; a
multi-hot dataset's jagged columns (every feature a list, :class:`~..data.lists.Lists`) joined and
sliced as the loader slices a shard's (:func:`~..data.lists.concat_columns`) and put into one KJT by
:func:`~..embedding.jagged.assemble`, moved by :class:`~..embedding.jagged.JaggedLayout`.  numpy over whole columns, no
loop per row, so a line scores as the same line does after `preprocess`.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from ..data.batch import Batch, OneIdPerSample
from ..data.lists import Lists, concat_columns
from ..embedding.jagged import JaggedLayout, assemble, starts
from .rawinput import Rows

# (line numbers, the batch, which rows have a label: None = all of them or none)
Indexed = tuple[np.ndarray, Batch, np.ndarray | None]


class Batcher:
    """Batches of a dataset's features ``keys`` from :class:`Rows`."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = list(keys)
        self.one_id = OneIdPerSample(self.keys)
        self.jagged = JaggedLayout(self.keys)

    def rebatch(self, rows: Iterator[Rows], batch_size: int) -> Iterator[Indexed]:
        """Blocks of good lines -> batches of exactly ``batch_size`` (the last one: the rest)."""
        pending: list[Rows] = []
        have = 0
        for r in rows:
            pending.append(r)
            have += len(r.lines)
            if have < batch_size:
                continue
            joined = join(pending)
            full = have - have % batch_size
            for lo in range(0, full, batch_size):
                yield self.batch(joined, lo, lo + batch_size)
            pending = [cut(joined, full, have)] if full < have else []
            have -= full
        if have:
            yield self.batch(join(pending), 0, have)

    def batch(self, r: Rows, lo: int, hi: int) -> Indexed:
        """Rows ``[lo, hi)`` of ``r`` as a batch, with their line numbers and known labels."""
        dense = torch.from_numpy(np.ascontiguousarray(r.dense[:, lo:hi].T))
        labels = (
            torch.from_numpy(r.labels[lo:hi].copy())
            if r.labels is not None
            else torch.zeros(hi - lo)
        )
        known = None if r.labelled is None or r.labelled[lo:hi].all() else r.labelled[lo:hi]
        if isinstance(r.ids, Lists):  # a multi-hot dataset: the loader's jagged KJT
            dtype = r.ids.values[0].dtype
            columns = concat_columns([r.ids.rows(lo, hi)], len(self.keys), dtype)
            kjt = assemble(self.keys, columns, hi - lo, dtype, pin=False)
            return r.lines[lo:hi], Batch(dense, kjt, labels, layout=self.jagged), known
        ids = torch.from_numpy(np.ascontiguousarray(r.ids[:, lo:hi]))
        return r.lines[lo:hi], self.one_id.batch(dense, ids, labels), known


def join(parts: list[Rows]) -> Rows:
    """Consecutive blocks as one (jagged columns concatenated, their offsets rebuilt)."""
    if len(parts) == 1:
        return parts[0]
    labels = None if parts[0].labels is None else np.concatenate([p.labels for p in parts])
    labelled = None
    if any(p.labelled is not None for p in parts):
        labelled = np.concatenate(
            [p.labelled if p.labelled is not None else np.ones(len(p.lines), bool) for p in parts]
        )
    ids: np.ndarray | Lists
    first = parts[0].ids
    if isinstance(first, Lists):
        pieces: list[Lists] = [p.ids for p in parts]  # type: ignore[misc]  # all of one kind
        columns = concat_columns(pieces, len(first.values), first.values[0].dtype)
        ids = Lists([starts(lengths) for lengths, _ in columns], [v for _, v in columns])
    else:
        ids = np.concatenate([p.ids for p in parts], axis=1)
    return Rows(
        np.concatenate([p.lines for p in parts]),
        labels,
        np.concatenate([p.dense for p in parts], axis=1),
        ids,
        labelled,
    )


def cut(r: Rows, lo: int, hi: int) -> Rows:
    """Rows ``[lo, hi)`` of ``r`` (views)."""
    return Rows(
        r.lines[lo:hi],
        None if r.labels is None else r.labels[lo:hi],
        r.dense[:, lo:hi],
        r.ids.rows(lo, hi) if isinstance(r.ids, Lists) else r.ids[:, lo:hi],
        None if r.labelled is None else r.labelled[lo:hi],
    )
