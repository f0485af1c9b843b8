"""`dlrm-cache bench`'s kinds of benchmark (one module each) and their runner (:mod:`.run`).

May import every library layer below it (`config/` ... `train/`, `plots/`); only `commands/`
imports it.
"""


class BenchFailed(RuntimeError):
    """Rows of the benchmark crashed, or none could run: the message says which and why."""
