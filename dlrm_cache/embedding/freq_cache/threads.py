"""The planner's host threads: the few whole-batch host passes that are worth splitting.

The planner places batches on the host; gathering missing rows into staging and scattering
written-back rows into the store are memory-bound passes over scattered rows, and run faster split
over a few threads (numpy and torch release the interpreter lock inside them).  ``threads=1`` runs
everything on the calling thread (a CPU device's inline planner, whose step already uses every
core).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

# below this many items a pass is not split (a thread hand-off costs more than it saves)
MIN_SPLIT = 4096


class HostThreads:
    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"embedding.planner_threads={threads}: must be >= 1")
        self.threads = int(threads)
        self._pool = (
            ThreadPoolExecutor(self.threads - 1, thread_name_prefix="freq_cache-host")
            if self.threads > 1
            else None
        )

    def split(self, n: int, part: Callable[[int, int], object]) -> None:
        """``part(a, b)`` over ``[0, n)`` in up to ``threads`` contiguous pieces, one of them on
        the calling thread; returns when all are done (a piece's exception is raised)."""
        pool = self._pool
        k = min(self.threads, n // MIN_SPLIT) if pool is not None else 1
        if pool is None or k <= 1:
            part(0, n)
            return
        bounds = [n * i // k for i in range(k + 1)]
        futures = [pool.submit(part, a, b) for a, b in zip(bounds[1:-1], bounds[2:])]
        part(bounds[0], bounds[1])
        for f in futures:
            f.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
