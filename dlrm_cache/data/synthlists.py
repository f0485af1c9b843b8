"""Multi-hot features of `dlrm-cache synth`: how many ids a sample carries, what the click model
makes of a list, and how a list is written.

``multi_hot_sizes`` gives each feature its mean list length ``s`` (``mlperf``: MLPerf DLRM v2's
sizes, :data:`..format.MLPERF_MULTI_HOT_SIZES`; empty, the default: every feature one-hot, and
the output is the generator's without lists, byte for byte).  A feature with ``s > 1`` is
multi-hot: a present field holds ``s`` ids (``multi_hot_lengths=fixed``, as MLPerf's synthetic
set) or a length uniform on ``1 .. 2s-1`` (``uniform``, mean ``s``); each id is drawn
independently from the feature's popularity; a missing field (``missing_rate``) is an empty list.
The field is written as the ids' hex spellings joined by :data:`LIST_SEPARATOR` (an empty list:
an empty field).

The click model sees a list through the *mean* of its ids' per-id effects and the mean of their
interaction vectors; an empty list counts as the empty value (its own effect, as a missing
one-hot field).  The planted (C1, C2) cross is the mean of the pair effect over every pair of
their ids.  Every id of a list therefore moves the oracle's score, and the oracle stays the
ceiling (it is the noise-free logit of the features written).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..embedding.jagged import starts, take_lists
from .format import NUM_SPARSE
from .multihot import parse_sizes
from .rawtext import MAX_LINE_BYTES
from .schema import LIST_SEPARATOR

_ID_BYTES = 9  # a list's id in synth's text: 8 hex digits and a separator


def list_sizes(cfg: Any) -> list[int]:
    """Mean ids per sample of every feature (1: one-hot) from ``cfg.multi_hot_sizes``; sizes
    whose lines would be longer than preprocess reads (:data:`.rawtext.MAX_LINE_BYTES`; an id is
    8 hex digits and a separator) are refused: every line would be skipped as too long."""
    sizes = parse_sizes(cfg.multi_hot_sizes, NUM_SPARSE)
    line = _ID_BYTES * sum(sizes)
    if line > MAX_LINE_BYTES:
        raise ValueError(
            f"multi_hot_sizes: {sum(sizes):,} ids a line make lines of about {line:,} bytes, "
            f"over the {MAX_LINE_BYTES:,} preprocess reads; give smaller sizes"
        )
    return sizes


def draw_list(
    rng: np.random.Generator, cdf: np.ndarray, n: int, size: int, kind: str, missing_rate: float
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` lists of one feature: offsets ``[n + 1]`` and popularity ranks."""
    if kind == "fixed":
        lengths = np.full(n, size, np.int64)
    else:
        lengths = rng.integers(1, 2 * size, n)
    lengths[rng.random(n) < missing_rate] = 0
    o = starts(lengths)
    ranks = np.minimum(np.searchsorted(cdf, rng.random(int(o[-1])), side="right"), len(cdf) - 1)
    return o, ranks.astype(np.int32)


def model_ids(offsets: np.ndarray, ranks: np.ndarray, empty: int) -> tuple[np.ndarray, np.ndarray]:
    """The lists as the click model indexes them: an empty list becomes ``[empty]`` (the empty
    value's index)."""
    lengths = np.diff(offsets)
    fill = np.flatnonzero(lengths == 0)
    if not len(fill):
        return offsets, ranks
    ranks = np.insert(ranks, offsets[fill], empty)
    return starts(np.maximum(lengths, 1)), ranks


def mean_rows(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per list (none empty), the mean of its rows of ``values`` (1-d or 2-d, float)."""
    lengths = np.diff(offsets)
    sums = np.add.reduceat(values, offsets[:-1], axis=0)
    return sums / (lengths[:, None] if values.ndim == 2 else lengths)


def mean_pairs(
    a: tuple[np.ndarray, np.ndarray],
    b: tuple[np.ndarray, np.ndarray],
    effect: Callable[[np.ndarray, np.ndarray], np.ndarray],
) -> np.ndarray:
    """Per sample, the mean of ``effect(x, y)`` over every pair of its ids ``x`` of list ``a`` and
    ``y`` of list ``b`` (lists as offsets and ids, none empty)."""
    (ao, av), (bo, bv) = a, b
    la = np.diff(ao)
    row_of_a = np.repeat(np.arange(len(la)), la)
    lb, b_of_a = take_lists(bo, bv, row_of_a)  # each id of a, with its sample's list of b
    pairs = effect(np.repeat(av, lb), b_of_a)
    sums = np.bincount(np.repeat(row_of_a, lb), weights=pairs, minlength=len(la))
    return sums / (la * np.diff(bo))


def list_text(hex_ids: pa.Array, offsets: np.ndarray, ranks: np.ndarray) -> pa.Array:
    """The field's text per sample: its ids' hex spellings joined by :data:`LIST_SEPARATOR`."""
    lists = pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), hex_ids.take(pa.array(ranks))
    )
    return pc.binary_join(lists, LIST_SEPARATOR)
