"""The cache's layout, and hit-rate predictions from dataset counts.

``cache_layout`` is the one function that decides how many slots the freq_cache has, how many of
them are static and how many form the window (dynamic) region; the backend, ``dlrm-cache plan`` and
``dlrm-cache report``'s predictions all call it, so they cannot disagree.  (The sharding planner,
parallel/placement.py, balances shards by the ratio's share alone: ``cache_rows_for``.)

The hit rate of the cache as built (:func:`pooled_hit_rates`): the static region serves every
access to its rows.  Its slots pooled over all tables (see backend.py), the dynamic region under the
``freq`` policy keeps the hottest non-static rows of all tables that the window leaves room for,
and the rest of it holds the cold rows of the batches in flight, which a batch finds resident when
a recent batch used them.  ``plan_table``'s ``hit_rate_per_table_caches`` is what separate caches,
each table holding its own share of the same slots, would get (top-k per table): what pooling gains.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

# Window region margin over the expected distinct rows of the window's batches, in standard
# deviations (the count of distinct rows among independent draws has variance below its mean).
WINDOW_SIGMAS = 4.0
# The window region's sets are filled to at most this share by the rows pinned at once: a row
# may only go to its own set (sets.py), and at half of 64 ways a set overflows (the round waits
# for a retirement) in about one round in ten thousand at Criteo sizes.
SET_LOAD = 0.5


def round_batches(lookahead: int) -> int:
    """Batches placed per round (window.py): two when the trainer looks at least two ahead."""
    return 2 if lookahead >= 2 else 1


def pinned_batches(lookahead: int) -> int:
    """Batches whose rows are pinned at once at most: the step's, the look-ahead's and, with
    rounds of two, the one whose round-mate is still ahead."""
    return lookahead + round_batches(lookahead)


def _as_counts(counts) -> np.ndarray:
    c = counts.detach().cpu().numpy() if hasattr(counts, "detach") else np.asarray(counts)
    return c.astype(np.float64, copy=False).reshape(-1)


def predict_hit_rate(counts, cache_rows: int) -> float:
    """Fraction of all accesses that go to the ``cache_rows`` most frequent rows."""
    c = _as_counts(counts)
    total = c.sum()
    if total <= 0 or cache_rows <= 0:
        return 0.0
    k = min(int(cache_rows), c.size)
    top = np.partition(c, c.size - k)[c.size - k :] if k < c.size else c
    return float(top.sum() / total)


def cache_rows_for(num_rows: int, ratio: float) -> int:
    """The slots a table (or shard) of ``num_rows`` contributes to the cache at ``ratio``.

    The epsilon keeps float noise from adding a slot (``0.07 * 100`` is ``7.000000000000001``)."""
    return min(num_rows, max(1, math.ceil(ratio * num_rows - 1e-9)))


@dataclasses.dataclass(frozen=True)
class CacheLayout:
    """Slots of a freq_cache: ``[0, num_static)`` static (table ``t``'s hottest ``static_rows[t]``
    rows at ``static_offsets[t] + rank``), then ``window_rows`` dynamic slots for the look-ahead
    window and the eviction policy."""

    ratio_rows: np.ndarray  # per table: the slots ``cache_ratio`` gives it (cache_rows_for)
    static_rows: np.ndarray  # per table: its rows in the static region
    window_rows: int  # the dynamic region
    window_needed: int  # estimated distinct non-static rows of lookahead+1 batches (0: not sized)

    @property
    def num_static(self) -> int:
        return int(self.static_rows.sum())

    @property
    def num_slots(self) -> int:
        return self.num_static + self.window_rows

    @property
    def static_offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.static_rows)[:-1]]).astype(np.int64)

    @property
    def added_rows(self) -> int:
        """Slots beyond the ratio's, added so that the window fits."""
        return self.num_slots - int(self.ratio_rows.sum())


def ids_per_sample(counts: Sequence[np.ndarray] | None, samples: int, tables: int) -> np.ndarray:
    """Per table, the mean number of ids a sample carries: its counted accesses over the
    ``samples`` they were counted in (a multi-hot feature's lists count every id); 1 for every
    table where that is unknown (``samples=0`` or no counts: one id per sample, as one-hot)."""
    if counts is None or samples <= 0:
        return np.ones(tables)
    return np.array([_as_counts(c).sum() / samples for c in counts])


def expected_window_rows(
    rows: Sequence[int] | np.ndarray,
    static_rows: Sequence[int] | np.ndarray,
    counts: Sequence[np.ndarray] | None,
    draws: Sequence[float] | np.ndarray,
) -> int:
    """Distinct non-static rows among ``draws[t]`` ids of each table ``t`` (a batch's samples
    times the table's ids per sample, drawn by the dataset's frequencies, with or without
    replacement), plus a margin of ``WINDOW_SIGMAS`` standard deviations.  Without counts: the
    bound ``min(non-static rows, draws)`` per table."""
    mean = var = 0.0
    for t, n in enumerate(rows):
        c = None if counts is None else _as_counts(counts[t])
        if c is None or c.sum() <= 0:
            mean += min(n - static_rows[t], math.ceil(draws[t]))
            continue
        # P(row among the draws): i.i.d. draws by frequency give 1 - (1 - c/N)^draws; draws without
        # replacement from the N accesses counted (an epoch over the dataset) give about
        # 1 - (1 - draws/N)^c, which is higher for rows counted fewer than ``draws`` times.  The
        # larger of the two, so the estimate holds for both.
        total = c.sum()
        rest = c[static_rows[t] :]
        iid = _draw_probability(rest / total, draws[t])
        epoch = -np.expm1(rest * np.log1p(-min(draws[t] / total, 1.0 - 1e-12)))
        seen = np.maximum(iid, epoch)
        mean += float(seen.sum())
        var += float((seen * (1.0 - seen)).sum())
    return int(math.ceil(mean + WINDOW_SIGMAS * math.sqrt(var)))


def cache_layout(
    rows: Sequence[int] | np.ndarray,
    ratio: float,
    static_fraction: float = 0.5,
    counts: Sequence[np.ndarray] | None = None,
    global_static: bool = True,
    lookahead: int = 0,
    batch_size: int = 0,
    samples: int = 0,
) -> CacheLayout:
    """The freq_cache's slots for tables of ``rows`` at ``cache_ratio``.

    Static region: ``static_fraction`` of the ratio's slots.  With ``counts`` and ``global_static``
    (the freq policy) they hold the globally hottest rows (rows are frequency ranks, so a prefix of
    each table); otherwise each table gets ``static_fraction`` of its own share.

    Window region: the rest of the ratio's slots -- but at least twice (:data:`SET_LOAD`) the
    distinct non-static rows of :func:`pinned_batches` batches of ``batch_size`` samples (all
    pinned at once while the trainer prefetches), estimated from ``counts``, each table drawing
    its ids per sample (:func:`ids_per_sample` of the ``samples`` counted); slots are added when
    the ratio leaves fewer.
    ``batch_size=0``: no sizing (the window gets what the ratio leaves; batches that do not fit
    are deferred, or overflow).
    """
    rows_a = np.asarray(rows, dtype=np.int64)
    ratio_rows = np.array([cache_rows_for(int(n), ratio) for n in rows_a], dtype=np.int64)
    num_slots = int(ratio_rows.sum())
    num_static = int(math.floor(static_fraction * num_slots))
    if counts is not None and global_static and num_static > 0:
        flat = np.concatenate([_as_counts(c) for c in counts])
        top = np.argpartition(-flat, num_static - 1)[:num_static]
        row_off = np.concatenate([[0], np.cumsum(rows_a)])
        static_rows = np.bincount(
            np.searchsorted(row_off, top, side="right") - 1, minlength=len(rows_a)
        )
    else:
        static_rows = np.floor(static_fraction * ratio_rows).astype(np.int64)
    static_rows = static_rows.astype(np.int64)
    window = num_slots - int(static_rows.sum())
    needed = 0
    sized = window
    if batch_size > 0:
        per = ids_per_sample(counts, samples, len(rows_a))
        needed = expected_window_rows(
            rows_a, static_rows, counts, pinned_batches(lookahead) * batch_size * per
        )
        dynamic_rows = int((rows_a - static_rows).sum())
        needed = min(needed, dynamic_rows)
        sized = max(window, min(math.ceil(needed / SET_LOAD), dynamic_rows))
    return CacheLayout(ratio_rows, static_rows, sized, needed)


def _draw_probability(p: np.ndarray, draws: float | np.ndarray) -> np.ndarray:
    """P(a row of per-draw probability ``p`` is drawn at least once in ``draws`` draws)."""
    return -np.expm1(draws * np.log1p(-np.minimum(p, 1.0 - 1e-12)))


def pooled_hit_rates(
    counts: Sequence[np.ndarray],
    layout: CacheLayout,
    lookahead: int,
    batch_size: int,
    samples: int = 0,
) -> np.ndarray:
    """Per table: the expected share of its accesses the freq_cache of ``layout`` serves from its
    slots, on batches of ``batch_size`` samples drawn by ``counts``, each table's ids per sample
    from the ``samples`` the counts were counted over (:func:`ids_per_sample`; every id of a
    multi-hot list is an access).

    The model of the cache as built: the static region serves its rows.  In the dynamic region,
    the :func:`pinned_batches` batches in flight pin their rows, so it holds ``P`` persistent rows (the
    hottest non-static rows over all tables: the ``freq`` policy evicts the lowest counts first)
    plus the expected distinct colder rows of those batches, with ``P`` the largest that fits in
    ``window_rows``.  A colder row is resident before a batch is placed when one of the
    :func:`pinned_batches` batches placed before it used it (their rows are the window's, evicted only
    as later batches need the slots).  ``batch_size=0`` (no sizing): the window holds no cold rows.
    """
    cold = [_as_counts(c)[s:] for c, s in zip(counts, layout.static_rows)]
    p = np.concatenate([c / max(_as_counts(a).sum(), 1.0) for c, a in zip(cold, counts)])
    order = np.argsort(-np.concatenate(cold), kind="stable")  # the freq policy's ranking
    per = ids_per_sample(counts, samples, len(counts))
    draws = np.repeat(pinned_batches(lookahead) * batch_size * per, [c.size for c in cold])
    in_flight = _draw_probability(p[order], draws[order])
    # room[P]: persistent rows P plus the expected distinct in-flight rows outside them
    room = np.arange(order.size + 1) + np.concatenate([np.cumsum(in_flight[::-1])[::-1], [0.0]])
    persistent = int(np.searchsorted(room, layout.window_rows, side="right")) - 1
    resident = np.ones(order.size)
    resident[order[max(persistent, 0) :]] = in_flight[max(persistent, 0) :]
    out = np.zeros(len(counts))
    start = 0
    for t, (c, a) in enumerate(zip(cold, counts)):
        total = _as_counts(a).sum()
        if total > 0:
            served = total - c.sum() + float((c * resident[start : start + c.size]).sum())
            out[t] = served / total
        start += c.size
    return out


def plan_table(
    counts_by_table: Mapping[str, object],
    ratios: Sequence[float],
    static_fraction: float = 0.5,
    lookahead: int = 0,
    batch_size: int = 0,
    samples: int = 0,
) -> list[dict]:
    """One dict per ratio (``samples``: what the counts were counted over, see
    :func:`pooled_hit_rates`): ``ratio``, ``cache_rows`` (all slots, window sizing included),
    ``static_rows``, ``window_rows``, ``window_needed``, ``added_rows`` (see ``cache_layout``, the
    freq policy's layout), ``hit_rate`` and ``per_table`` {name: hit rate} (the pooled cache as
    built, :func:`pooled_hit_rates`; ``hit_rate`` weighs the tables by their accesses) and
    ``hit_rate_per_table_caches`` (the same slots as separate top-k caches, each table holding its
    own share: what pooling them gains)."""
    tables = {name: _as_counts(c) for name, c in counts_by_table.items()}
    totals = np.array([c.sum() for c in tables.values()])
    out = []
    for r in ratios:
        if not 0 < r <= 1:
            raise ValueError(f"cache ratio {r}: must be in (0, 1]")
        layout = cache_layout(
            [c.size for c in tables.values()],
            r,
            static_fraction,
            list(tables.values()),
            lookahead=lookahead,
            batch_size=batch_size,
            samples=samples,
        )
        pooled = pooled_hit_rates(list(tables.values()), layout, lookahead, batch_size, samples)
        # the per-table alternative at the same memory: the ratio scaled by the slots the window sizing
        # added (without them, each table's own share of the ratio)
        effective = min(1.0, r * layout.num_slots / max(1, int(layout.ratio_rows.sum())))
        separate = [predict_hit_rate(c, cache_rows_for(c.size, effective)) for c in tables.values()]
        out.append(
            dict(
                ratio=float(r),
                cache_rows=layout.num_slots,
                static_rows=layout.num_static,
                window_rows=layout.window_rows,
                window_needed=layout.window_needed,
                added_rows=layout.added_rows,
                hit_rate=_weighted(pooled, totals),
                hit_rate_per_table_caches=_weighted(np.array(separate), totals),
                per_table={n: float(h) for n, h in zip(tables, pooled)},
            )
        )
    return out


def _weighted(rates: np.ndarray, accesses: np.ndarray) -> float:
    total = accesses.sum()
    return float((rates * accesses).sum() / total) if total > 0 else 0.0
