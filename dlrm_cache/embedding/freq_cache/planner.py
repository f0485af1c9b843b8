"""The cache's own thread: every placement decision runs here, beside the training step.

Where the device has streams (``Streams.asynchronous``: a GPU), the tasks run on a thread of their
own.  Without streams (a CPU device) they run inline, on the posting thread, in the same order and
under the same contexts: there the step's intra-op threads already keep every core busy, so a
second thread has no idle core to overlap on, and its bursts preempt an intra-op worker that the
step's next parallel region then waits for (docs/benchmarks.md has the measurement).

The training thread posts tasks (a prefetched batch, a retirement with the compute stream's event,
a demand for a batch it is about to forward) and, with the thread, returns at once; the planner
runs them in the order posted, with the copy stream current, under ``torch.no_grad()``.  Its host
work is numpy and torch CPU ops, which release the interpreter lock, so on a GPU the cache's
planning and row transfers overlap the step.
``call`` runs a task and waits for it (and so for every task posted before
it): flush, export, import, stats and cancellation go through it, and while the training thread
waits in ``call`` or right after it, the planner is idle and owns nothing.

A failure in a posted task is raised by the next ``post`` or ``call`` on the training thread.
What one thread knows to have finished on the device travels with its tasks and results
(``Streams.host_knowledge``; only the tests' recorder tracks it).
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from ...concurrency.streams import Streams

_live: weakref.WeakSet[Planner] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    """Let every planner finish its task before the interpreter goes (a daemon thread inside a
    torch op at exit aborts the process)."""
    for planner in list(_live):
        planner.close()
        if planner._thread is not None:
            planner._thread.join(timeout=60)


class Planner:
    def __init__(
        self,
        streams: Streams,
        device: torch.device,
        name: str = "freq_cache-planner",
        threaded: bool | None = None,
    ) -> None:
        """``threaded``: run tasks on a thread of their own (default: where ``streams`` are
        asynchronous)."""
        self.streams = streams
        if device.type == "cuda" and device.index is None:  # the thread's device: the caller's
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._dead: BaseException | None = None  # the thread's own set-up failed
        self.name = name
        self.threaded = streams.asynchronous if threaded is None else threaded
        self._thread: threading.Thread | None = None
        if self.threaded:
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()
            _live.add(self)

    def _run(self) -> None:
        st = self.streams
        setup = contextlib.ExitStack()
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            for context in (st.thread_setup(), st.use(st.copy), torch.no_grad()):
                setup.enter_context(context)
        except BaseException as e:  # every task fails with it, and ``wait`` raises it
            self._dead = e
        with setup:
            while True:
                task = self._tasks.get()
                if task is None:
                    return
                fn, args, future, knowledge = task
                st.learn(knowledge)
                try:
                    if self._dead is not None:
                        raise RuntimeError(
                            f"the {self.name} thread failed to start"
                        ) from self._dead
                    result = fn(*args)
                except BaseException as e:  # surfaced on the training thread
                    if future is not None:
                        future.set_exception(e)
                    elif self._error is None:
                        self._error = e
                    continue
                if future is not None:
                    future.set_result((result, st.host_knowledge()))

    def wait(self, event: threading.Event) -> None:
        """Wait for ``event``, which a posted task sets; raise if the thread failed to start
        (its tasks then only fail: the event would never be set)."""
        while not event.wait(timeout=1.0):
            if self._dead is not None:
                raise RuntimeError(f"the {self.name} thread failed to start") from self._dead

    def _raise_pending(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _inline(self, fn: Callable[..., Any], args: tuple) -> Any:
        st = self.streams
        with st.use(st.copy), torch.no_grad():
            return fn(*args)

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the planner, after the tasks posted so far; with the thread, do
        not wait (inline, it has run on return)."""
        self._raise_pending()
        if not self.threaded:
            try:
                self._inline(fn, args)
            except Exception as e:  # raised by the next post or call, as from the thread
                self._error = e  # (an interrupt or exit goes through at once)
            return
        self._tasks.put((fn, args, None, self.streams.host_knowledge()))

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the planner after the tasks posted so far; its result."""
        self._raise_pending()
        if not self.threaded:
            return self._inline(fn, args)
        future: Future = Future()
        self._tasks.put((fn, args, future, self.streams.host_knowledge()))
        result, knowledge = future.result()
        self.streams.learn(knowledge)
        self._raise_pending()
        return result

    def close(self) -> None:
        self._tasks.put(None)
