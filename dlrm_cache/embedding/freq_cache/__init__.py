"""Frequency-aware embedding cache: full tables in host memory, the hot rows on the device.

Imports what `embedding/` may (`config/`, `concurrency/`) and its siblings there.
"""

from .backend import FreqCacheBackend
from .layout import plan_table, predict_hit_rate

__all__ = ["FreqCacheBackend", "plan_table", "predict_hit_rate"]
