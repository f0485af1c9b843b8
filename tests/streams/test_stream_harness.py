"""The recorder itself: each check finds the hazard it is for, and only that (negative controls for
test_stream_discipline.py, which asserts that the real loop has none)."""

from __future__ import annotations

import torch
from stream_harness import RecordingStreams


def _recorder():
    rec = RecordingStreams(torch.device("cpu"))
    return rec, rec.compute, rec.plan, rec.copy


def test_a_read_through_a_wait_for_the_step_is_a_drain_and_one_without_is_not():
    rec, compute, plan, _ = _recorder()
    with rec.activate():
        rec.handed_to_step()
        x = torch.ones(4) * 2  # the step's work, on compute
        with rec.use(plan):
            y = torch.arange(3) + 1
            assert rec.read(y) == [1, 2, 3]  # waits for the plan stream only
        assert not rec.drains()
        rec.wait_stream(plan, compute)  # c40961b's planning_input
        with rec.use(plan):
            rec.read(y)
    assert [(d.stream, d.waits_for) for d in rec.drains()] == [("plan", 2)]  # ones, mul
    assert x.sum() == 8


def test_a_read_of_work_the_host_already_waited_for_is_no_drain():
    rec, compute, plan, _ = _recorder()
    with rec.activate():
        rec.handed_to_step()
        torch.ones(2).sum().item()  # the loop's own read (a drain: counted)
        rec.wait_stream(plan, compute)
        with rec.use(plan):
            rec.read(torch.zeros(1))  # waits for nothing the host did not know was done
    assert len(rec.drains()) == 1 and rec.drains()[0].kind == "item"


def test_unordered_writes_to_the_same_rows_race_and_ordered_or_disjoint_ones_do_not():
    rec, compute, plan, copy = _recorder()
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
    rec, compute, plan, _ = _recorder()
    with rec.activate():
        rec.handed_to_step()
        for recorded in (True, False):
            with rec.use(plan):
                t = torch.arange(5) * 2
            rec.wait_stream(compute, plan)
            (t + 1).sum()  # used on compute
            if recorded:
                rec.record_stream(t, compute)
            del t
    assert len(rec.unrecorded) == 1 and "made on plan, used on compute" in rec.unrecorded[0]
