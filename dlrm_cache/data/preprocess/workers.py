"""Where preprocessing's jobs run: worker processes on this machine, and ranks under torchrun.

Every stage is a list of independent jobs whose results come back in job order.  Under torchrun
rank r of W takes the r-th contiguous W-th of each list and the (small) results are all-gathered
over gloo, so every rank knows everything the next stage needs; the big arrays travel through
the build directory, which every rank must see (a shared file system).  On each machine the jobs
run in ``workers`` processes forked at the start (before any thread of ours exists); a worker
dies with its parent (``PR_SET_PDEATHSIG``), so a killed run leaves no process writing behind it.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _init_worker() -> None:
    # A forked worker inherits its parent's Python signal handlers (torch's elastic launcher, a
    # training run's stop handlers): the pool's terminate() must end it, whatever they are.
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, signal.SIG_DFL)
    try:  # Linux: SIGKILL this worker when its parent dies, even by SIGKILL
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass
    import pyarrow as pa

    pa.set_cpu_count(1)  # one core per worker: the workers are the parallelism


class Runner:
    """Runs jobs in ``workers`` local processes (1: in this process) on every rank of the job."""

    def __init__(self, workers: int) -> None:
        self.world, self.rank = (
            int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("RANK", "0")),
        )
        self._own_group = False  # the process group this runner made (and ends in close)
        if self.world > 1:
            import torch.distributed as dist

            if not dist.is_initialized():
                dist.init_process_group(backend="gloo")
                self._own_group = True
        self.workers = workers
        before = {p.pid for p in mp.active_children()}
        self.pool = (
            mp.get_context("fork").Pool(workers, initializer=_init_worker) if workers > 1 else None
        )
        self._workers = [p for p in mp.active_children() if p.pid not in before]

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _local(self, fn: Callable[[Any], Any], jobs: list) -> Iterator:
        if self.pool is None or len(jobs) <= 1:
            return map(fn, jobs)
        return self.pool.imap(fn, jobs)

    def mine(self, jobs: list) -> list:
        """This rank's share of ``jobs``: the rank-th contiguous world-th."""
        return jobs[len(jobs) * self.rank // self.world : len(jobs) * (self.rank + 1) // self.world]

    def map(
        self, fn: Callable[[Any], Any], jobs: list, done: Callable[[Any], None] | None = None
    ) -> list:
        """fn(job) for every job, on this rank's share; every rank gets all results, in job order.
        ``done`` is called with each of this rank's results as it arrives (progress)."""
        mine = []
        for result in self._local(fn, self.mine(jobs)):
            mine.append(result)
            if done is not None:
                done(result)
        return mine if self.world == 1 else [r for part in self.gather(mine) for r in part]

    def gather(self, obj: Any) -> list:
        """Every rank's ``obj``, in rank order (just ``[obj]`` without torchrun)."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def share(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        return self.gather(obj)[0]

    def close(self, failed: bool = False) -> None:
        if self.pool is not None:
            if failed:
                _terminate(
                    self.pool, self._workers
                )  # nothing keeps writing into a directory about to be removed
            else:
                self.pool.close()
                self.pool.join()
            self.pool = None
        if self._own_group:  # gloo's threads must not outlive the interpreter (it aborts at exit)
            import torch.distributed as dist

            dist.destroy_process_group()
            self._own_group = False


TERMINATE_WAIT_S = 30.0


def _terminate(pool: Any, workers: list) -> None:
    """``pool.terminate()`` and its join, waited for at most :data:`TERMINATE_WAIT_S`, then the
    workers killed: CPython's clean-up of a pool whose ``imap`` was left mid-way can block before
    it signals the workers (draining a queue whose lock a dead worker holds), which hung a failed
    preprocess for good.  Only the pool's daemon threads may outlive the wait."""
    import threading

    ender = threading.Thread(target=lambda: (pool.terminate(), pool.join()), daemon=True)
    ender.start()
    ender.join(TERMINATE_WAIT_S)
    if ender.is_alive():
        for w in workers:
            w.kill()
            w.join()


def star(args: Iterable) -> Any:
    """Calls ``args[0](*args[1:])`` (pool jobs are (function, arguments...) tuples)."""
    fn, *rest = args
    return fn(*rest)
