"""The recorder itself: each check finds the hazard it is for, and only that (negative controls for
test_stream_discipline.py, which asserts that the real loop has none)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stream_harness import RecordingStreams

from dlrm_cache.concurrency.streams import Streams


def _recorder():
    rec = RecordingStreams(torch.device("cpu"))
    return rec, rec.compute, rec.input, rec.copy


def test_a_read_through_a_wait_for_the_step_is_a_drain_and_one_without_is_not():
    rec, compute, side, _ = _recorder()
    with rec.activate():
        rec.handed_to_step()
        x = torch.ones(4) * 2  # the step's work, on compute
        with rec.use(side):
            y = torch.arange(3) + 1
            assert rec.read(y) == [1, 2, 3]  # waits for the side stream only
        assert not rec.drains()
        rec.wait_stream(side, compute)  # c40961b's planning_input
        with rec.use(side):
            rec.read(y)
    assert [(d.stream, d.waits_for) for d in rec.drains()] == [("input", 2)]  # ones, mul
    assert x.sum() == 8


def test_a_read_of_work_the_host_already_waited_for_is_no_drain():
    rec, compute, side, _ = _recorder()
    with rec.activate():
        rec.handed_to_step()
        torch.ones(2).sum().item()  # the loop's own read (a drain: counted)
        rec.wait_stream(side, compute)
        with rec.use(side):
            rec.read(torch.zeros(1))  # waits for nothing the host did not know was done
    assert len(rec.drains()) == 1 and rec.drains()[0].kind == "item"


@pytest.mark.parametrize("method", ["tolist", "numpy", "cpu"])
def test_tensor_methods_reading_device_memory_are_host_reads_on_any_thread(method):
    """``tolist``/``numpy``/``cpu`` (no aten op on the CPU) of device memory wait for the calling
    thread's current stream; of host memory (made by host work, a staging buffer, a tensor the
    recorder never saw made) they read nothing from the device."""
    import threading

    rec, compute, _, copy = _recorder()
    unwrapped = getattr(torch.Tensor, method)
    with rec.activate():
        rec.handed_to_step()
        x = torch.ones(4) * 2  # device memory, made by the step
        with rec.on_host():
            h = torch.ones(4) * 2  # host memory
        staging = rec.pinned((4,), torch.float32)
        for t in (h, staging, torch.from_numpy(h.numpy().copy())):
            getattr(t, method)()
        assert not rec.reads
        getattr(x[:2], method)()
        with rec.use(copy):  # on another stream, after nothing of the step: no drain
            getattr(x, method)()
        worker = threading.Thread(target=lambda: getattr(x, method)())  # records no aten ops
        worker.start()
        worker.join()
    assert [(r.kind, r.stream, r.waits_for > 0) for r in rec.reads] == [
        (method, "compute", True),
        (method, "copy", False),
        (method, "compute", True),  # what the main thread learnt, the worker does not know
    ]
    assert rec.reads[2].thread != rec.reads[0].thread
    assert getattr(torch.Tensor, method) is unwrapped  # unwrapped on leaving


def test_to_the_host_of_device_memory_is_a_read_and_other_tos_are_not():
    """``Tensor.to`` the host (by name, device or keyword) of device memory waits for the calling
    thread's stream; a dtype change, or host memory going nowhere, reads nothing (on the CPU
    ``x.to("cpu")`` is no aten op at all: the recorder wraps the method)."""
    rec, *_ = _recorder()
    unwrapped = torch.Tensor.to
    with rec.activate():
        rec.handed_to_step()
        x = torch.ones(4) * 2  # device memory, made by the step
        with rec.on_host():
            h = torch.ones(4) * 2
        h.to("cpu")
        x.to(torch.float64)
        x.to(dtype=torch.float16)
        assert not rec.reads
        x.to("cpu")
        x.to(torch.device("cpu"))
        x.to(device="cpu", dtype=torch.float64)
    assert [(r.kind, r.stream, r.waits_for > 0) for r in rec.reads] == [("to", "compute", True)] * 3
    assert torch.Tensor.to is unwrapped


def test_a_copy_of_device_memory_into_pageable_host_memory_is_a_read_and_a_finding():
    """Under CUDA a copy into pageable memory makes the host wait, ``non_blocking`` or not: a
    copy of device memory into host memory that is not a staging buffer (made by host work, or a
    numpy array's) is a read of the stream it is issued on and a host-memory finding; into a
    staging buffer it is neither."""
    rec, _, _, copy = _recorder()
    with rec.activate():
        rec.handed_to_step()
        x = torch.ones(4) * 2
        staging = rec.pinned((4,), torch.float32)
        staging.copy_(x, non_blocking=True)
        assert not rec.reads and not rec.host_memory
        torch.from_numpy(np.zeros(4, np.float32)).copy_(x, non_blocking=True)
        with rec.on_host():
            h = torch.zeros(4) + 0
        with rec.use(copy):
            h.copy_(x, non_blocking=True)
    assert [(r.kind, r.stream) for r in rec.reads] == [
        ("pageable_copy", "compute"),
        ("pageable_copy", "copy"),
    ]
    assert len(rec.host_memory) == 2 and all("not a staging buffer" in f for f in rec.host_memory)


def test_a_tensor_read_is_a_read_access_of_its_stream():
    """The copy to the host is issued on the reading stream: unordered after a write on another
    stream, it races."""
    rec, _, _, copy = _recorder()
    with rec.activate():
        rec.handed_to_step()
        x = torch.ones(4) * 2
        with rec.use(copy):
            x.tolist()
    assert len(rec.races) == 1 and "Tensor.tolist on copy (read)" in rec.races[0]


@pytest.mark.parametrize("how", ["event.synchronize", "event.query", "host_wait"])
def test_waiting_for_an_event_is_a_host_read_of_its_clock(how):
    rec, compute, _, copy = _recorder()

    def wait(event):
        if how == "host_wait":
            rec.host_wait(event)
        elif how == "event.query":
            assert event.query() is True
        else:
            event.synchronize()

    with rec.activate():
        before = rec.record_event(compute)  # nothing of the step
        rec.handed_to_step()
        torch.ones(4) * 2
        wait(before)
        assert not rec.drains()
        wait(rec.record_event(copy))  # the copy stream, not after the step
        assert not rec.drains()
        rec.wait_stream(copy, compute)
        wait(rec.record_event(copy))  # now after the step's two ops
    assert [(r.kind, r.stream, r.waits_for) for r in rec.drains()] == [(how, "copy", 2)]
    assert len(rec.reads) == 3


def test_fbgemm_reads_are_no_reads_and_teach_the_host_nothing():
    """fbgemm's host-side counters (``iter_cpu.item()``) are host tensors under CUDA too: no read
    of the device, so no knowledge that the compute stream's work finished (which would hide a
    missing record_stream)."""
    rec, compute, side, _ = _recorder()
    fbgemm: dict = {}
    code = compile(
        "def step(counter):\n    return counter.item()\n", "/x/fbgemm_gpu/tbe.py", "exec"
    )
    exec(code, fbgemm)
    with rec.activate():
        rec.handed_to_step()
        with rec.use(side):
            t = torch.arange(5) * 2  # made on the side stream
        rec.wait_stream(compute, side)
        (t + 1).sum()  # used on compute, not recorded for it
        fbgemm["step"](torch.ones(()) * 3)  # on compute, after that use
        assert rec.host_knowledge() == {}
        del t
    assert not rec.reads
    assert len(rec.unrecorded) == 1 and "made on input, used on compute" in rec.unrecorded[0]


def test_a_compute_wait_for_a_whole_other_stream_after_start_up_is_an_overwait():
    rec, compute, side, copy = _recorder()
    with rec.activate():
        rec.wait_stream(compute, copy)  # start-up: fine
        rec.handed_to_step()
        rec.wait_event(compute, rec.record_event(copy))  # an event: not checked
        rec.wait_stream(copy, compute)  # the cache's streams may wait for compute
        rec.wait_stream(compute, compute)
        with rec.allowed("checkpoint"):
            rec.wait_stream(compute, side)
        assert not rec.overwaits
        rec.wait_stream(compute, copy)
    assert len(rec.overwaits) == 1 and "whole copy stream" in rec.overwaits[0]


def test_stream_ops_on_host_resident_memory_are_findings_and_host_work_on_it_is_not():
    rec, _, _, copy = _recorder()
    store = torch.zeros(10, 4)
    rec.host_resident(store)
    with rec.activate():
        rec.handed_to_step()
        with rec.on_host():
            rows = store.index_select(0, torch.tensor([1, 2]))  # host work: fine
            store[3] = 1.0
        staging = rec.pinned((2, 4), torch.float32)
        with rec.on_host():
            staging.copy_(rows)  # host fills the staging buffer: fine
        assert not rec.host_memory
        store[:2]  # a view touches nothing
        with rec.use(copy):
            store.index_select(0, torch.tensor([1, 2]))  # a kernel reading host memory
            torch.zeros(2, 4).copy_(store[:2], non_blocking=True)  # even a copy: not staging
    assert len(rec.host_memory) == 2, rec.host_memory
    assert all("host-resident" in f and "on copy" in f for f in rec.host_memory)


def test_staging_buffers_are_touched_by_copies_to_and_from_device_memory_only():
    rec, _, _, copy = _recorder()
    with rec.activate():
        rec.handed_to_step()
        staging = rec.pinned((3, 4), torch.float32)
        assert rec.memory_kind(staging) == "staging"
        slots = torch.zeros(8, 4) + 0  # device memory
        with rec.use(copy):
            on_device = staging.to("cpu", non_blocking=True, copy=True)  # host -> device
            slots[:3].copy_(staging, non_blocking=True)  # host -> device
            staging.copy_(slots[:3], non_blocking=True)  # device -> host
            assert not rec.host_memory and not rec.reads
            slots.index_copy_(0, torch.tensor([0, 1, 2]), staging)  # a kernel reading it
            torch.index_select(slots, 0, torch.tensor([4, 5, 6]), out=staging)  # writing it
            with rec.on_host():
                other = rec.pinned((3, 4), torch.float32)
            other.copy_(staging, non_blocking=True)  # staging to staging on a stream
        assert len(rec.host_memory) == 3 and not rec.reads, rec.host_memory
        with rec.use(copy):
            staging.copy_(slots[:3])  # blocking: the host waits for the copy stream
            staging.to("cpu", copy=True)
    assert [r.kind for r in rec.reads] == ["blocking_copy", "blocking_copy"]
    assert on_device.shape == (3, 4)


def test_host_work_on_device_memory_made_after_start_up_is_a_finding():
    rec, compute, _, _ = _recorder()
    with rec.activate():
        model = torch.ones(4) + 0  # start-up state
        rec.handed_to_step()
        x = torch.ones(4) * 2  # device memory
        with rec.on_host():
            h = torch.arange(4.0) + model  # start-up state: fine
            h2 = h * 2  # what host work makes is host memory
            assert rec.memory_kind(h2) == "host" and rec.memory_kind(x) == "device"
            h2.numpy()  # not a device read
            assert not rec.host_memory and not rec.reads
            h2 + x  # touches device memory
            x[0].item()  # and reads it: a read on the current stream as well
    assert len(rec.host_memory) == 2 and all("touches device memory" in f for f in rec.host_memory)
    assert [(r.kind, r.stream) for r in rec.reads] == [("item", "compute")]


def test_ops_are_counted_per_stream():
    rec, _, side, copy = _recorder()
    with rec.activate():
        torch.ones(2) + 1
        with rec.use(copy):
            torch.ones(2) * 3
            torch.zeros(1)
        with rec.on_host():
            torch.ones(5) + 1  # no stream
    ops = rec.ops_by_stream()
    assert ops["compute"] == 2 and ops["copy"] == 3 and sum(ops.values()) == 5, ops


def test_the_recorder_makes_whatever_streams_the_interface_declares(monkeypatch):
    """RecordingStreams names no stream of its own but compute: a Streams without a plan stream
    (or with others) is recorded the same way."""

    def init(self, device):
        self.device = device
        self.compute = self.current_stream()
        self.input = self.new_stream("input")
        self.copy = self.new_stream("copy")

    monkeypatch.setattr(Streams, "__init__", init)
    rec, compute, _, copy = _recorder()
    assert not hasattr(rec, "plan")
    with rec.activate():
        rec.handed_to_step()
        torch.ones(2) * 2
        rec.wait_stream(copy, compute)
        with rec.use(copy):
            rec.read(torch.zeros(1) + 1)
    assert rec.ops_by_stream() == {"compute": 2, "input": 0, "copy": 3}  # zeros, add, the read
    assert [d.waits_for for d in rec.drains()] == [2]


def test_unordered_writes_to_the_same_rows_race_and_ordered_or_disjoint_ones_do_not():
    rec, compute, _, copy = _recorder()
    slots = torch.zeros(10, 4)
    rec.track_rows(slots)
    with rec.activate():
        rec.handed_to_step()
        slots.index_copy_(0, torch.tensor([1, 2]), torch.ones(2, 4))  # "backward" on compute
        with rec.use(copy):
            slots.index_copy_(0, torch.tensor([5]), torch.ones(1, 4))  # other rows: fine
        assert not rec.races
        rec.wait_event(copy, rec.record_event(compute))
        with rec.use(copy):
            slots.index_copy_(0, torch.tensor([2]), torch.ones(1, 4))  # after the event: fine
        assert not rec.races
        slots.index_select(0, torch.tensor([5, 7]))  # compute reads row 5 the copy wrote, no wait
    assert len(rec.races) == 1 and "index_copy_" in rec.races[0] and "index_select" in rec.races[0]


def test_a_tensor_freed_while_another_stream_may_use_it_needs_record_stream():
    rec, compute, side, _ = _recorder()
    with rec.activate():
        rec.handed_to_step()
        for recorded in (True, False):
            with rec.use(side):
                t = torch.arange(5) * 2
            rec.wait_stream(compute, side)
            (t + 1).sum()  # used on compute
            if recorded:
                rec.record_stream(t, compute)
            del t
    assert len(rec.unrecorded) == 1 and "made on input, used on compute" in rec.unrecorded[0]


def test_a_host_sync_counter_leaving_on_another_thread_keeps_the_recorder_wrapped(monkeypatch):
    """HostSyncCounter (bench/syncs.py) wraps the same Tensor methods.  One entered on another
    thread (a planner's) before the recorder and left while it records does not unwrap the
    recorder's methods, and neither counts or records anything after it left."""
    import threading

    from dlrm_cache.bench.syncs import HostSyncCounter

    for name in ("tolist", "numpy"):  # whatever wrapper is left behind goes at teardown
        monkeypatch.setattr(torch.Tensor, name, getattr(torch.Tensor, name))
    counter, entered, leave = HostSyncCounter(), threading.Event(), threading.Event()

    def planner():
        with counter:
            torch.ones(2).tolist()  # counted: the counter's own thread
            entered.set()
            leave.wait()

    thread = threading.Thread(target=planner)
    thread.start()
    entered.wait()
    rec, *_ = _recorder()
    with rec.activate():
        rec.handed_to_step()
        x = torch.ones(2) * 2
        leave.set()
        thread.join()  # the counter leaves first
        x.tolist()
    x.tolist()
    assert counter.syncs["tolist"] == 1
    assert [r.kind for r in rec.reads] == ["tolist"]
