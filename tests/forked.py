"""``python -m MODULE ARGS`` (or ``python SCRIPT ARGS``) as a real child process that skips the
interpreter start: the test worker forks, and the child turns itself into a fresh interpreter's
``__main__`` run before it executes the entry point.

Why: on the 2-core machines the suite runs on, a new interpreter spends ~15 s of CPU importing
torch, Lightning and torchmetrics (Lightning imports torchmetrics whole, which imports
torchvision's models, torch._dynamo and scipy.signal) before the first line of the test's
subject runs. Most of the suite's subprocess tests need a separate *process* (SIGKILL and
SIGTERM, exit statuses, Lightning's DDP launcher re-running ``sys.argv`` for rank 1), not a
separate *import*. The child here is a separate process: its own pid, signals, exit status,
working directory, environment, ``sys.argv`` and ``__main__`` (``__main__.__spec__.name`` is
the module, as under ``-m``, so Lightning relaunches ``python -m MODULE ...`` for the other
ranks; those are real interpreters unless ``fork_ranks`` forks them from rank 0 as well).

What a fork cannot give, the console path of each entry point and a cold import, stays covered
by ``tests/integration/conftest.py::run_cli`` (one real interpreter per entry point). Nor does it
serve ``torch.compile``: inductor in a forked child of the worker hangs on a lock, so compiled
runs keep their own interpreters.

What the child resets to look like a fresh interpreter: signal handlers and timers (pytest's
timeout, SIGTERM), faulthandler, ``sys.stdout``/``sys.stderr`` (line-buffered onto the pipes),
the logging handlers pytest installed on the root logger (and every stream handler a library
made at import is pointed at the new streams), the warning filters (as they were before pytest
changed them), ``torch``'s deterministic-algorithms flag, grad mode, matmul precision and
intra-op thread count (``_fresh_threads``).

The child's garbage collector never collects what it inherited (``gc.freeze()`` first, as
a fresh interpreter has none of it): a loader iterator of an earlier test, left in a reference
cycle, would otherwise shut down the *worker's* loader processes from the child's collector
(its ``__del__`` puts into their queues). What was seen: the worker's own collector later
shut those loaders down and waited 5 s per loader process for them; a child killed while it
held a queue's shared lock is the likely link, not shown (one cause of the 20-110 s stalls of full runs; one stall remains, tests/README.md).

A child made leader of its own process group: what it starts (DDP ranks, loader workers)
belongs to that group. The result's ``left_behind`` lists the members still running when it
ended; after a death by signal they are killed (they are orphans a real kill leaves too, and
hold the output pipes until they notice), after a normal exit they are left for the test to
see.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import io
import logging
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

_REPLACED_STREAMS: list[object] = []


class ForkedProcess:
    """The running child: what a ``subprocess.Popen`` offers the tests' ``on_line`` callbacks."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()      # the waiting loop and an on_line callback both poll

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def send_signal(self, signum: int) -> None:
        with self._lock:                   # not to a pid that was reaped (and maybe reused)
            if self.returncode is None:
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.02)
        return self.returncode


def run_main(target: str | Path, args: list[str], *, cwd: Path, env: dict | None = None,
             timeout: float = 300, merge_stderr: bool = False,
             on_line: Callable[[str, ForkedProcess], bool] | None = None,
             fork_ranks: bool = False) -> subprocess.CompletedProcess:
    """Run ``python -m target args`` (``target`` a module name) or ``python target args`` (a
    ``Path``) in a forked child; wait for it and return its exit status and output like
    ``subprocess.run(..., capture_output=True, text=True)`` (``returncode`` -N for signal N).

    ``env`` adds to the worker's environment (a key given None is removed). ``merge_stderr``:
    stderr into stdout, in order (``stderr=STDOUT``). ``on_line(line, process)`` sees every
    output line as it arrives (it may signal the process). Raises ``TimeoutError`` (after
    SIGKILL) if the child has not ended within ``timeout`` seconds. ``fork_ranks``: the DDP
    ranks Lightning's launcher starts are forked from the child too (``_RelaunchByFork``), not
    new interpreters (a rank forked from a rank that computed on two threads would hang in
    libgomp: see ``_fresh_threads``).
    """
    return start_main(target, args, cwd=cwd, env=env, merge_stderr=merge_stderr,
                      on_line=on_line, fork_ranks=fork_ranks).wait(timeout)


class ForkedRun:
    """A child started by :func:`start_main`: ``process`` to signal it, ``wait()`` for its
    result (several can run at once, as the ranks of a job do)."""

    def __init__(self, target: str | Path, args: list[str], process: ForkedProcess,
                 pipes: list[int], merged: bool,
                 on_line: Callable[[str, ForkedProcess], bool] | None) -> None:
        self.target, self.args, self.process, self.merged = target, args, process, merged
        self._chunks: dict[int, list[str]] = {fd: [] for fd in pipes}
        self._pipes = pipes
        self._readers = [threading.Thread(target=self._read, args=(fd, on_line), daemon=True)
                         for fd in pipes]
        for reader in self._readers:
            reader.start()

    def _read(self, fd: int, on_line: Callable[[str, ForkedProcess], bool] | None) -> None:
        with open(fd, encoding="utf-8", errors="replace", closefd=True) as pipe:
            for line in pipe:      # ends when every process holding the write end has closed it
                self._chunks[fd].append(line)
                if on_line is not None:
                    on_line(line, self.process)

    def _text(self, index: int) -> str:
        return "".join(self._chunks[self._pipes[index]]) if index < len(self._pipes) else ""

    def wait(self, timeout: float = 300) -> subprocess.CompletedProcess:
        """The child's exit status and output; SIGKILL and ``TimeoutError`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        try:
            while self.process.poll() is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{self.target} {' '.join(self.args)} did not end within {timeout} s:\n"
                        f"{self._text(0)[-3000:]}{self._text(1)[-3000:]}")
                time.sleep(0.05)
        finally:                  # a timeout, or pytest-timeout interrupting: leave no orphan
            if self.process.poll() is None:
                self.process.kill()
                while self.process.poll() is None:
                    time.sleep(0.01)
        left_behind = group_members(self.process.pid)
        if self.process.returncode < 0:
            # Killed by a signal: what it forked (loader workers) is orphaned and holds the
            # pipes until it notices, up to 5 s later. After a normal exit nothing is killed,
            # so a process the code under test leaves behind stays visible to the test.
            kill_orphans(self.process.pid)
        for reader in self._readers:
            reader.join(timeout)    # a grandchild still holding the pipe would block this
        result = subprocess.CompletedProcess([str(self.target), *self.args],
                                             self.process.returncode, self._text(0),
                                             self._text(1))
        # What the child started (DDP ranks, loader workers) and was still running when it
        # ended, before any was killed: a test that nothing is left behind reads this.
        result.left_behind = left_behind
        return result


def start_main(target: str | Path, args: list[str], *, cwd: Path, env: dict | None = None,
               merge_stderr: bool = False,
               on_line: Callable[[str, ForkedProcess], bool] | None = None,
               fork_ranks: bool = False) -> ForkedRun:
    """:func:`run_main` without waiting: the running child."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env = {k: v for k, v in full_env.items() if v is not None}
    out_r, out_w = os.pipe()
    err_r, err_w = (out_r, out_w) if merge_stderr else os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:                                           # the child: never returns
        code = 70
        try:
            gc.freeze()               # the worker's objects are not the child's: see below
            os.setpgid(0, 0)          # what it forks joins its group: see ForkedRun.wait
            for fd in {out_r, err_r}:
                os.close(fd)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in {out_w, err_w}:
                os.close(fd)
            code = _run_as_main(target, args, Path(cwd), full_env, fork_ranks=fork_ranks)
        except BaseException:                              # noqa: BLE001 - report, then exit
            traceback.print_exc()
        finally:
            os._exit(code)

    with contextlib.suppress(OSError):          # also here: the child may not have run yet
        os.setpgid(pid, pid)
    for fd in {out_w, err_w}:
        os.close(fd)
    pipes = [out_r] if merge_stderr else [out_r, err_r]
    return ForkedRun(target, args, ForkedProcess(pid), pipes, merge_stderr, on_line)


def _run_as_main(target: str | Path, args: list[str], cwd: Path, env: dict, *,
                 fork_ranks: bool = False) -> int:
    """In the forked child: become ``python [-m] target args`` and run it; its exit status."""
    signal.setitimer(signal.ITIMER_REAL, 0)
    for signum in (signal.SIGTERM, signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2,
                   signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if faulthandler.is_enabled():
        faulthandler.disable()
    replaced = {id(sys.stdout): "out", id(sys.__stdout__): "out", id(sys.stderr): "err",
                id(sys.__stderr__): "err"}
    # Kept referenced: the interpreter's own stream objects own fds 1 and 2 (closefd), which
    # now are the pipes; collecting them would close the pipes under the new streams.
    _REPLACED_STREAMS.extend((sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", line_buffering=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
        line_buffering=True)
    _fresh_logging(replaced)
    _fresh_warnings()
    _fresh_torch()
    _fresh_hydra()
    if fork_ranks:
        _fork_lightning_relaunches(target)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _fresh_threads()
    sys.path.insert(0, str(cwd) if isinstance(target, str) else str(Path(target).parent))
    code = 0
    try:
        if isinstance(target, str):
            sys.argv = [target, *args]
            # A fresh interpreter has not imported the module that -m runs: one the worker
            # imported would make runpy warn, and `import target` inside the run would get
            # the worker's module instead of a second copy, as under -m.
            sys.modules.pop(target, None)
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [str(target), *args]
            runpy.run_path(str(target), run_name="__main__")
    except SystemExit as exit_:
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
        code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    except BaseException:                                  # noqa: BLE001 - as the interpreter
        traceback.print_exc()
        code = 1
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    return code


def _fresh_logging(replaced: dict[int, str]) -> None:
    """No root handlers (pytest's capture handlers go); a handler a library made at import on
    the worker's stdout or stderr writes to the new one instead (handlers on streams of their
    own, such as torch's, keep them)."""
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)
    loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)]
    for logger in loggers:
        for handler in logger.handlers:
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and id(stream) in replaced:
                handler.setStream(sys.stdout if replaced[id(stream)] == "out" else sys.stderr)


def _fresh_warnings() -> None:
    """The filters and printing of a fresh interpreter (pytest records warnings instead, with
    the filters of its ini file): CPython's defaults outside dev mode, then ``-W`` and
    ``PYTHONWARNINGS``."""
    warnings.resetwarnings()
    if not sys.flags.dev_mode:
        warnings.filterwarnings("default", category=DeprecationWarning, module="__main__",
                                append=True)
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                         ResourceWarning):
            warnings.filterwarnings("ignore", category=category, append=True)
    warnings._processoptions(sys.warnoptions)              # type: ignore[attr-defined]

    def print_warning(message: warnings.WarningMessage) -> None:
        with contextlib.suppress(OSError):
            sys.stderr.write(warnings._formatwarnmsg(message))  # type: ignore[attr-defined]

    warnings.showwarning = warnings._showwarning_orig      # type: ignore[attr-defined]
    warnings._showwarnmsg_impl = print_warning             # type: ignore[attr-defined]


def _fresh_hydra() -> None:
    """No Hydra app initialised (a DDP rank forked from rank 0 starts inside rank 0's job)."""
    if "hydra" not in sys.modules:
        return
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None


class _RelaunchByFork:
    """What Lightning's subprocess launcher sees as ``subprocess``: its ``Popen`` of this same
    program (``[sys.executable, -m target, ...]`` or ``[sys.executable, script, ...]``, the
    command of DDP rank 1) forks this process and runs the program afresh in the child, as
    :func:`run_main` does; anything else is a real ``subprocess.Popen``. The rank is a real
    child process with its pid, signals and exit status, and inherits stdout and stderr as the
    new interpreter would."""

    def __init__(self, target: str | Path) -> None:
        self._target = target

    def __getattr__(self, name: str):
        return getattr(subprocess, name)

    def _program_args(self, command: list[str]) -> list[str] | None:
        if not command or command[0] != sys.executable:
            return None
        if isinstance(self._target, str):
            return command[3:] if command[1:3] == ["-m", self._target] else None
        script = os.path.abspath(self._target)
        return command[2:] if len(command) > 1 and os.path.abspath(command[1]) == script else None

    def Popen(self, command, *args, env=None, cwd=None, **kwargs):  # noqa: N802 - as subprocess
        program_args = None if args or kwargs else self._program_args(list(command))
        if program_args is None:
            return subprocess.Popen(command, *args, env=env, cwd=cwd, **kwargs)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                gc.freeze()
                code = _run_as_main(self._target, program_args, Path(cwd or os.getcwd()),
                                    dict(env if env is not None else os.environ),
                                    fork_ranks=True)
            except BaseException:                          # noqa: BLE001 - report, then exit
                traceback.print_exc()
            finally:
                os._exit(code)
        return ForkedProcess(pid)


def _fork_lightning_relaunches(target: str | Path) -> None:
    """Lightning's DDP launcher starts rank 1 by forking this child, not a new interpreter."""
    if "lightning" not in sys.modules:
        return
    from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
    from lightning.pytorch.strategies.launchers import subprocess_script as trainer_launcher

    fabric_launcher.subprocess = trainer_launcher.subprocess = _RelaunchByFork(target)


def _fresh_torch() -> None:
    if "torch" not in sys.modules:
        return
    import torch

    # Only where a test left them changed: use_deterministic_algorithms() imports inductor's
    # config (~3 s here) even to set what is already set.
    if torch.are_deterministic_algorithms_enabled():
        torch.use_deterministic_algorithms(False)
    if torch.get_float32_matmul_precision() != "highest":
        torch.set_float32_matmul_precision("highest")
    torch.set_grad_enabled(True)


def _fresh_threads() -> None:
    """The intra-op threads a fresh interpreter starts with (``OMP_NUM_THREADS``, else every
    core), except in the child of a process that computed on more than one thread.

    libgomp's thread pool does not survive fork: a child of a process whose pool has started
    hangs in its first parallel region on more than one thread (seen: DDP rank 1 forked from
    a two-thread rank 0, in MKL's cosine for the mel filterbank's window). Such a child runs on
    one thread, with ``OMP_NUM_THREADS=1`` for what it starts. Under xdist the workers compute
    on one thread (tests/conftest.py), so this acts only when a test runs without ``-n``.
    """
    if "torch" not in sys.modules:
        return
    import torch

    if torch.get_num_threads() > 1:               # the parent's count, inherited
        os.environ["OMP_NUM_THREADS"] = "1"
    wanted = os.environ.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(wanted) if wanted.isdigit() and int(wanted) > 0
                          else os.cpu_count() or 1)


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, pgrp, ...), or
    None for a process that is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def group_members(group: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group ``group``."""
    return [int(pid) for pid in filter(str.isdigit, os.listdir("/proc"))
            if (fields := _stat(pid)) and fields[0] not in ("Z", "X") and int(fields[2]) == group]


def kill_orphans(group: int) -> None:
    """SIGKILL what is left of process group ``group``, whose leader (a forked child made
    leader when it started) was killed by a signal and reaped."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")
