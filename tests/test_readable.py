"""How the console tables and report.md write a summary's values (dlrm_cache/console/readable.py)."""

from __future__ import annotations

from dlrm_cache.console.readable import format_value


def test_a_rate_per_second_is_written_alike_below_and_above_1000():
    """One run's summary showed ``train_samples_per_s`` as 684.1062, another's as 1,404."""
    assert format_value("train_samples_per_s", 684.1062) == "684"
    assert format_value("train_samples_per_s", 1404.4) == "1,404"
    assert format_value("val_auc", 0.81234567) == "0.8123"  # a fraction keeps its decimals
