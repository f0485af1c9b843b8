"""The rates ``EmbeddingBackend.stats()`` reports, and the count each is a fraction of.

A rate is reported beside its count (``hit_rate/C3`` beside ``accesses/C3``) and left out where
the count is 0, so that the rates of several intervals (or ranks) add up weighted by what they
count: train/metrics.py's ``StatsTotals`` does, ``report`` does for its per-table means.
"""

from __future__ import annotations

# rate -> the count it is a fraction of; ``<rate>/<table>`` is a fraction of ``<count>/<table>``
RATE_WEIGHTS: dict[str, str] = {"hit_rate": "accesses", "hit_rate_distinct": "distinct_ids"}


def is_rate(key: str) -> bool:
    """Whether a stats key is a rate (``hit_rate``, ``hit_rate/C3``)."""
    return key.split("/", 1)[0] in RATE_WEIGHTS


def rate_weight_key(key: str) -> str:
    """The count a rate is a fraction of: ``hit_rate/C3`` -> ``accesses/C3``."""
    rate, sep, table = key.partition("/")
    return RATE_WEIGHTS[rate] + sep + table
