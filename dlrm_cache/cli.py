"""`dlrm-cache <command> <hydra overrides>`: a tiny dispatcher in front of one @hydra.main per command.

Hydra owns the whole command line of an app and has no subcommands, so the command word is popped
here and the rest (overrides, -m, --cfg job, --help, ...) goes to that command's Hydra app.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import hydra
from omegaconf import DictConfig

from .config import config_dir, register_configs

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


def _plan(cfg: DictConfig) -> None:
    from .plan import plan

    plan(cfg)


def _bench(cfg: DictConfig) -> None:
    from .bench.run import bench

    bench(cfg)


# command -> (config name, function, one-line help)
COMMANDS: dict[str, tuple[str, Callable[[DictConfig], None], str]] = {
    "synth": ("synth", _synth, "write Criteo-format lines from a planted model (and its oracle AUC)"),
    "preprocess": ("preprocess", _preprocess, "raw Criteo logs -> frequency stats + parquet shards"),
    "train": ("train", _train, "train and evaluate a DLRM (embedding=host|hbm|uvm_cache|freq_cache)"),
    "plan": ("plan", _plan, "predict the cache hit rate per cache ratio from the frequency stats"),
    "bench": ("bench", _bench, "embedding-layer and training-step benchmarks"),
}


# What bad input raises (with a message naming the file, line or config key): shown as one line.
# OSError: a missing or unreadable file, a full disk (its message names the file).
USER_ERRORS = (ValueError, OSError, IndexError)


def _friendly(command: str, fn: Callable[[DictConfig], None]) -> Callable[[DictConfig], None]:
    """One line on stderr and exit status 1 for bad input; tracebacks stay for real bugs
    (set DLRM_CACHE_TRACEBACK=1 to see them for bad input too)."""

    def run(cfg: DictConfig) -> None:
        try:
            fn(cfg)
        except USER_ERRORS as e:
            if os.environ.get("DLRM_CACHE_TRACEBACK"):
                raise
            print(f"dlrm-cache {command}: error: {e}", file=sys.stderr)
            raise SystemExit(1) from None

    return run


def usage() -> str:
    lines = ["usage: dlrm-cache <command> [hydra overrides ...]", "", "commands:"]
    lines += [f"  {name:<11} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "`dlrm-cache <command> --help` lists that command's options;",
              "`dlrm-cache <command> --cfg job` prints the composed config."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return
    command = argv.pop(0)
    if command not in COMMANDS:
        print(f"dlrm-cache: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        raise SystemExit(2)
    config_name, fn, _ = COMMANDS[command]
    app = hydra.main(config_path=CONFIGS, config_name=config_name, version_base="1.3")(_friendly(command, fn))
    sys.argv = [f"dlrm-cache {command}", *argv]
    app()


if __name__ == "__main__":
    main()
