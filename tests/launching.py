"""Starting the CLI or several ranks from a test, on the CPU (gloo): ``dlrm-cache`` in the test's
process (or, where the process is the subject, as a child process), a command to signal or kill
forked from a preloaded fork server, ranks forked from that server through torch's elastic
launcher (what torchrun runs), or the real `torchrun` command line (docs/development.md, "How the
suite stays fast")."""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, ClassVar

from torch.distributed.launcher.api import LaunchConfig, elastic_launch

REPO = Path(__file__).resolve().parents[1]


def run_cli(
    *args: str,
    cwd: Path,
    env_extra: dict | None = None,
    timeout: float = 300,
    plain_errors: bool = False,
    process: bool = False,
) -> subprocess.CompletedProcess:
    """``dlrm-cache ARGS`` run in ``cwd``, its exit status and its output captured as a child
    process's would be; ``plain_errors``: without ``DLRM_CACHE_TRACEBACK`` (bad input as users see
    it); ``env_extra``: environment variables set for the run.

    In this process (:func:`run_in_process`) unless ``process``: a child process costs 3-4 s of
    imports (torch, torchrec, fbgemm) on a 2-core CPU and asserts nothing more, except where the
    test is about the process itself (its interpreter's start, its locale, a reader that leaves,
    a signal), which asks for ``process=True``."""
    if process:
        return run_process(*args, cwd=cwd, env_extra=env_extra, timeout=timeout,
                           plain_errors=plain_errors)  # fmt: skip
    return run_in_process(
        *args, cwd=cwd, env_extra=env_extra, plain_errors=plain_errors, timeout=timeout
    )


def run_process(
    *args: str,
    cwd: Path,
    env_extra: dict | None = None,
    timeout: float = 300,
    plain_errors: bool = False,
) -> subprocess.CompletedProcess:
    """``python -m dlrm_cache ARGS`` as a child process in ``cwd`` with this checkout's package."""
    env = child_env(plain_errors=plain_errors, **(env_extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "dlrm_cache", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def child_env(*, plain_errors: bool = False, **extra: str) -> dict[str, str]:
    """The environment of a child Python that imports this checkout's package: this process's,
    ``extra`` added; ``plain_errors``: without ``DLRM_CACHE_TRACEBACK`` (bad input as users see
    it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **extra}
    if plain_errors:
        env.pop("DLRM_CACHE_TRACEBACK", None)
    return env


def run_in_process(
    *args: str,
    cwd: Path,
    env_extra: dict | None = None,
    plain_errors: bool = False,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """``dlrm_cache.cli.main(ARGS)`` in this process as ``python -m dlrm_cache ARGS`` would run
    it: in ``cwd``, with ``sys.argv[0]`` the module's path, standard output and error read from
    descriptors 1 and 2 (what a library writes there at the C level included), warnings shown on
    standard error under a new interpreter's filters (pytest's own capture of warnings would hide
    them from a test of a clean console), the exit status from ``SystemExit``, and an exception
    that escapes printed as the interpreter prints it (status 1).  The working directory,
    ``sys.argv``, the environment and the loggers' handlers and levels (Hydra configures them per
    job) are restored afterwards.  A command still running after ``timeout`` s ends this process
    with every thread's traceback (a failure where a child would have been killed, not a hang).

    What it cannot see: messages a library prints when first imported (this process imported it
    already) and at the interpreter's exit; a test about those runs a child (``process=True``)."""
    from dlrm_cache.cli import main

    env = {**(env_extra or {})}
    saved_env = {k: os.environ.get(k) for k in [*env, "DLRM_CACHE_TRACEBACK"]}
    saved_cwd, saved_argv = os.getcwd(), list(sys.argv)
    alarm = os.dup(2)  # where a hang's tracebacks go: the test's stderr, not the captured one
    faulthandler.dump_traceback_later(timeout, exit=True, file=alarm)
    with _loggers_restored(), _standard_streams_read() as texts:
        os.environ.update(env)
        if plain_errors:
            os.environ.pop("DLRM_CACHE_TRACEBACK", None)
        try:
            os.chdir(cwd)
            sys.argv = [str(REPO / "dlrm_cache" / "__main__.py"), *args]
            with warnings.catch_warnings():
                _new_interpreter_warnings()
                code = _exit_status(main, list(args))
        finally:
            os.chdir(saved_cwd)
            sys.argv = saved_argv
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            faulthandler.cancel_dump_traceback_later()
            os.close(alarm)
    return subprocess.CompletedProcess(["dlrm-cache", *args], code, texts[0], texts[1])


@contextmanager
def _standard_streams_read() -> Iterator[list[str]]:
    """Descriptors 1 and 2 (and ``sys.stdout``/``sys.stderr`` over them) sent to files inside the
    block; the list it yields holds their texts once the block has ended, and the descriptors and
    streams are as they were."""
    texts: list[str] = []
    saved = sys.stdout, sys.stderr
    for stream in saved:
        stream.flush()
    fds = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
        try:
            yield texts
        finally:
            for stream in (sys.stdout, sys.stderr):
                with suppress(OSError, ValueError):
                    stream.flush()
            _LIBC.fflush(None)  # what a C library buffered in its stdout
            for fd, saved_fd in zip((1, 2), fds):
                os.dup2(saved_fd, fd)
                os.close(saved_fd)
            sys.stdout, sys.stderr = saved
            for f in (out, err):
                f.seek(0)
                texts.append(f.read().decode("utf-8", errors="replace"))


_LIBC = ctypes.CDLL(None)


@contextmanager
def _loggers_restored() -> Iterator[None]:
    """Every logger's handlers, level and propagation as they were before the block, but for a
    file handler the block closed (Hydra's logging set-up closes the handlers it replaces: one may
    log to an earlier run's removed directory); a handler the block added is closed (Hydra's file
    handler on a run's log)."""
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    saved = {lg: (list(lg.handlers), lg.level, lg.propagate, lg.disabled) for lg in loggers}
    try:
        yield
    finally:
        for lg, (handlers, level, propagate, disabled) in saved.items():
            for h in lg.handlers:
                if h not in handlers:
                    h.close()
            lg.handlers[:] = [
                h for h in handlers if not (isinstance(h, logging.FileHandler) and h.stream is None)
            ]
            lg.setLevel(level)
            lg.propagate, lg.disabled = propagate, disabled


def _new_interpreter_warnings() -> None:
    """Warnings as a new interpreter (no ``-W``, not in development mode) treats them: its
    default filters, and shown on ``sys.stderr``."""
    warnings.resetwarnings()
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.simplefilter("ignore", category)
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    warnings.showwarning = show


def _exit_status(main: Callable[[list[str]], None], argv: list[str]) -> int:
    """``main(argv)``'s exit status as the interpreter would make it."""
    try:
        main(argv)
        return 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return int(e.code or 0)
        print(e.code, file=sys.stderr)
        return 1
    except Exception:
        traceback.print_exc()
        return 1


# `python -m torch.distributed.run ... -m dlrm_cache`: 2 ranks on this machine; the command word
# and its overrides follow
TORCHRUN_2 = [
    sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
    "-m", "dlrm_cache",
]  # fmt: skip


# What the fork server imports once, so that each child it forks (a rank of launch_ranks, a
# killed or signalled command) starts in milliseconds instead of importing torch, torchrec and
# fbgemm (3-4 s each on a 2-core CPU).  The server is a new interpreter (started for the first
# child) that runs nothing but these imports, so forking from it is safe.
FORKSERVER_PRELOAD = ["torch", "dlrm_cache.cli", "dlrm_cache.train.loop", "dlrm_cache.data.verify"]


def forkserver() -> Any:
    """The multiprocessing context whose children fork from a server that imported
    :data:`FORKSERVER_PRELOAD` (one server per test process, whichever module starts it)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    return ctx


class ForkedCli:
    """``dlrm-cache ARGS`` running in ``cwd`` in a child forked from :func:`forkserver`'s server,
    for a test that signals or kills it (as ``subprocess.Popen`` would run it, without the
    interpreter's start-up): without ``DLRM_CACHE_TRACEBACK``, one thread of torch's, standard
    output and error kept in files until :meth:`communicate`."""

    running: ClassVar[list[ForkedCli]] = []  # started, not yet waited for (see end_all)

    def __init__(self, *args: str, cwd: Path) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="forked-cli-"))
        self._out, self._err = self._dir / "stdout", self._dir / "stderr"
        # the environment of now, not the fork server's (a copy of the test process's at its start)
        env = dict(os.environ)
        self._process = forkserver().Process(
            target=_cli_child, args=(list(args), str(cwd), str(self._out), str(self._err), env)
        )
        self._process.start()
        self.pid: int = self._process.pid
        ForkedCli.running.append(self)

    @classmethod
    def end_all(cls) -> None:
        """Kill the children a failed test left running (a non-daemon child would keep the test
        process from exiting) and remove their files."""
        while cls.running:
            job = cls.running.pop()
            if job._process.is_alive():
                job._process.kill()
            job._process.join()
            shutil.rmtree(job._dir, ignore_errors=True)

    @property
    def returncode(self) -> int | None:
        """The exit status (``-N``: ended by signal N), None while it runs."""
        return self._process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def ended_within(self, timeout: float) -> bool:
        """Whether it ended within ``timeout`` s (killed, if not)."""
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
            return False
        return True

    def communicate(self, timeout: float = 300) -> tuple[str, str]:
        """Wait for the end (at most ``timeout`` s, else fail); its standard output and error."""
        self._process.join(timeout)
        assert not self._process.is_alive(), f"dlrm-cache did not end within {timeout} s"
        out, err = (p.read_text() if p.exists() else "" for p in (self._out, self._err))
        shutil.rmtree(self._dir, ignore_errors=True)
        if self in ForkedCli.running:
            ForkedCli.running.remove(self)
        return out, err


def _cli_child(args: list[str], cwd: str, out: str, err: str, env: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    os.environ.pop("DLRM_CACHE_TRACEBACK", None)
    import torch

    torch.set_num_threads(1)  # children and pytest share the cores
    from dlrm_cache.cli import main

    sys.argv = [str(REPO / "dlrm_cache" / "__main__.py"), *args]
    main(args)


def launch_ranks(nproc: int, entry: Callable[..., Any], *args: Any) -> dict[int, Any]:
    """``entry(*args)`` in ``nproc`` ranks (one process group) forked from :func:`forkserver`'s
    server, as torchrun starts them but without an interpreter's start-up each; each rank's
    result.  The ranks' environment is the server's (the test process's when the server
    started) plus the launcher's variables: an ``entry`` sets what else it needs."""
    forkserver()
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="forkserver",
    )
    return elastic_launch(config, entry)(*args)
