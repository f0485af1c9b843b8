"""Where the freq_cache's GPU work runs relative to the step: a torch.profiler trace of `train`.

    python scripts/stream_trace.py DATA OUT [train overrides...]

Trains a few dozen steps of `dlrm-cache train data.path=DATA` under torch.profiler (CPU + CUDA),
writes the Chrome trace to OUT/trace.json (open it in chrome://tracing or Perfetto) and prints, per
CUDA stream, the kernel time, and for the cache's streams the share of their kernel time that ran
while a compute-stream kernel was running (beside the step, not between steps), plus the compute
stream's idle gaps between kernels (a drained step shows as a gap every step).  The summary is
also written to OUT/streams.json.  Needs a GPU (the CPU has no streams to trace).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STEPS = 60  # the profiled run's training steps


def kernel_intervals(trace: dict) -> dict[str, list[tuple[float, float]]]:
    """GPU kernel and memcpy intervals (start, end) in microseconds, by stream id."""
    by_stream: dict[str, list[tuple[float, float]]] = {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        stream = str((e.get("args") or {}).get("stream", e.get("tid")))
        by_stream.setdefault(stream, []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    for intervals in by_stream.values():
        intervals.sort()
    return by_stream


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Time covered by both interval lists (each sorted; ``b``'s intervals may overlap each other)."""
    merged: list[list[float]] = []
    for s, e in b:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    total, j = 0.0, 0
    for s, e in a:
        while j < len(merged) and merged[j][1] <= s:
            j += 1
        k = j
        while k < len(merged) and merged[k][0] < e:
            total += min(e, merged[k][1]) - max(s, merged[k][0])
            k += 1
    return total


def summarize(trace: dict, gap_us: float = 50.0, steps: int = 0) -> dict:
    """Per stream: kernel time; beside compute: the share overlapping the busiest stream's kernels
    (the compute stream: the one with the most kernel time); the compute stream's gaps > gap_us
    (and per step, given the run's ``steps``)."""
    streams = kernel_intervals(trace)
    if not streams:
        return {"error": "no GPU kernels in the trace (was it recorded on a GPU?)"}
    busy = {s: sum(e - b for b, e in iv) for s, iv in streams.items()}
    compute = max(busy, key=busy.get)
    out: dict = {"compute_stream": compute, "streams": {}}
    for s, iv in streams.items():
        row = {"kernels": len(iv), "kernel_ms": round(busy[s] / 1000, 3)}
        if s != compute and busy[s] > 0:
            row["beside_compute"] = round(_overlap(iv, streams[compute]) / busy[s], 3)
        out["streams"][s] = row
    iv = streams[compute]
    gaps = [b2 - e1 for (_, e1), (b2, _) in zip(iv, iv[1:]) if b2 - e1 > gap_us]
    span = iv[-1][1] - iv[0][0]
    out[f"compute_gaps_over_{gap_us:g}us"] = len(gaps)
    if steps:
        out["compute_gaps_per_step"] = round(len(gaps) / steps, 2)
        out["compute_gap_ms_per_step"] = round(sum(gaps) / steps / 1000, 3)
    out["compute_idle_share"] = round(1 - busy[compute] / span, 3) if span > 0 else 0.0
    return out


def main(argv: list[str]) -> int:
    import torch
    from hydra import compose, initialize_config_dir
    from torch.profiler import ProfilerActivity, profile, schedule

    from dlrm_cache.commands.store import config_dir, register_configs
    from dlrm_cache.train.loop import train

    data, out, overrides = Path(argv[0]), Path(argv[1]), argv[2:]
    out.mkdir(parents=True, exist_ok=True)
    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(
            config_name="train",
            overrides=[
                f"data.path={data}",
                f"run_dir={out / 'run'}",
                "progress=false",
                f"max_steps={STEPS}",
                "eval_batches=1",
                "embedding=freq_cache",
                *overrides,
            ],
        )
    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
    )
    # the whole run is profiled; the summary is over every kernel of it
    with profile(activities=activities, schedule=schedule(wait=0, warmup=0, active=1)) as prof:
        train(cfg)
    prof.export_chrome_trace(str(out / "trace.json"))
    summary = summarize(json.loads((out / "trace.json").read_text()), steps=STEPS)
    (out / "streams.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
