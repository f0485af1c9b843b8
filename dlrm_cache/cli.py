"""`dlrm-cache <command> <hydra overrides>`: a tiny dispatcher in front of one @hydra.main per command.

Hydra owns the whole command line of an app and has no subcommands, so the command word is popped
here and the rest (overrides, -m, --cfg job, --help, ...) goes to that command's Hydra app.
"""

from __future__ import annotations

import codecs
import difflib
import functools
import os
import sys
from collections.abc import Callable

import hydra
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from .commands import (
    bench,
    export,
    plan,
    predict,
    preprocess,
    report,
    synth,
    train,
    verify,
)
from .commands.help import HELP_FLAGS, POSITIONAL, command_help, shell_completion
from .commands.store import config_dir, register_configs
from .commands.sweep import output_clash, suggestion
from .config.ranges import bool_overrides, validate
from .console.say import quiet_known_noise, say, standard_streams
from .console.typed import ARGV0
from .files.atomic import WriteError
from .files.outputs import Stopped, UnsafeOutput

register_configs()
CONFIGS = config_dir()


# command -> (config name, its module's run, one-line help)
COMMANDS: dict[str, tuple[str, Callable[[DictConfig], None], str]] = {
    "synth": (
        "synth",
        synth.run,
        "write Criteo-format lines from a planted model (and its oracle AUC)",
    ),
    "preprocess": (
        "preprocess",
        preprocess.run,
        "raw Criteo logs -> frequency stats + parquet shards",
    ),
    "train": (
        "train",
        train.run,
        "train and evaluate a DLRM (embedding=host|hbm|uvm_cache|freq_cache)",
    ),
    "plan": (
        "plan",
        plan.run,
        "predict the cache hit rate per cache ratio from the frequency stats",
    ),
    "bench": (
        "bench",
        bench.run,
        "benchmarks: embedding layer, training step, planning, input pipeline, preprocess",
    ),
    "report": (
        "report",
        report.run,
        "plots + a markdown summary of run directories or a -m sweep directory",
    ),
    "verify": (
        "verify",
        verify.run,
        "read every shard of a processed dataset and check it against its manifest",
    ),
    "predict": (
        "predict",
        predict.run,
        "click probabilities of a trained run for raw Criteo lines or a split",
    ),
    "export": (
        "export",
        export.run,
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
            bool_overrides(cfg)
            validate(cfg)
            fn(cfg)
        except USER_ERRORS as e:
            if command == "train":  # a launch that failed leaves no empty run directory
                from .train.claim import discard_failed_launch

                discard_failed_launch()
            if os.environ.get("DLRM_CACHE_TRACEBACK"):
                raise
            if getattr(e, "quiet", False):  # every rank has it: rank 0 says it
                raise SystemExit(1) from None
            if not _refused_run_dir(e):  # another run's log is not this job's
                say(f"dlrm-cache {command}: error: {e}", console=False)  # the job's log file
            print(f"dlrm-cache {command}: error: {e}", file=sys.stderr)
            raise SystemExit(1) from None
        except KeyboardInterrupt:  # Ctrl-C outside train's steps (those save a checkpoint first)
            print(f"dlrm-cache {command}: interrupted", file=sys.stderr)
            raise SystemExit(130) from None
        except Stopped as e:  # SIGTERM/SIGHUP where a command turns them into an exception
            wrote = f" after it wrote output={e.wrote} (complete)" if e.wrote else ""
            print(f"dlrm-cache {command}: stopped by {e}{wrote}", file=sys.stderr)
            raise SystemExit(128 + e.signum) from None

    return run


def _refused_run_dir(e: BaseException) -> bool:
    """A train job refused its run directory (another run's, or locked by a job training in it):
    the log file Hydra opened there belongs to that run."""
    from .train.claim import RunDirTaken

    return isinstance(e, RunDirTaken)


def split_run_dirs(argv: list[str]) -> tuple[list[str], list[str]]:
    """``dlrm-cache report RUN [RUN ...] [overrides]``: (the run directories, the rest).

    Hydra takes only overrides, and a path is not one (nor safe to quote into one), so the paths a
    user types (as `train` prints them) are taken off here, before or after the overrides (a path
    after one was parsed as a broken override); ``runs=[a,b]`` works as well.  A word after a flag
    that takes a value (``--cfg job``) is that value.
    """
    paths: list[str] = []
    rest: list[str] = []
    for n, a in enumerate(argv):
        if n > 0 and argv[n - 1] in _VALUE_FLAGS:
            rest.append(a)
        elif os.path.isdir(a) or ("=" not in a and not a.startswith("-")):
            paths.append(a)
        else:
            rest.append(a)
    return paths, rest


# Hydra's flags that take the next word as their value
_VALUE_FLAGS = frozenset(
    ("--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path", "-cp",
     "--config-dir", "-cd", "--info", "-i", "--experimental-rerun")
)  # fmt: skip


def usage() -> str:
    lines = [
        "usage: dlrm-cache <command> [hydra overrides ...]",
        *(f"       dlrm-cache {c} {p}[hydra overrides ...]" for c, p in POSITIONAL.items()),
        "",
        "commands:",
    ]
    lines += [f"  {name:<11} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += [
        "",
        "`dlrm-cache <command> --help` lists that command's keys (type, default, range, meaning);",
        "`dlrm-cache <command> --cfg job` prints the composed config;",
        'bash completion: eval "$(dlrm-cache -sc install=bash)"',
    ]
    return "\n".join(lines)


def undecodable_argument(argv: list[str]) -> str | None:
    """Why an argument cannot name a file here, or None.  A process whose file system encoding is
    not UTF-8 (a legacy locale, or ``PYTHONUTF8=0`` under the C locale) decodes a non-ASCII path
    into other characters, or into escapes no file name has; pyarrow, which opens the dataset's
    files, takes names as UTF-8, so every file would read as missing or damaged."""
    encoding = codecs.lookup(sys.getfilesystemencoding()).name
    if encoding == "utf-8":
        return None
    odd = next((a for a in argv if not a.isascii()), None)
    if odd is None:
        return None
    shown = odd.encode("ascii", "backslashreplace").decode()
    return (
        f"{shown}: non-ASCII characters, which this process decodes as {encoding} (its locale), "
        "while the files are opened by UTF-8 names; run with PYTHONUTF8=1 or a UTF-8 locale"
    )


def main(argv: list[str] | None = None) -> None:
    argv = args = list(sys.argv[1:] if argv is None else argv)
    ARGV0[:] = [sys.argv[0]]
    quiet_known_noise()
    standard_streams()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return
    if "-sc" in argv or "--shell-completion" in argv:
        _answer("dlrm-cache", lambda: _completion(args))
        return
    command = argv.pop(0)
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"dlrm-cache: unknown command {command!r}{hint}\n\n{usage()}", file=sys.stderr)
        raise SystemExit(2)
    config_name, fn, summary = COMMANDS[command]
    if (problem := undecodable_argument(argv)) is not None:
        print(f"dlrm-cache {command}: error: {problem}", file=sys.stderr)
        raise SystemExit(1)
    if any(a in HELP_FLAGS for a in argv):
        _answer(
            f"dlrm-cache {command}",
            lambda: command_help(CONFIGS, command, config_name, summary, args),
            lambda line: suggestion(CONFIGS, config_name, args, line),
        )
        return
    if command == "report":
        run_dirs, argv = split_run_dirs(argv)
        fn = functools.partial(report.run, run_dirs=tuple(run_dirs))
    if command == "verify":
        paths, argv = split_run_dirs(argv)
        fn = functools.partial(verify.run, paths=tuple(paths))
    if (problem := output_clash(command, CONFIGS, config_name, argv)) is not None:
        print(f"dlrm-cache {command}: error: {problem}", file=sys.stderr)
        raise SystemExit(1)
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
        line = config_error(e)
        print(
            f"dlrm-cache {command}: error: {line}{suggestion(CONFIGS, config_name, argv, line)}",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    except (OSError, ValueError) as e:
        # Hydra's own files: the output directory (hydra.run.dir), .hydra/, the log (logging's
        # dictConfig reports a log file it cannot open as a ValueError caused by the OSError)
        cause = e if isinstance(e, OSError) else e.__cause__
        if not isinstance(cause, OSError):
            raise
        if command == "train":  # what Hydra wrote before it failed (a full disk: empty files)
            from .train.claim import _launched, discard_failed_launch

            for d in _launched:
                discard_failed_launch(d)
        print(f"dlrm-cache {command}: error: hydra.run.dir: {cause}", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        if full_error is None:
            del os.environ["HYDRA_FULL_ERROR"]
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error


def _completion(argv: list[str]) -> str:
    argv = ["-sc" if a == "--shell-completion" else a for a in argv]
    return shell_completion(CONFIGS, {c: name for c, (name, _, _) in COMMANDS.items()}, argv)


def _answer(
    who: str, text: Callable[[], str], hint: Callable[[str], str] = lambda line: ""
) -> None:
    """Print ``text()``: help or completion; a bad override is one line (with ``hint(line)``, a
    misspelt key's likely meaning) and exit status 1."""
    try:
        print(text())  # `| head`: the reader has what it wanted (console.ReaderMayLeave)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        line = config_error(e)
        print(f"{who}: error: {line}{hint(line)}", file=sys.stderr)
        raise SystemExit(1) from None


QUOTE_HINT = (
    "a value with characters Hydra's override grammar reserves (, = [ ] { } ( ) ' \" \\ or "
    "non-ASCII letters: a path's) is a string inside quotes, the override itself quoted for "
    "the shell: 'key=\"value\"'"
)


def config_error(e: BaseException) -> str:
    """A Hydra/OmegaConf composition error on one line: what failed, why (the cause's first line),
    and for a missing group option the ones there are."""
    inner: BaseException | None = e  # a resolver's refusal (train's run dir): its own line
    while inner is not None and not isinstance(inner, UnsafeOutput):
        inner = inner.__cause__ or inner.__context__
    if inner is not None:
        return str(inner)
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    first = lines[0] if lines else type(e).__name__
    if first.endswith(":") and len(lines) > 1:  # "In 'schema/x': ValidationError raised ...:"
        key = next((line for line in lines[2:] if line.startswith("full_key:")), None)
        return f"{first} {lines[1]}" + (f" ({key})" if key else "")
    if isinstance(e, OverrideParseException) or first.startswith("Ambiguous value for argument"):
        # a path holding `,` `=` `[` `'`, a space or a non-ASCII letter: Hydra's own lines say
        # neither which override (a parse error) nor that quotes make it a plain string
        if isinstance(e, OverrideParseException):
            return f"override {e.override}: {first}; {QUOTE_HINT}"
        return f"{first}: a list is key=[a,b], a sweep needs -m; {QUOTE_HINT}"
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
