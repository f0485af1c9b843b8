"""`dlrm-cache bench`'s kinds of benchmark (one module each) and the command (:mod:`.run`)."""


class BenchFailed(RuntimeError):
    """Rows of the benchmark crashed, or none could run: the message says which and why."""
