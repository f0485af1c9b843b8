"""A recorder of stream operations: what a GPU would order, checked on the CPU.

:class:`RecordingStreams` implements :class:`dlrm_cache.concurrency.streams.Streams` with fake streams and
vector clocks.  Installed with ``streams_override`` and :meth:`RecordingStreams.activate`, it
attributes every aten op (a ``TorchDispatchMode``, entered by each thread that issues work) to the
calling thread's current fake stream, and models CUDA's ordering rules:

* ops on one stream run in issue order; ``wait_stream``/``wait_event`` add happens-before edges
  (vector clocks merged), ``record_event`` snapshots a stream's clock;
* a host read waits for a clock and teaches the reading thread that the work in it is done; work
  that thread issues afterwards is ordered after it.  Threads pass that knowledge on where they
  hand work over (``host_knowledge``/``learn``: the cache's planner with its tasks and results).
  Host reads are: ``Streams.synchronize`` (every stream); ``Streams.read``, every aten op that
  makes the host wait for a value or a size (``item``, ``nonzero``, ...; inside ``on_host`` where
  it reads device memory), ``Tensor.tolist``/``numpy``/``cpu`` of *device memory* (wrapped, on
  every thread, while the recorder is active) and a blocking copy between a staging buffer and
  device memory (these wait for the calling thread's current stream, on which the copy to the
  host is issued); ``Tensor.to`` the host of device memory; a copy of device memory into host
  memory that is not a staging buffer (pageable: under CUDA the host waits for it); an event's
  ``synchronize``/``query`` and ``Streams.host_wait`` (the event's clock).

Memory is classified per storage:

* *device memory*: made by an op recorded on a stream (not inside ``on_host``); made after
  start-up (the first batch handed to the step), or *start-up* state (the model, the cache's
  tables);
* *host memory*: made by an op inside ``Streams.on_host`` (host work on host tensors);
* *staging buffers*: returned by ``Streams.pinned``;
* *host-resident* memory: declared with ``Streams.host_resident`` (the cache's host store).

Storage the recorder never saw made (the loader threads' batches, ``torch.from_numpy``) is none
of these: it is not device memory.

Five checks, each a list of findings (empty = the contract holds):

``drains()`` (from ``reads``): host reads after start-up that wait for compute-stream work issued
    after the last batch was handed to the step (``Streams.handed_to_step``) and not already known
    to be done by the reading thread: the step is drained.  Reads inside :meth:`allowed` blocks
    (evaluation metrics, a checkpoint) are not recorded.  Reads made from fbgemm's own frames (its
    host-side counters, ``iter_cpu``: host tensors on a GPU too) are neither recorded nor taken as
    knowledge that anything finished.
``overwaits``: after start-up and outside :meth:`allowed` blocks, the compute stream waits for
    the whole of another stream (``wait_stream(compute, X)``): it then waits for work issued on X
    for batches not yet handed to the step.  (A ``wait_event`` on an event of X is not checked:
    which batch X's work is for is not known to the recorder.)
``races``: two accesses to the same memory from different streams, at least one a write, with no
    happens-before edge between them.  Memory is tracked per storage; the rows of the buffers
    registered with :meth:`track_rows` (the cache's slot buffers, written by the copy stream and by
    the fused optimizer on the compute stream) are tracked per row, from the index argument of
    ``index_select``/``index_copy_``/``index``/``index_put_`` and the ``indices`` of fbgemm's
    lookup and backward ops.
``unrecorded``: a tensor allocated after start-up on one stream and used on another, whose Python
    object died
    without ``record_stream`` for that stream and without the host knowing the use finished
    (the caching allocator could have handed its memory out while the use was pending).
    Approximation: lifetimes are those of the op's output tensor object, not of later views.
``host_memory``: an op on a stream that touches host-resident memory; an op on a stream that
    touches a staging buffer and is not a copy (``copy_``/``_to_copy``) between it and device
    memory; a copy of device memory into host memory that is not a staging buffer; an op inside
    ``on_host`` that touches device memory made after start-up.  (View ops
    touch no memory.)

Per-stream op counts: :meth:`ops_by_stream`.  Every storage seen made on a stream, every staging
buffer and every host-resident tensor is kept alive until :meth:`close`, so addresses are never
reused under the records.  Clocks are dicts ``{stream index: ops issued}``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from dlrm_cache.bench.syncs import _sync_kind
from dlrm_cache.concurrency.streams import Streams

aten = torch.ops.aten
Clock = dict  # stream index -> ops issued on it

# memory kinds (see the module docstring)
DEVICE, STARTUP, HOST, STAGING, RESIDENT = "device", "start-up", "host", "staging", "host-resident"
# Tensor methods that read device memory on the host without an aten op on the CPU (``item`` and
# friends are aten ops; ``to`` only when it goes to the host); the unwrapped ones, for the
# recorder's own use
TENSOR_READS = ("tolist", "numpy", "cpu", "to")
_ORIGINAL = {name: getattr(torch.Tensor, name) for name in TENSOR_READS}


def _to_host(args: tuple, kwargs: dict) -> bool:
    """Whether ``Tensor.to(*args, **kwargs)`` goes to the host (a device ``cpu`` given by name,
    as a device, or as another tensor's)."""
    targets = [*args, kwargs.get("device")]
    for a in targets:
        if isinstance(a, (str, torch.device)) and torch.device(a).type == "cpu":
            return True
        if isinstance(a, torch.Tensor) and a.device.type == "cpu" and a is args[0]:
            return True
    return False


_COPIES = (aten.copy_.default, aten._to_copy.default)


def _merge(into: Clock, other: Clock) -> None:
    for k, v in other.items():
        if into.get(k, 0) < v:
            into[k] = v


@dataclass(frozen=True)
class FakeStream:
    index: int
    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass
class FakeEvent:
    """A stream's clock when the event was recorded.  ``synchronize`` and ``query`` are host reads
    that wait for it (``query`` answers True: the host then knows the work finished)."""

    clock: Clock
    stream: str = ""
    rec: RecordingStreams | None = field(default=None, repr=False, compare=False)

    def synchronize(self) -> None:
        if self.rec is not None:
            self.rec._host_wait(self.clock, self.stream, "event.synchronize")

    def query(self) -> bool:
        if self.rec is not None:
            self.rec._host_wait(self.clock, self.stream, "event.query")
        return True


@dataclass
class Read:
    thread: str
    stream: str
    kind: str
    waits_for: int  # compute ops the read waits for that the thread did not know were done
    step_mark: int  # compute ops issued when the last batch was handed to the step
    steps: int  # batches handed to the step so far (0: start-up)
    where: str


@dataclass
class _Access:
    stream: int
    tick: int  # the stream's own clock at the access
    rows: np.ndarray | None  # None: the whole storage
    write: bool
    op: str


@dataclass
class _Alloc:
    stream: int
    uses: list = field(default_factory=list)  # (stream, tick) on other streams
    recorded: set = field(default_factory=set)
    name: str = ""


_INDEX_DIM0 = {
    aten.index_select.default: ("self", "index", False),
    aten.index_select.out: ("self", "index", False),
    aten.index_copy_.default: ("self", "index", True),
    aten.index_add_.default: ("self", "index", True),
}


class RecordingStreams(Streams):
    asynchronous = True

    def __init__(self, device: torch.device) -> None:
        self._mode = _Mode(self)
        self._lock = threading.RLock()
        self._streams: list[FakeStream] = []
        self._clocks: list[Clock] = []
        self._tls = threading.local()
        self._host: dict[int, Clock] = defaultdict(dict)  # per thread: work known to be done
        self.step_mark = 0
        self.steps = 0
        self._allowed: str | None = None
        self.reads: list[Read] = []
        self.races: list[str] = []
        self.unrecorded: list[str] = []
        self.overwaits: list[str] = []
        self.host_memory: list[str] = []
        self._accesses: dict[int, list[_Access]] = defaultdict(list)
        self._allocs: dict[int, _Alloc] = {}
        self._rows: dict[int, tuple[int, int]] = {}  # storage -> (offset, row elements)
        self._memory: dict[int, tuple[str, str]] = {}  # storage -> (memory kind, what made it)
        self._keep: list = []
        self._saved: dict[str, Any] = {}  # Tensor methods replaced while active
        self.ops = 0
        self._launches: dict[int, int] = defaultdict(int)  # per stream: ops that touch memory
        self.closed = False
        super().__init__(device)  # creates the streams Streams declares, whichever they are
        self._default = self.compute

    # -- the Streams interface --------------------------------------------------------------
    def new_stream(self, name: str, priority: int = 0) -> FakeStream:
        with self._lock:
            s = FakeStream(len(self._streams), name)
            self._streams.append(s)
            self._clocks.append({})
            return s

    def current_stream(self) -> FakeStream:
        if not self._streams:  # the constructor's compute stream
            return self.new_stream("compute")
        return getattr(self._tls, "stream", None) or self._default

    @contextlib.contextmanager
    def use(self, stream: FakeStream):
        saved = getattr(self._tls, "stream", None)
        self._tls.stream = stream
        try:
            yield
        finally:
            self._tls.stream = saved

    @contextlib.contextmanager
    def on_host(self):
        saved = getattr(self._tls, "host", False)
        self._tls.host = True
        try:
            yield
        finally:
            self._tls.host = saved

    @contextlib.contextmanager
    def thread_setup(self):
        with self._mode if not self.closed else contextlib.nullcontext():
            yield

    def pinned(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        with self.on_host():  # an allocation, not an op on a stream
            t = torch.empty(shape, dtype=dtype)
        self._register(t, STAGING, "Streams.pinned")
        return t

    def host_resident(self, tensor: torch.Tensor) -> None:
        self._register(tensor, RESIDENT, "Streams.host_resident")

    def wait_stream(self, waiter: FakeStream, waited: FakeStream) -> None:
        with self._lock:
            if (
                waiter.index == self.compute.index
                and waited.index != waiter.index
                and self.steps > 0
                and self._allowed is None
            ):
                self.overwaits.append(
                    f"{threading.current_thread().name}: compute waits for the whole {waited} "
                    f"stream at {_caller()} (after {self.steps} batches handed to the step)"
                )
            _merge(self._clocks[waiter.index], self._clocks[waited.index])

    def record_event(self, stream: FakeStream) -> FakeEvent:
        with self._lock:
            return FakeEvent(dict(self._clocks[stream.index]), stream.name, self)

    def wait_event(self, stream: FakeStream, event: FakeEvent | None) -> None:
        if event is not None:
            with self._lock:
                _merge(self._clocks[stream.index], event.clock)

    def record_stream(self, tensor: torch.Tensor, stream: FakeStream) -> None:
        with self._lock:
            alloc = self._allocs.get(_key(tensor))
            if alloc is not None:
                alloc.recorded.add(stream.index)

    def read(self, tensor: torch.Tensor) -> list:
        self._tensor_read(tensor, "read", always=True)
        return _ORIGINAL["tolist"](tensor)

    def synchronize(self) -> None:
        with self._lock:
            for s in self._streams:
                self._host_read(s, "synchronize")

    def host_wait(self, event: FakeEvent | None) -> None:
        if event is not None:
            self._host_wait(event.clock, event.stream, "host_wait")

    def host_knowledge(self) -> Clock:
        with self._lock:
            return dict(self._host[threading.get_ident()])

    def learn(self, knowledge: Clock | None) -> None:
        if knowledge:
            with self._lock:
                _merge(self._host[threading.get_ident()], knowledge)

    def handed_to_step(self) -> None:
        with self._lock:
            self.step_mark = self._clocks[self.compute.index].get(self.compute.index, 0)
            self.steps += 1

    def timed_wait(self, stream: Any, event: Any) -> Any:
        """As under CUDA: the wait between two events recorded on ``stream``."""
        before = self.record_event(stream)
        self.wait_event(stream, event)
        return before, self.record_event(stream)

    def waited_seconds(self, tokens: list) -> float:
        """Waits for each token's second event (a host read), as under CUDA; 0 seconds."""
        for _, after in tokens:
            after.synchronize()
        return 0.0

    # -- what the tests use -----------------------------------------------------------------
    @contextlib.contextmanager
    def activate(self):
        """Record the calling thread's ops (other threads enter ``thread_setup``) and every
        thread's ``Tensor.tolist``/``numpy``/``cpu``; stop recording on leaving."""
        self._wrap_tensor_reads()
        try:
            with self._mode:
                yield self
        finally:
            self._unwrap_tensor_reads()
            self.close()

    @contextlib.contextmanager
    def allowed(self, why: str):
        """Host reads and compute-stream waits inside the block may drain the step (evaluation
        metrics, checkpoints), on any thread: the block's thread may wait for another (the
        cache's planner) to read."""
        saved, self._allowed = self._allowed, why
        try:
            yield
        finally:
            self._allowed = saved

    def track_rows(self, tensor: torch.Tensor) -> None:
        """Check ``tensor``'s rows (dim 0) one by one: a slot buffer."""
        row = tensor.stride(0) if tensor.dim() > 1 else 1
        self._rows[_key(tensor)] = (tensor.storage_offset(), row)

    def drains(self) -> list[Read]:
        """Reads after start-up (the first batch handed to the step) that drained the step."""
        return [r for r in self.reads if r.waits_for > 0 and r.steps > 0]

    def ops_by_stream(self) -> dict[str, int]:
        """Aten ops that touch memory issued so far on each stream, by name (what a GPU would
        launch on it: views, which launch nothing, are not counted)."""
        with self._lock:
            return {s.name: self._launches.get(s.index, 0) for s in self._streams}

    def memory_kind(self, tensor: torch.Tensor) -> str | None:
        """What the recorder knows ``tensor``'s storage to be (see the module docstring)."""
        found = self._memory.get(_key(tensor))
        return found[0] if found else None

    def close(self) -> None:
        """Stop recording (tensors still alive were not freed under the recorder)."""
        self.closed = True
        with self._lock:
            self._allocs.clear()
            self._keep.clear()

    # -- internals --------------------------------------------------------------------------
    def _on_device(self, t: torch.Tensor) -> bool:
        return self.memory_kind(t) in (DEVICE, STARTUP)

    def _register(self, t: torch.Tensor, kind: str, origin: str) -> None:
        key = _key(t)
        if key == 0:
            return
        with self._lock:
            self._memory[key] = (kind, origin)
            self._allocs.pop(key, None)
            self._keep.append(t.untyped_storage())

    def _wrap_tensor_reads(self) -> None:
        assert not self._saved, "the recorder is active already"
        for name in TENSOR_READS:
            original = getattr(torch.Tensor, name)

            def read(t, *args, _original=original, _name=name, **kwargs):
                if _name != "to" or _to_host(args, kwargs):
                    self._tensor_read(t, _name)
                return _original(t, *args, **kwargs)

            self._saved[name] = (original, read)
            setattr(torch.Tensor, name, read)

    def _unwrap_tensor_reads(self) -> None:
        # only where this recorder's wrapper is still in place (a HostSyncCounter entered on
        # another thread may have wrapped over it); a wrapper left behind reads nothing once closed
        for name, (original, read) in self._saved.items():
            if getattr(torch.Tensor, name) is read:
                setattr(torch.Tensor, name, original)
        self._saved.clear()

    def _tensor_read(self, t: torch.Tensor, kind: str, always: bool = False) -> None:
        """The host reads ``t`` on the calling thread's current stream: a copy to the host issued
        there (an access of ``t``), then a wait for that stream.  Only device memory is read
        from the device (``always``: ``Streams.read``, a wait whatever ``t`` is)."""
        if self.closed:
            return
        device = self._on_device(t)
        if not (device or always):
            return
        with self._lock:
            stream = self.current_stream()
            if device:
                clock = dict(self._issue(stream))
                self._launches[stream.index] += 1  # the copy to the host
                self._access(t, stream, clock, False, None, f"Tensor.{kind}")
            self._host_read(stream, kind)

    def _host_read(self, stream: FakeStream, kind: str) -> None:
        """The host waits for the work issued on ``stream`` so far."""
        self._host_wait(self._clocks[stream.index], stream.name, kind)

    def _host_wait(self, clock: Clock, stream: str, kind: str) -> None:
        """The calling thread waits for ``clock`` (``stream``: where it was taken)."""
        if _fbgemm_host_counter():
            return  # fbgemm's host-side counters: no device read, nothing learnt
        with self._lock:
            host = self._host[threading.get_ident()]
            c = self.compute.index
            after = max(host.get(c, 0), self.step_mark)
            waits = clock.get(c, 0) - after
            if self._allowed is None:
                self.reads.append(
                    Read(
                        threading.current_thread().name,
                        stream,
                        kind,
                        max(waits, 0),
                        self.step_mark,
                        self.steps,
                        _caller(),
                    )
                )
            _merge(host, clock)

    def _issue(self, stream: FakeStream) -> Clock:
        clock = self._clocks[stream.index]
        _merge(clock, self._host[threading.get_ident()])
        clock[stream.index] = clock.get(stream.index, 0) + 1
        self.ops += 1
        return clock

    def _dispatch(self, func, args, kwargs):
        if getattr(self._tls, "host", False):  # host work (Streams.on_host): no stream
            kind = _sync_kind(func, args, kwargs)
            if kind is not None:  # e.g. item() of device memory: read on the current stream
                read = [t for t in _all_tensors((args, kwargs)) if self._on_device(t)]
                if read:
                    self._tensor_read(read[0], kind)
            out = func(*args, **kwargs)
            with self._lock:
                self._host_op(func, args, kwargs, out)
            return out
        kind = _sync_kind(func, args, kwargs)
        stream = self.current_stream()
        with self._lock:
            if kind is None and self._blocking_copy(func, args, kwargs):
                kind = "blocking_copy"
            if kind is None and self._pageable_copy(func, args):
                kind = "pageable_copy"
                self.host_memory.append(
                    f"{func} on {stream} at {_caller()} copies device memory into host memory "
                    "that is not a staging buffer (the host waits for it)"
                )
            clock = dict(self._issue(stream))
            if _touches_memory(func):
                self._launches[stream.index] += 1
            if kind is not None:  # the host waits for this op too
                self._host_read(stream, kind)
        # run outside the lock: an op may block (a collective waiting for another rank) while
        # another thread records its own ops; the accesses are ordered by the clocks, not by time
        out = func(*args, **kwargs)
        with self._lock:
            self._accesses_of(func, args, kwargs, out, stream, clock)
        return out

    def _host_op(self, func, args, kwargs, out) -> None:
        """``on_host`` work: it must not touch device memory; what it makes is host memory."""
        if _touches_memory(func):
            for t in _all_tensors((args, kwargs)):
                found = self._memory.get(_key(t))
                if found is not None and found[0] == DEVICE:
                    self.host_memory.append(
                        f"host work {func} at {_caller()} touches device memory ({found[1]})"
                    )
                    break
        if not any(r.alias_info is not None for r in func._schema.returns):
            for t in _all_tensors(out):
                if _key(t):
                    self._memory[_key(t)] = (HOST, str(func))

    def _blocking_copy(self, func, args, kwargs) -> bool:
        """A copy between a staging buffer and device memory that the host waits for."""
        if func is aten.copy_.default:  # (dst, src): one is staging, the other device memory
            non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            kinds = {self.memory_kind(args[0]), self.memory_kind(args[1])}
            return not non_blocking and STAGING in kinds and bool(kinds & {DEVICE, STARTUP})
        if func is aten._to_copy.default:  # staging to the device
            non_blocking = kwargs.get("non_blocking", False)
            return not non_blocking and self.memory_kind(args[0]) == STAGING
        return False

    def _pageable_copy(self, func, args) -> bool:
        """A copy of device memory into host memory that is not a staging buffer (made by host
        work, or never seen made: ``from_numpy``, a loader's tensors): under CUDA the host waits
        for it, whatever ``non_blocking`` says."""
        if func is not aten.copy_.default:
            return False
        dst, src = self.memory_kind(args[0]), self.memory_kind(args[1])
        return src in (DEVICE, STARTUP) and dst not in (DEVICE, STARTUP, STAGING)

    def _check_host_memory(self, func, tensors: list[torch.Tensor], stream: FakeStream) -> None:
        """An op on ``stream``: no host-resident memory; staging buffers only in copies."""
        kinds = [self.memory_kind(t) for t in tensors]
        if RESIDENT in kinds:
            self.host_memory.append(
                f"{func} on {stream} at {_caller()} touches host-resident memory"
            )
        elif STAGING in kinds and (
            func not in _COPIES
            or kinds.count(STAGING) > 1
            or any(k not in (DEVICE, STARTUP) for k in kinds if k != STAGING)
        ):
            self.host_memory.append(
                f"{func} on {stream} at {_caller()} touches a staging buffer and is not a copy "
                "between it and device memory"
            )

    def _accesses_of(self, func, args, kwargs, out, stream: FakeStream, clock: Clock) -> None:
        if not _touches_memory(func):
            return  # a view: no memory is touched
        schema = func._schema
        named = {
            a.name: (args[i] if i < len(args) else kwargs.get(a.name, a.default_value))
            for i, a in enumerate(schema.arguments)
        }
        self._check_host_memory(func, _all_tensors((args, kwargs)), stream)
        rows_of = self._row_rule(func, named)
        for a in schema.arguments:
            write = a.alias_info is not None and a.alias_info.is_write
            for t in _tensors(named.get(a.name)):
                self._access(t, stream, clock, write, rows_of(a.name, t), func)
        if any(r.alias_info is not None for r in schema.returns):
            return  # in place or a view: its accesses are those of the arguments
        for t in _tensors(out):
            self._fresh(t, stream, func)
            self._access(t, stream, clock, True, None, func)

    def _row_rule(self, func, named):
        """``(argument name, tensor) -> rows touched (None: all)`` for row-tracked buffers."""
        if func in _INDEX_DIM0:
            target, index, _ = _INDEX_DIM0[func]
            if named.get("dim") == 0:
                idx = named[index]
                return lambda name, t: _unique(idx) if name == target else None
        if func in (aten.index.Tensor, aten.index_put_.default, aten._index_put_impl_.default):
            idx = named.get("indices") or []
            first = idx[0] if idx else None
            if len(idx) == 1 and isinstance(first, torch.Tensor) and first.dtype != torch.bool:
                return lambda name, t: _unique(first) if name == "self" else None
        if func.namespace == "fbgemm" and isinstance(named.get("indices"), torch.Tensor):
            idx = named["indices"]
            return lambda name, t: _unique(idx) if _key(t) in self._rows else None
        return lambda name, t: None

    def _fresh(self, t: torch.Tensor, stream: FakeStream, func) -> None:
        key = _key(t)
        self._accesses.pop(key, None)
        self._keep.append(t.untyped_storage())
        self._allocs.pop(key, None)
        self._memory[key] = (
            DEVICE if self.steps else STARTUP,
            f"{func} on {stream}" + (" after start-up" if self.steps else " at start-up"),
        )
        if self.steps == 0:
            return  # start-up state (the model's buffers, the cache's tables): lives for the run
        alloc = _Alloc(stream.index, name=f"{func} {tuple(t.shape)} {t.dtype}")
        self._allocs[key] = alloc
        weakref.finalize(t, self._died, key, alloc)

    def _died(self, key: int, alloc: _Alloc) -> None:
        if self.closed:
            return
        with self._lock:
            self._check_alloc(key, alloc)
            if self._allocs.get(key) is alloc:
                del self._allocs[key]

    def _check_alloc(self, key: int, alloc: _Alloc) -> None:
        for s, tick in alloc.uses:
            if s in alloc.recorded:
                continue
            if any(h.get(s, 0) >= tick for h in self._host.values()):
                continue
            self.unrecorded.append(
                f"{alloc.name} made on {self._streams[alloc.stream]}, used on {self._streams[s]} "
                "without record_stream or a host synchronization before it was freed"
            )
            alloc.uses.clear()
            return
        alloc.uses.clear()

    def _access(
        self,
        t: torch.Tensor,
        stream: FakeStream,
        clock: Clock,
        write: bool,
        rows: np.ndarray | None,
        func,
    ) -> None:
        key = _key(t)
        if key == 0:
            return
        if key in self._rows:
            offset, row = self._rows[key]
            if rows is not None and (
                t.storage_offset() != offset or (t.dim() > 1 and t.stride(0) != row)
            ):
                rows = None
        else:
            rows = None
        alloc = self._allocs.get(key)
        if alloc is not None and alloc.stream != stream.index:
            alloc.uses.append((stream.index, clock[stream.index]))
        tick = clock[stream.index]
        history = self._accesses[key]
        for prev in history:
            if prev.stream == stream.index or not (write or prev.write):
                continue
            if clock.get(prev.stream, 0) >= prev.tick:
                continue
            if (
                rows is not None
                and prev.rows is not None
                and not np.intersect1d(rows, prev.rows).size
            ):
                continue
            self.races.append(
                f"{prev.op} on {self._streams[prev.stream]} ({'write' if prev.write else 'read'}) and "
                f"{func} on {stream} ({'write' if write else 'read'}) touch the same memory unordered"
            )
            break
        history.append(_Access(stream.index, tick, rows, write, str(func)))
        if len(history) > 64:
            del history[:-64]


class _Mode(TorchDispatchMode):
    def __init__(self, rec: RecordingStreams) -> None:
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.rec._dispatch(func, args, kwargs or {})


def _key(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def _touches_memory(func) -> bool:
    """Whether an op reads or writes memory (a view op does neither)."""
    schema = func._schema
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    return writes or not any(r.alias_info is not None for r in schema.returns)


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def _all_tensors(value) -> list[torch.Tensor]:
    return [v for v in tree_leaves(value) if isinstance(v, torch.Tensor)]


def _unique(index: torch.Tensor) -> np.ndarray:
    return np.unique(_ORIGINAL["numpy"](index.detach().reshape(-1)))


def _fbgemm_host_counter() -> bool:
    """Whether the read comes from fbgemm's TBE module (its host-side counters, e.g. iter_cpu)."""
    f = sys._getframe(1)
    for _ in range(16):
        if f is None:
            return False
        if "fbgemm_gpu" in f.f_code.co_filename:
            return True
        f = f.f_back
    return False


def _caller() -> str:
    """The innermost dlrm_cache frame of the read (for messages)."""
    f = sys._getframe(2)
    while f is not None:
        if "dlrm_cache" in f.f_code.co_filename and "streams.py" not in f.f_code.co_filename:
            return f"{f.f_code.co_filename.rsplit('dlrm_cache/', 1)[-1]}:{f.f_lineno} {f.f_code.co_name}"
        f = f.f_back
    return "?"
