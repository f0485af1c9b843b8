"""Preprocessing throughput side by side: this checkout, a baseline tree and torchrec's parser.

    python -m dlrm_cache.bench.preprocess --input DIR [--baseline SRC] [--workers 1 2] [--repeats 2]

Each run is ``python -m dlrm_cache preprocess`` in a fresh process on the same raw files (both
passes, output written, ``overwrite=true``), run in turn A B A B ... so machine load hits every
variant alike; ``--baseline`` is the root of another source tree (e.g. ``git worktree add /tmp/base
c40961b``) put first on ``PYTHONPATH``.  The peer is torchrec's ``BinaryCriteoUtils.tsv_to_npys``
(text -> npy, no frequency counting or id remapping) on the first ``--peer-lines`` lines of the
first file.  Printed per run: wall seconds, lines/s, CPU use, the peak RSS of the largest process
(the parent or one worker) and, for this checkout, its CPU seconds per stage.  On a shared machine
``lines per CPU s`` (CPU time of the whole process tree, imports included) is the steadier figure:
wall time there measures the other users' load as much as the code.  Machine load
(``os.getloadavg``) is printed before and after every run: compare ratios within one invocation.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Result:
    name: str
    lines: int
    wall: float
    cpu: float
    max_rss_mb: float
    load: tuple[float, float]
    stages: str = ""

    def row(self) -> str:
        return (
            f"| {self.name} | {self.lines:,} | {self.wall:.2f} | {self.lines / self.wall:,.0f} | "
            f"{self.cpu:.1f} | {self.lines / self.cpu:,.0f} | {100 * self.cpu / self.wall:.0f}% | "
            f"{self.max_rss_mb:,.0f} | {self.load[0]:.1f} / {self.load[1]:.1f} |"
        )


def _run(name: str, cmd: list[str], env: dict[str, str], lines: int, cwd: Path) -> Result:
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{name} failed:\n{out[-3000:]}")
    stages = re.search(r"preprocess: CPU seconds per stage.*", out)
    return Result(
        name,
        lines,
        wall,
        usage.ru_utime + usage.ru_stime,
        usage.ru_maxrss / 1024,
        (load0, os.getloadavg()[0]),
        stages.group(0) if stages else "",
    )


def _count_lines(paths: list[Path]) -> int:
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            while b := f.read(1 << 24):
                n += b.count(b"\n")
    return n


def _configs_as_package(tree: Path) -> None:
    """Make a plain source tree's configs/ importable as dlrm_cache.configs, as an install does
    (else the installed package's configs would be found first)."""
    pkg = tree / "dlrm_cache" / "configs"
    if not pkg.exists():
        shutil.copytree(tree / "configs", pkg)
        (pkg / "__init__.py").touch()


_PEER = """
import sys
from torchrec.datasets.criteo import BinaryCriteoUtils
src, out = sys.argv[1], sys.argv[2]
BinaryCriteoUtils.tsv_to_npys(
    src, out + "/d.npy", out + "/s.npy", out + "/l.npy", dataset_name="criteo_kaggle"
)
"""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--input", required=True, help="raw Criteo files (a day_N directory or one file)"
    )
    ap.add_argument(
        "--baseline", help="root of the baseline source tree (its dlrm_cache/ is imported)"
    )
    ap.add_argument("--workers", type=int, nargs="+", default=[os.cpu_count() or 1])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--peer-lines", type=int, default=500_000, help="0: skip torchrec")
    ap.add_argument(
        "--work", default=None, help="scratch directory for the outputs (default: a temp dir)"
    )
    ap.add_argument(
        "overrides", nargs="*", help="extra preprocess overrides, e.g. hash_modulus=40000000"
    )
    args = ap.parse_args(argv)

    inp = Path(args.input).resolve()
    files = sorted(inp.glob("day_*")) if inp.is_dir() else [inp]
    lines = _count_lines(files)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-preprocess-"))
    work.mkdir(parents=True, exist_ok=True)
    here = str(Path(__file__).resolve().parents[2])
    base = [
        sys.executable,
        "-m",
        "dlrm_cache",
        "preprocess",
        f"input={inp}",
        "overwrite=true",
        "progress=false",
        *args.overrides,
    ]
    variants: list[tuple[str, list[str], dict[str, str]]] = []
    if args.baseline:
        _configs_as_package(Path(args.baseline).resolve())
        env = {**os.environ, "PYTHONPATH": str(Path(args.baseline).resolve())}
        variants.append(("baseline", [*base, f"output={work}/baseline"], env))
    for w in args.workers:
        env = {**os.environ, "PYTHONPATH": here}
        variants.append((f"workers={w}", [*base, f"output={work}/w{w}", f"workers={w}"], env))

    print(
        f"input {inp}: {len(files)} file(s), {lines:,} lines; {os.cpu_count()} cores; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(
        "| run | lines | wall s | lines/s | CPU s | lines per CPU s | CPU use "
        "| peak RSS MB (largest process) "
        "| load before / after |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    results: list[Result] = []
    for _ in range(args.repeats):
        for name, cmd, env in variants:
            r = _run(name, cmd, env, lines, work)  # not here: the cwd comes first on sys.path
            results.append(r)
            print(r.row(), flush=True)
    if args.peer_lines:
        head = work / "peer-input.tsv"
        with open(files[0], "rb") as src, open(head, "wb") as dst:
            for _, line in zip(range(args.peer_lines), src):
                dst.write(line)
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(dir=work) as out:
                r = _run(
                    "torchrec tsv_to_npys",
                    [sys.executable, "-c", _PEER, str(head), out],
                    dict(os.environ),
                    args.peer_lines,
                    work,
                )
            results.append(r)
            print(r.row(), flush=True)
    for r in results:
        if r.stages:
            print(f"{r.name}: {r.stages}")
    best: dict = {}
    for r in results:
        best[r.name] = max(best.get(r.name, 0.0), r.lines / r.wall)
    if "baseline" in best:
        for name, rate in best.items():
            print(f"{name}: {rate:,.0f} lines/s (best), {rate / best['baseline']:.2f}x baseline")


if __name__ == "__main__":
    main()
