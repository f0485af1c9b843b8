"""Background iteration: one helper that runs an iterator ahead of its consumer on a thread.

Used wherever producing items (decoding shards, generating synthetic text, analysing batches)
should overlap consuming them.  numpy, pyarrow and torch release the GIL in their kernels, so a
thread is enough; items always come out in the producer's order.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor


class Prefetcher:
    """Runs an iterator in a background thread, ``depth`` items ahead (decode overlaps training).

    ``transform`` (work on each item, e.g. encoding a block of text) runs on ``workers`` threads, items
    still coming out in order: numpy and torch release the GIL, so at large batches this keeps the
    loader ahead of a fast device.
    """

    _END = object()

    def __init__(
        self,
        it: Iterator,
        depth: int = 4,
        transform: Callable | None = None,
        workers: int = 1,
    ) -> None:
        self._q: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._transform = transform
        self._workers = max(1, workers)
        self._thread = threading.Thread(target=self._run, args=(it,), daemon=True)
        self._thread.start()

    def _finish(self, item):
        return item if self._transform is None else self._transform(item)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, it: Iterator) -> None:
        pool = ThreadPoolExecutor(self._workers) if self._workers > 1 else None
        pending: deque = deque()
        try:
            for item in it:
                if pool is None:
                    if not self._put(self._finish(item)):
                        return
                    continue
                pending.append(pool.submit(self._finish, item))
                if len(pending) >= self._workers and not self._put(pending.popleft().result()):
                    return
            while pending:
                if not self._put(pending.popleft().result()):
                    return
            self._q.put(self._END)
        except BaseException as e:  # surfaced in the consumer, with its traceback
            self._q.put(e)
        finally:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self):
        item = self._q.get()
        if item is self._END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._q.get(timeout=0.1)
            except queue.Empty:
                pass
