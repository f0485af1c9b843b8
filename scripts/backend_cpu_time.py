"""Training-thread CPU time per step spent in the embedding backend's calls, for `dlrm-cache train`.

    python scripts/backend_cpu_time.py [--rounds N] CHECKOUT... -- TRAIN_OVERRIDES...

e.g. ``python scripts/backend_cpu_time.py --rounds 4 . ../before -- data.path=data/synth/processed
max_steps=400 embedding=freq_cache embedding.cache_ratio=0.05``.  Each round runs one training job
per checkout (in that order, each in a fresh process with that checkout's ``dlrm_cache``), with the
backend's ``prefetch``, ``forward`` and ``step_done`` wrapped in per-thread CPU clocks
(``time.thread_time``): CPU the training thread spent there, not time it waited, so the figure
moves much less with the machine's load than samples/s do.  ``forward`` includes the lookup
kernel itself (``embedding=host`` gives that baseline).  Printed: every run, then each checkout's
median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = r"""
import atexit, functools, json, sys, time
from dlrm_cache.embedding.base import EmbeddingBackend
cpu, calls = {}, {}
def timed(cls, name):
    f = cls.__dict__.get(name)
    if f is None:
        return
    @functools.wraps(f)
    def g(*a, **k):
        t = time.thread_time()
        try:
            return f(*a, **k)
        finally:
            cpu[name] = cpu.get(name, 0.0) + time.thread_time() - t
            calls[name] = calls.get(name, 0) + (name == "forward")
    setattr(cls, name, g)
def subclasses(c):
    for s in c.__subclasses__():
        yield s
        yield from subclasses(s)
import dlrm_cache.config.schemas, dlrm_cache.embedding.direct, dlrm_cache.embedding.freq_cache  # noqa
for cls in [EmbeddingBackend, *subclasses(EmbeddingBackend)]:
    for name in ("prefetch", "forward", "step_done"):
        timed(cls, name)
def report():
    n = max(calls.get("forward", 0), 1)
    print("BACKEND_CPU " + json.dumps({k: 1000 * v / n for k, v in cpu.items()}), file=sys.stderr)
atexit.register(report)
from dlrm_cache.cli import main
sys.argv = ["dlrm-cache", "train", *sys.argv[1:]]
main()
"""


def run_once(tree: Path, overrides: list[str], out_dir: Path) -> dict[str, float]:
    cmd = [sys.executable, "-c", _CHILD, "progress=false", f"hydra.run.dir={out_dir}", *overrides]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    lines = [x for x in proc.stderr.splitlines() if x.startswith("BACKEND_CPU ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        raise SystemExit(f"backend_cpu_time: training in {tree} failed: {tail}")
    return json.loads(lines[-1].split(" ", 1)[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("checkouts", nargs="+", help="source trees, then -- and train's overrides")
    argv = sys.argv[1:]
    if "--" not in argv:
        raise SystemExit("backend_cpu_time: give train's overrides after --")
    cut = argv.index("--")
    args = ap.parse_args(argv[:cut])
    overrides = argv[cut + 1 :]
    trees = [Path(c).resolve() for c in args.checkouts]
    for t in trees:
        if not (t / "dlrm_cache").is_dir():
            raise SystemExit(f"backend_cpu_time: no dlrm_cache/ in {t}")
    totals: dict[Path, list[float]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory(prefix="backend_cpu_time-") as tmp:
        for r in range(args.rounds):
            for i, t in enumerate(trees):
                ms = run_once(t, overrides, Path(tmp) / f"{i}-{r}")
                totals[t].append(sum(ms.values()))
                parts = "  ".join(f"{k} {v:.3f}" for k, v in sorted(ms.items()))
                print(f"round {r + 1}  {t.name:>16}  {sum(ms.values()):.3f} ms/step  ({parts})")
    print()
    for t in trees:
        print(f"{t.name:>16}  median {statistics.median(totals[t]):.3f} ms of CPU per step")


if __name__ == "__main__":
    main()
