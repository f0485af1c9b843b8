"""`dlrm-cache <command> <hydra overrides>`: a tiny dispatcher in front of one @hydra.main per command.

Hydra owns the whole command line of an app and has no subcommands, so the command word is popped
here and the rest (overrides, -m, --cfg job, --help, ...) goes to that command's Hydra app.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

import hydra
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from .configstore import config_dir, register_configs
from .console import quiet_known_noise
from .data.format import WriteError
from .outputs import Stopped
from .ranges import validate

register_configs()
CONFIGS = config_dir()


def _synth(cfg: DictConfig) -> None:
    from .data.synth import synth

    synth(cfg)


def _preprocess(cfg: DictConfig) -> None:
    from .data.preprocess import preprocess

    preprocess(cfg)


def _train(cfg: DictConfig) -> None:
    from .train.loop import train

    train(cfg)
    if int(os.environ.get("RANK", "0")) == 0:  # torchrun: every rank ran this job, one tells
        print(_train_epilogue(cfg.run_dir))


def _train_epilogue(run_dir: str) -> str:
    """Where the run's files are and how to look at them (and at the whole sweep, under -m)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from .rundir import METRICS, SUMMARY

    lines = [
        f"run files: {run_dir}/ ({METRICS}, {SUMMARY}, checkpoints/, .hydra/)",
        f"plots:     dlrm-cache report {run_dir}",
    ]
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        sweep_dir = Path(hc.runtime.cwd) / hc.sweep.dir  # as absolute as run_dir
        lines.append(f"sweep:     dlrm-cache report {sweep_dir}   (once every job has finished)")
    return "\n".join(lines)


def _plan(cfg: DictConfig) -> None:
    from .cache_sizing import plan

    plan(cfg)


def _bench(cfg: DictConfig) -> None:
    from .bench import BenchFailed
    from .bench.run import bench

    try:
        bench(cfg)
    except BenchFailed as e:  # the rows and their tracebacks are printed above
        print(f"dlrm-cache bench: failed: {e}", file=sys.stderr)
        raise SystemExit(1) from None


def _report(cfg: DictConfig, run_dirs: tuple[str, ...] = ()) -> None:
    from .report import report

    cfg.runs = [*run_dirs, *cfg.runs]
    report(cfg)


def _verify(cfg: DictConfig, paths: tuple[str, ...] = ()) -> None:
    from .verify import verify

    if len(paths) > 1:
        raise ValueError(f"verify takes one dataset directory, not {len(paths)}: {' '.join(paths)}")
    if paths:
        cfg.data_path = paths[0]
    verify(cfg)


def _predict(cfg: DictConfig) -> None:
    from .predict import predict

    predict(cfg)


def _export(cfg: DictConfig) -> None:
    from .export import export

    export(cfg)


# command -> (config name, function, one-line help)
COMMANDS: dict[str, tuple[str, Callable[[DictConfig], None], str]] = {
    "synth": (
        "synth",
        _synth,
        "write Criteo-format lines from a planted model (and its oracle AUC)",
    ),
    "preprocess": (
        "preprocess",
        _preprocess,
        "raw Criteo logs -> frequency stats + parquet shards",
    ),
    "train": (
        "train",
        _train,
        "train and evaluate a DLRM (embedding=host|hbm|uvm_cache|freq_cache)",
    ),
    "plan": ("plan", _plan, "predict the cache hit rate per cache ratio from the frequency stats"),
    "bench": (
        "bench",
        _bench,
        "benchmarks: embedding layer, training step, planning, input pipeline, preprocess",
    ),
    "report": (
        "report",
        _report,
        "plots + a markdown summary of run directories or a -m sweep directory",
    ),
    "verify": (
        "verify",
        _verify,
        "read every shard of a processed dataset and check it against its manifest",
    ),
    "predict": (
        "predict",
        _predict,
        "click probabilities of a trained run for raw Criteo lines or a split",
    ),
    "export": (
        "export",
        _export,
        "a trained run as a torchrec DLRM state dict + constructor arguments",
    ),
}


# What bad input raises (with a message naming the file, line or config key): shown as one line.
# The OSErrors are those of a path the user gave (their message names it), never a bug of ours;
# WriteError: a file that could not be written (disk full, quota), named.
USER_ERRORS = (
    ValueError,
    IndexError,
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    WriteError,
    OSError,  # OSError: also a link loop (ELOOP), an I/O error (EIO), ... of a path given
)


def _friendly(command: str, fn: Callable[[DictConfig], None]) -> Callable[[DictConfig], None]:
    """Checks the composed config's ranges before the command builds anything; one line on stderr
    and exit status 1 for bad input; tracebacks stay for real bugs (set DLRM_CACHE_TRACEBACK=1 to
    see them for bad input too)."""

    def run(cfg: DictConfig) -> None:
        try:
            validate(cfg)
            fn(cfg)
        except USER_ERRORS as e:
            if os.environ.get("DLRM_CACHE_TRACEBACK"):
                raise
            print(f"dlrm-cache {command}: error: {e}", file=sys.stderr)
            raise SystemExit(1) from None
        except KeyboardInterrupt:  # Ctrl-C outside train's steps (those save a checkpoint first)
            print(f"dlrm-cache {command}: interrupted", file=sys.stderr)
            raise SystemExit(130) from None
        except Stopped as e:  # SIGTERM/SIGHUP where a command turns them into an exception
            print(f"dlrm-cache {command}: stopped by {e}", file=sys.stderr)
            raise SystemExit(128 + e.signum) from None

    return run


def split_run_dirs(argv: list[str]) -> tuple[list[str], list[str]]:
    """``dlrm-cache report RUN [RUN ...] [overrides]``: (the leading run directories, the rest).

    Hydra takes only overrides, and a path is not one (nor safe to quote into one), so the paths a
    user types (as `train` prints them) are taken off here; ``runs=[a,b]`` works as well.
    """
    n = 0
    while n < len(argv) and (
        os.path.isdir(argv[n]) or ("=" not in argv[n] and not argv[n].startswith("-"))
    ):
        n += 1
    return argv[:n], argv[n:]


def usage() -> str:
    lines = [
        "usage: dlrm-cache <command> [hydra overrides ...]",
        "       dlrm-cache report RUN_DIR [RUN_DIR ...] [hydra overrides ...]",
        "",
        "commands:",
    ]
    lines += [f"  {name:<11} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += [
        "",
        "`dlrm-cache <command> --help` lists that command's options;",
        "`dlrm-cache <command> --cfg job` prints the composed config.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_known_noise()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return
    command = argv.pop(0)
    if command not in COMMANDS:
        print(f"dlrm-cache: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        raise SystemExit(2)
    config_name, fn, _ = COMMANDS[command]
    if command == "report":
        run_dirs, argv = split_run_dirs(argv)
        fn = functools.partial(_report, run_dirs=tuple(run_dirs))
    if command == "verify":
        paths, argv = split_run_dirs(argv)
        fn = functools.partial(_verify, paths=tuple(paths))
    app = hydra.main(config_path=CONFIGS, config_name=config_name, version_base="1.3")(
        _friendly(command, fn)
    )
    sys.argv = [f"dlrm-cache {command}", *argv]
    if os.environ.get("DLRM_CACHE_TRACEBACK"):
        app()
        return
    # Hydra reports a bad override in several lines (and a search path); it hands the error to us
    # instead when HYDRA_FULL_ERROR is set, for the one line every other bad input gets.
    full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        app()
    except (HydraException, OmegaConfBaseException) as e:
        print(f"dlrm-cache {command}: error: {config_error(e)}", file=sys.stderr)
        raise SystemExit(1) from None
    except (
        OSError
    ) as e:  # Hydra's own files: the output directory (hydra.run.dir), .hydra/, the log
        print(f"dlrm-cache {command}: error: hydra.run.dir: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        if full_error is None:
            del os.environ["HYDRA_FULL_ERROR"]
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error


def config_error(e: BaseException) -> str:
    """A Hydra/OmegaConf composition error on one line: what failed, why (the cause's first line),
    and for a missing group option the ones there are."""
    first = str(e).split("\n", 1)[0]
    if isinstance(e, MissingConfigException) and "Available options" in str(e):
        listed = str(e).split("Available options", 1)[1].split("Config search path", 1)[0]
        options = [o.strip() for o in listed.splitlines()[1:] if o.strip()]
        return f"{first}; choose one of: {', '.join(options)}"
    if e.__cause__ is not None:
        cause = str(e.__cause__).split("\n", 1)[0]
        return f"{first.rstrip('.')}: {cause}"
    return first


if __name__ == "__main__":
    main()
