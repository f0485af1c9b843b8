"""``bench kind=preprocess``: preprocessing throughput side by side: this checkout, a baseline tree
and torchrec's parser, and where this checkout's CPU time goes (parse, count, encode, write).

    dlrm-cache bench kind=preprocess preprocess_input=RAW [preprocess_baseline=SRC] \\
        [workers=[1,2]] [repeats=2] [peer_lines=500000] [work_dir=DIR] [output=FILE.json]

(``python -m dlrm_cache.bench.preprocess --input RAW [--baseline SRC] [--workers 1 2] ...`` runs
the same function.)  Each run is ``python -m dlrm_cache preprocess`` in a fresh process on the same
raw files (both passes, output written, ``overwrite=true``), run in turn A B A B ... so machine
load hits every variant alike; ``preprocess_baseline`` is the root of another source tree (e.g.
``git worktree add /tmp/base c40961b``) put first on ``PYTHONPATH``.  The peer is torchrec's
``BinaryCriteoUtils.tsv_to_npys`` (text -> npy, no frequency counting or id remapping) on the first
``peer_lines`` lines of the first file.  Printed per run: wall seconds, lines/s, CPU use, the peak
RSS of the largest process (the parent or one worker) and, for a tree that reports them (this
checkout), its CPU seconds per stage.  On a shared machine ``lines per CPU s`` (CPU time of the
whole process tree, imports included) is the steadier figure: wall time there measures the other
users' load as much as the code.  Machine load (``os.getloadavg``) is printed before and after
every run: compare ratios within one invocation.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

from ..config.choices import BenchKind
from ..config.ranges import validate
from ..config.schemas import BenchConfig
from ..data.preprocess.errors import PreprocessError
from ..data.preprocess.sources import find_sources
from ..data.preprocess.workers import available_cores
from . import BenchFailed

# what `dlrm-cache preprocess` prints at its end (data/preprocess/build.py's Timings.line)
_TIMINGS = re.compile(r"preprocess: CPU seconds per stage: (.*); wall seconds: (.*)")


@dataclass
class Result:
    name: str
    lines: int
    wall: float
    cpu: float
    max_rss_mb: float
    load: tuple[float, float]
    cpu_per_stage: dict[str, float] = field(default_factory=dict)  # empty: not reported
    wall_per_phase: dict[str, float] = field(default_factory=dict)

    def row(self) -> str:
        return (
            f"| {self.name} | {self.lines:,} | {self.wall:.2f} | {self.lines / self.wall:,.0f} | "
            f"{self.cpu:.1f} | {self.lines / self.cpu:,.0f} | {100 * self.cpu / self.wall:.0f}% | "
            f"{self.max_rss_mb:,.0f} | {self.load[0]:.1f} / {self.load[1]:.1f} |"
        )

    def record(self) -> dict[str, Any]:
        """The run as JSON data (``output=``)."""
        return {
            "run": self.name,
            "lines": self.lines,
            "wall_s": self.wall,
            "lines_per_s": self.lines / self.wall,
            "cpu_s": self.cpu,
            "lines_per_cpu_s": self.lines / self.cpu,
            "max_rss_mb": self.max_rss_mb,
            "load_before": self.load[0],
            "load_after": self.load[1],
            "cpu_s_per_stage": self.cpu_per_stage,
            "wall_s_per_phase": self.wall_per_phase,
        }


def _seconds(listing: str) -> dict[str, float]:
    """``"parse 7.5, stage 1.6"`` -> ``{"parse": 7.5, "stage": 1.6}``."""
    out = {}
    for item in listing.split(","):
        name, _, secs = item.strip().rpartition(" ")
        out[name] = float(secs)
    return out


# A run is started by this small process (`python -I -S`, stdlib only), which prints the run's
# wall time and rusage once it has ended: on Linux a child's peak RSS starts from that of the
# process it was spawned from (the high-water mark before exec is kept), and this process holds
# pyarrow (and under `dlrm-cache bench`, torch): hundreds of MB the run itself never used.
_MEASURE = """
import os, sys, time
t0 = time.perf_counter()
pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ)
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t0
print(f"\\nbench-rusage {wall} {ru.ru_utime + ru.ru_stime} {ru.ru_maxrss}", flush=True)
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""
_USAGE = re.compile(r"\nbench-rusage ([\d.e+-]+) ([\d.e+-]+) (\d+)\n*\Z")  # _MEASURE's last line


def _run(name: str, cmd: list[str], env: dict[str, str], lines: int, cwd: Path) -> Result:
    load0 = os.getloadavg()[0]
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _MEASURE, *cmd],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    usage = _USAGE.search(proc.stdout)
    out = _USAGE.sub("", proc.stdout)  # the run's own output
    if proc.returncode != 0 or usage is None:
        print(f"--- {name}: the last of its output\n{out[-3000:]}", file=sys.stderr)
        last = (out.strip().splitlines() or [""])[-1]
        raise BenchFailed(f"{name}: exit status {proc.returncode}: {last}")
    timings = _TIMINGS.search(out)
    return Result(
        name,
        lines,
        float(usage.group(1)),
        float(usage.group(2)),
        int(usage.group(3)) / 1024,
        (load0, os.getloadavg()[0]),
        _seconds(timings.group(1)) if timings else {},
        _seconds(timings.group(2)) if timings else {},
    )


def _open(path: Path) -> BinaryIO:
    """A raw file's bytes (a .gz one decompressed, as preprocess reads it)."""
    if path.suffix == ".gz":
        return cast(BinaryIO, gzip.open(path, "rb"))
    return open(path, "rb")


def _count_lines(paths: list[Path]) -> int:
    n = 0
    for p in paths:
        with _open(p) as f:
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


def _inputs(cfg: Any) -> tuple[Path, list[Path], Path | None]:
    """The raw input, its files and the baseline tree, each checked (a bad one: one line naming
    its key)."""
    if not cfg.preprocess_input:
        raise ValueError(
            "preprocess_input: kind=preprocess needs raw Criteo text "
            "(a file, or a directory of day_N files)"
        )
    inp = Path(cfg.preprocess_input).resolve()
    if not inp.exists():
        raise FileNotFoundError(
            f"preprocess_input={cfg.preprocess_input}: no such file or directory"
        )
    try:
        files = find_sources(inp)
    except PreprocessError as e:
        raise ValueError(f"preprocess_input={cfg.preprocess_input}: {e}") from None
    baseline = None
    if cfg.preprocess_baseline:
        baseline = Path(cfg.preprocess_baseline).resolve()
        if not (baseline / "dlrm_cache").is_dir() or not (baseline / "configs").is_dir():
            raise ValueError(
                f"preprocess_baseline={cfg.preprocess_baseline}: not a dlrm-cache source tree "
                "(no dlrm_cache/ and configs/ in it)"
            )
    return inp, files, baseline


def preprocess_bench(cfg: Any) -> list[dict[str, Any]]:
    """kind=preprocess: every variant ``repeats`` times, interleaved, then the peer; prints the
    table, the CPU seconds per stage and the best rate per variant; returns one record per run.

    ``cfg``: a :class:`~dlrm_cache.config.schemas.BenchConfig` (or the composed config of `bench`)."""
    inp, files, baseline = _inputs(cfg)
    lines = _count_lines(files)
    work = Path(cfg.work_dir or tempfile.mkdtemp(prefix="bench-preprocess-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        results = _runs(cfg, inp, files, lines, baseline, work)
    finally:
        if not cfg.work_dir:  # a temp dir of ours: the outputs can be as large as the input
            shutil.rmtree(work, ignore_errors=True)
    _summary(results)
    return [r.record() for r in results]


def _runs(
    cfg: Any, inp: Path, files: list[Path], lines: int, baseline: Path | None, work: Path
) -> list[Result]:
    here = str(Path(__file__).resolve().parents[2])
    base = [
        sys.executable,
        "-m",
        "dlrm_cache",
        "preprocess",
        f"input={inp}",
        "overwrite=true",
        "progress=false",
        *(f"{k}={v}" for k, v in (cfg.preprocess_overrides or {}).items()),
    ]
    variants: list[tuple[str, list[str], dict[str, str]]] = []
    # the tree first, then whatever path the caller had (an offline bundle's packages)
    rest = os.environ.get("PYTHONPATH", "")

    def path(tree: str) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (tree, rest) if p)}

    if baseline is not None:
        _configs_as_package(baseline)
        variants.append(("baseline", [*base, f"output={work}/baseline"], path(str(baseline))))
    cores = available_cores()
    for w in dict.fromkeys(w or cores for w in cfg.workers):  # 0: what preprocess would use
        env = path(here)
        variants.append((f"workers={w}", [*base, f"output={work}/w{w}", f"workers={w}"], env))

    print(
        f"dlrm-cache bench kind=preprocess input={inp}: {len(files)} file(s), {lines:,} lines; "
        f"{cores} usable cores; load {os.getloadavg()[0]:.1f}; "
        f"outputs in {work}{'' if cfg.work_dir else ' (removed at the end)'}"
    )
    print(
        "| run | lines | wall s | lines/s | CPU s | lines per CPU s | CPU use "
        "| peak RSS MB (largest process) "
        "| load before / after |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    results: list[Result] = []
    for _ in range(cfg.repeats):
        for name, cmd, env in variants:
            r = _run(name, cmd, env, lines, work)  # not here: the cwd comes first on sys.path
            results.append(r)
            print(r.row(), flush=True)
    if cfg.peer_lines:
        head = work / "peer-input.tsv"
        with _open(files[0]) as src, open(head, "wb") as dst:
            for _, line in zip(range(cfg.peer_lines), src):
                dst.write(line)
        peer_lines = _count_lines([head])  # the first file may hold fewer
        for _ in range(cfg.repeats):
            with tempfile.TemporaryDirectory(dir=work) as out:
                r = _run(
                    "torchrec tsv_to_npys",
                    [sys.executable, "-c", _PEER, str(head), out],
                    dict(os.environ),
                    peer_lines,
                    work,
                )
            results.append(r)
            print(r.row(), flush=True)
    return results


def _summary(results: list[Result]) -> None:
    """Where the CPU time went, per run that reported it, and the best rate per variant."""
    staged = [r for r in results if r.cpu_per_stage]
    if staged:
        stages = list(dict.fromkeys(s for r in staged for s in r.cpu_per_stage))
        print(
            "\nCPU seconds per stage (all processes of the run; stage = write parts, "
            "read = read parts, write = write shards):"
        )
        print(f"| run | {' | '.join(stages)} | CPU us per line | wall s per phase |")
        print("|---|" + "---|" * (len(stages) + 2))
        for r in staged:
            cells = " | ".join(f"{r.cpu_per_stage.get(s, 0.0):.1f}" for s in stages)
            phases = ", ".join(f"{k} {v:.1f}" for k, v in r.wall_per_phase.items())
            per_line = 1e6 * sum(r.cpu_per_stage.values()) / max(r.lines, 1)
            print(f"| {r.name} | {cells} | {per_line:.2f} | {phases} |")
    best: dict[str, float] = {}
    for r in results:
        best[r.name] = max(best.get(r.name, 0.0), r.lines / r.wall)
    print()
    for name, rate in best.items():
        vs = f", {rate / best['baseline']:.2f}x baseline" if "baseline" in best else ""
        print(f"{name}: {rate:,.0f} lines/s (best){vs}")


def main(argv: list[str] | None = None) -> None:
    """The same benchmark with argparse options (defaults: BenchConfig's)."""
    defaults = BenchConfig()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--input", required=True, help="raw Criteo files (a day_N directory or one file)"
    )
    ap.add_argument(
        "--baseline", help="root of the baseline source tree (its dlrm_cache/ is imported)"
    )
    ap.add_argument("--workers", type=int, nargs="+", default=defaults.workers)
    ap.add_argument("--repeats", type=int, default=defaults.repeats)
    ap.add_argument("--peer-lines", type=int, default=defaults.peer_lines, help="0: skip torchrec")
    ap.add_argument(
        "--work", default=None, help="scratch directory for the outputs (default: a temp dir)"
    )
    ap.add_argument(
        "overrides", nargs="*", help="extra preprocess overrides, e.g. hash_modulus=40000000"
    )
    args = ap.parse_args(argv)
    overrides: dict[str, Any] = {}
    for o in args.overrides:
        key, eq, value = o.partition("=")
        if not eq:
            ap.error(f"{o!r} is not a preprocess override (key=value)")
        overrides[key] = value
    cfg = BenchConfig(
        kind=BenchKind.preprocess,
        preprocess_input=args.input,
        preprocess_baseline=args.baseline,
        workers=args.workers,
        repeats=args.repeats,
        peer_lines=args.peer_lines,
        work_dir=args.work,
        preprocess_overrides=overrides,
    )
    try:
        validate(cfg)
        preprocess_bench(cfg)
    except (ValueError, OSError, BenchFailed) as e:
        raise SystemExit(f"bench kind=preprocess: error: {e}") from None


if __name__ == "__main__":
    main()
