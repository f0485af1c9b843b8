"""scripts/stream_trace.py's summary of a CUDA trace (a trace made by hand: the CPU has no kernels)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from stream_trace import summarize  # noqa: E402


def kernel(stream: int, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_overlap_with_the_compute_stream_and_its_gaps():
    trace = {
        "traceEvents": [
            kernel(7, 0, 100),
            kernel(7, 150, 100),
            kernel(7, 400, 100),  # compute: 300 us of kernels
            kernel(21, 50, 70),  # plan: 50 of its 70 us beside compute
            kernel(25, 260, 100),  # copy: between compute kernels (a drain would look like this)
            {"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 1000, "tid": 1},  # not a GPU event
        ]
    }
    s = summarize(trace)
    assert s["compute_stream"] == "7"
    assert s["streams"]["7"] == {"kernels": 3, "kernel_ms": 0.3}
    assert s["streams"]["21"]["beside_compute"] == round(50 / 70, 3)
    assert s["streams"]["25"]["beside_compute"] == 0.0
    assert s["compute_gaps_over_50us"] == 1  # 250 -> 400; 100 -> 150 is not over 50 us
    assert s["compute_idle_share"] == round(1 - 300 / 500, 3)
    assert "error" in summarize({"traceEvents": []})
