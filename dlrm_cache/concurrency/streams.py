"""Stream operations of one device, behind one small interface.

The input pipeline and the freq_cache order their work on a GPU with streams and events; every
such operation goes through a :class:`Streams` object, never through ``torch.cuda`` directly:

* :class:`CudaStreams` issues them (a CUDA device);
* :class:`InlineStreams` makes them no-ops (the CPU: every operation runs in order as issued);
* the test suite swaps in a recorder (tests/streams/stream_harness.py) that attributes every aten
  op to the stream it was issued on (or to the host, inside ``on_host``), turns waits and events
  into happens-before edges, and checks on the CPU what a GPU would do: which work a host read
  waits for, unsynchronized cross-stream accesses, tensors used on a stream they were not
  allocated on without ``record_stream``, device work touching host memory.

:func:`streams_for` returns one object per device, so the pipeline and the cache share their
streams.  Stream roles (see docs/freq-cache.md, "Stream protocol"):

* ``compute``: the training thread's current stream (forward, backward, optimizer);
* ``input``: host-to-device copies of batches (waits for nothing);
* ``plan``: the cache's placement decisions (its lookups, victims, the lookup indices), which
  wait only for the batches' input copies, so the planner's reads of its own results never wait
  for the step;
* ``copy``: the cache's row transfers and its one scatter and gather per round (waits for events
  recorded on ``compute`` after the backward that last used the slots it overwrites).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch


class Streams:
    """The stream operations the pipeline and the cache use (no-ops here: the CPU).

    ``asynchronous``: whether work issued on a stream may still be running when the call returns
    (then the pipeline copies batches on ``input`` and the cache hands tensors across streams).
    """

    asynchronous = False

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.compute = self.current_stream()
        self.input = self.new_stream("input")
        self.plan = self.new_stream("plan")
        self.copy = self.new_stream("copy")

    # -- streams ---------------------------------------------------------------------------
    def new_stream(self, name: str, priority: int = 0) -> Any:
        return None

    def current_stream(self) -> Any:
        return None

    def use(self, stream: Any) -> contextlib.AbstractContextManager:
        """``stream`` is the calling thread's current stream inside the ``with`` block."""
        return contextlib.nullcontext()

    def on_host(self) -> contextlib.AbstractContextManager:
        """Work inside the block is on host tensors only (it would not touch a GPU): the tests'
        recorder attributes it to no stream, and its reads wait for no device work."""
        return contextlib.nullcontext()

    def thread_setup(self) -> contextlib.AbstractContextManager:
        """Entered by every thread (other than the main one) that issues device work."""
        return contextlib.nullcontext()

    # -- host memory -----------------------------------------------------------------------
    def pinned(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised staging buffer: host memory that copies on a stream read or write
        asynchronously (page-locked under CUDA).  The host fills or reads it only when the
        copies that use it are known to be done; no kernel touches it, only copies."""
        return torch.empty(shape, dtype=dtype)

    def host_resident(self, tensor: torch.Tensor) -> None:
        """Declares that ``tensor`` lives in host memory (the cache's host store): only host
        work (``on_host``) touches it; rows reach the device through staging buffers."""

    # -- ordering --------------------------------------------------------------------------
    def wait_stream(self, waiter: Any, waited: Any) -> None:
        """Work issued on ``waiter`` from now on runs after the work issued on ``waited`` so far."""

    def record_event(self, stream: Any) -> Any:
        """An event completed when the work issued on ``stream`` so far is."""
        return None

    def wait_event(self, stream: Any, event: Any) -> None:
        """Work issued on ``stream`` from now on runs after ``event``."""

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        """``tensor``'s memory is not reused before the work issued on ``stream`` so far is done."""

    # -- the host waiting ------------------------------------------------------------------
    def read(self, tensor: torch.Tensor) -> list:
        """``tensor``'s values on the host (waits for the current stream's work on it)."""
        return tensor.tolist()

    def synchronize(self) -> None:
        """Everything issued on every stream has finished."""

    def host_wait(self, event: Any) -> None:
        """The host waits until ``event`` (``record_event``) has completed."""

    def host_knowledge(self) -> Any:
        """What the calling thread knows to have finished on the device (handed to another
        thread with a task or a result: ``learn``).  Only the tests' recorder tracks it."""
        return None

    def learn(self, knowledge: Any) -> None:
        """The calling thread now knows what ``knowledge`` (``host_knowledge``) says."""

    def handed_to_step(self) -> None:
        """The pipeline hands a batch to the step: a marker for the tests' recorder."""

    # -- timing of the compute stream's waits ---------------------------------------------
    def timed_wait(self, stream: Any, event: Any) -> Any:
        """``wait_event`` with a token measuring how long ``stream`` really sat waiting."""
        self.wait_event(stream, event)
        return None

    def waited_seconds(self, tokens: list) -> float:
        """Seconds measured by ``timed_wait`` tokens (waits for them to complete)."""
        return 0.0


class InlineStreams(Streams):
    """The CPU: one order, the order of issue; nothing to wait for."""


class CudaStreams(Streams):
    asynchronous = True

    def new_stream(self, name: str, priority: int = 0) -> Any:
        return torch.cuda.Stream(self.device, priority=priority)

    def current_stream(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def use(self, stream: Any) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream)

    def wait_stream(self, waiter: Any, waited: Any) -> None:
        waiter.wait_stream(waited)

    def record_event(self, stream: Any) -> Any:
        return stream.record_event()

    def wait_event(self, stream: Any, event: Any) -> None:
        if event is not None:
            stream.wait_event(event)

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        if tensor.is_cuda:
            tensor.record_stream(stream)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def pinned(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        # torch's caching host allocator hands a block out again only once the copies recorded
        # on it (non_blocking copies from or to it) have completed
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def host_wait(self, event: Any) -> None:
        if event is not None:
            event.synchronize()

    def timed_wait(self, stream: Any, event: Any) -> Any:
        before = torch.cuda.Event(enable_timing=True)
        before.record(stream)
        self.wait_event(stream, event)
        after = torch.cuda.Event(enable_timing=True)
        after.record(stream)
        return before, after

    def waited_seconds(self, tokens: list) -> float:
        total = 0.0
        for before, after in tokens:
            after.synchronize()
            total += before.elapsed_time(after) / 1000.0
        return total


_lock = threading.Lock()
_by_device: dict[torch.device, Streams] = {}
_override: Callable[[torch.device], Streams] | None = None


def streams_for(device: torch.device | str) -> Streams:
    """The one :class:`Streams` of ``device`` (shared by the pipeline and the cache)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with _lock:
        if device not in _by_device:
            if _override is not None:
                _by_device[device] = _override(device)
            elif device.type == "cuda":
                _by_device[device] = CudaStreams(device)
            else:
                _by_device[device] = InlineStreams(device)
        return _by_device[device]


@contextlib.contextmanager
def streams_override(factory: Callable[[torch.device], Streams]) -> Iterator[None]:
    """Inside the block, :func:`streams_for` builds its objects with ``factory`` (the tests'
    recorder); objects built before or after are not affected."""
    global _override
    with _lock:
        saved, saved_objects = _override, dict(_by_device)
        _override = factory
        _by_device.clear()
    try:
        yield
    finally:
        with _lock:
            _override = saved
            _by_device.clear()
            _by_device.update(saved_objects)
