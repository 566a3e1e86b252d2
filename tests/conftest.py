"""Shared test setup: a fixed seed per test, a thread count sane for 2-core machines, one xdist
worker per module-scoped fixture, and (tests/ci_skips.py) no silent skips of [dev] packages on
CI. How the suite is organised: tests/README.md."""

from __future__ import annotations

import functools
import logging
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mmtf.utils.cpu_sharing import share_cpu

# pytester: the tests of tests/ci_skips.py run a small pytest session of their own.
pytest_plugins = ["pytester", "tests.ci_skips"]

os.environ.setdefault("HYDRA_FULL_ERROR", "1")
# Under xdist each worker gets one core; alone, use both. In the environment too: the CLIs and
# the DDP ranks a test starts keep the count (mmtf.utils.cpu_sharing.set_threads respects it) rather
# than each taking every core beside the other worker.
_THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, os.cpu_count() or 1)
os.environ["OMP_NUM_THREADS"] = str(_THREADS)
torch.set_num_threads(_THREADS)
# What mmtf's CLIs start (docs/design/cpu-sharing.md), here too: the xdist workers govern their
# OpenMP waits beside each other and keep freed memory; the thread count is the suite's (above).
share_cpu({"threads": "off"})


@pytest.fixture(autouse=True)
def _one_thread_count(request: pytest.FixtureRequest):
    """Each test ends with the suite's thread count, put back (with a warning naming the test)
    where it changed it: a worker left on two threads starts libgomp's pool, and children forked
    from it later (loader workers, tests/forked.py) hang in their first parallel region."""
    yield
    if torch.get_num_threads() != _THREADS:
        import warnings

        warnings.warn(f"{request.node.nodeid} left torch on {torch.get_num_threads()} threads "
                      f"(the suite runs on {_THREADS}); put back", stacklevel=1)
        torch.set_num_threads(_THREADS)


def _children() -> set[int]:
    """Pids of the processes this process's main thread started and has not reaped."""
    try:
        return set(map(int, Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
                       .read_text().split()))
    except OSError:                   # no /proc (not Linux): nothing to check
        return set()


def stop_loader_workers(pids: set[int]) -> tuple[int, float]:
    """Shut down the DataLoader iterators of this process that have a worker among ``pids``;
    (how many worker processes they had, seconds it took).

    Left running, such workers were shut down whenever the garbage collector next collected
    their iterator, in whichever later test that happened, and each join waited its full 5 s:
    stalls of 50-110 s in tests that take a second alone (py-spy: the worker in
    ``_StatefulMultiProcessingDataLoaderIter.__del__`` -> ``join``). Here the wait, if any,
    falls on the test that left them, which the warning names.
    """
    import gc
    import time

    from torch.utils.data.dataloader import _BaseDataLoaderIter  # torchdata's derive from it

    from mmtf.utils.compat import shutdown_loader_workers

    start = time.monotonic()
    live = [it for it in gc.get_objects() if isinstance(it, _BaseDataLoaderIter)
            and any(w.pid in pids for w in getattr(it, "_workers", ()))]
    stopped = sum(shutdown_loader_workers(None, it) for it in live)
    return stopped, time.monotonic() - start


@pytest.fixture(autouse=True)
def _no_loader_workers_left(request: pytest.FixtureRequest):
    """A test's DataLoader workers do not outlive it (stopped, with a warning naming the test):
    see :func:`stop_loader_workers` for the stalls they caused."""
    before = _children()
    yield
    if new := _children() - before:
        stopped, seconds = stop_loader_workers(new)
        if stopped:
            import warnings

            warnings.warn(f"{request.node.nodeid} left {stopped} DataLoader worker process(es) "
                          f"running (an iterator neither exhausted nor closed); shut down in "
                          f"{seconds:.1f} s", stacklevel=1)


def _own_handlers(logger: logging.Logger) -> list[logging.Handler]:
    # pytest's logging plugin swaps its capture handlers on root around every phase: not state.
    return [h for h in logger.handlers if not type(h).__module__.startswith("_pytest")]


def _global_state() -> dict[str, Any]:
    """What a test can leave behind that changes later tests' outcome: every logger's level,
    handlers, propagation and disabled flag (Hydra's job logging puts a console handler on root
    with the stream of the moment, pytest's capture, which it closes after the test: later log
    lines print "--- Logging error --- ... I/O operation on closed file"), torch's matmul
    precision (mmtf.train sets it) and deterministic-algorithm flags, Lightning's seed variables
    (``seed_everything`` exports them; a later ``seed_everything(None)`` reads them)."""
    loggers = {"": logging.getLogger(), **{name: logger for name, logger
                                           in logging.Logger.manager.loggerDict.items()
                                           if isinstance(logger, logging.Logger)}}
    return {
        "loggers": {name: (logger.level, _own_handlers(logger), logger.propagate,
                           logger.disabled) for name, logger in loggers.items()},
        "matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic": (torch.are_deterministic_algorithms_enabled(),
                          torch.is_deterministic_algorithms_warn_only_enabled()),
        "env": {k: v for k, v in os.environ.items() if k.startswith("PL_")},
    }


def _restore(state: dict[str, Any]) -> None:
    for name, (level, handlers, propagate, disabled) in state["loggers"].items():
        logger = logging.getLogger(name or None)
        for handler in _own_handlers(logger):
            if handler not in handlers:
                logger.removeHandler(handler)
                handler.close()
        for handler in handlers:
            if handler not in logger.handlers:
                logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate, logger.disabled = propagate, disabled
    torch.set_float32_matmul_precision(state["matmul_precision"])
    enabled, warn_only = state["deterministic"]
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    for key in {k for k in os.environ if k.startswith("PL_")} - set(state["env"]):
        del os.environ[key]
    os.environ.update(state["env"])


@pytest.fixture(autouse=True)
def _no_global_state_leaked(request: pytest.FixtureRequest):
    """Each test ends with the logging, torch flags and Lightning seed variables it started
    with, put back with a warning naming the test and what it changed, so that no outcome
    depends on test order. Loggers created during the test are a library's first import and
    keep what the library gave them."""
    before = _global_state()
    yield
    after = _global_state()
    changed = [key for key in ("matmul_precision", "deterministic", "env")
               if after[key] != before[key]]
    changed += [f"logger {name or 'root'!r}" for name, value in before["loggers"].items()
                if after["loggers"].get(name) != value]
    if changed:
        _restore(before)
    # A Lightning Trainer sets the deterministic flags and seed variables by design: put back
    # quietly. A leaked logger or matmul precision is a test's own doing: named.
    named = [c for c in changed if c not in ("deterministic", "env")]
    if named:
        import warnings

        warnings.warn(f"{request.node.nodeid} left global state changed: {', '.join(named)}; "
                      f"put back", stacklevel=1)


@pytest.fixture(autouse=True)
def seed() -> int:
    """Seed python, numpy and torch before every test so results never depend on test order."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    return 0


# Session fixtures that train a model (tests/integration/conftest.py): whichever of their
# tests comes first pays for the run, so all of them are `slow`.
TRAINED_FIXTURES = frozenset({"audio_captioner", "image_captioner"})


@pytest.hookimpl(tryfirst=True)     # before -m reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that use a session-trained checkpoint are ``slow`` (whichever runs first trains it)."""
    for item in items:
        if TRAINED_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


_MODULE_FIXTURE = re.compile(r"""scope\s*=\s*["']module["']""")


@functools.cache
def _has_module_fixture(path: Path) -> bool:
    return path.suffix == ".py" and path.is_file() and bool(_MODULE_FIXTURE.search(path.read_text()))


@pytest.hookimpl(tryfirst=True, optionalhook=True)   # optional: a run without xdist has no such hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``-n``: the tests of a module that defines a module-scoped fixture (a trained run, the
    installed wheel, the compiled-decoding results) go to one worker, so the fixture is built
    once; every other test is sent on its own to whichever worker is free, as ``--dist load``.

    Why not ``--dist loadgroup`` with ``xdist_group`` marks: with pytest 9.2 and xdist 3.8 the
    group never reaches the scheduler (xdist writes it into the node id, which pytest 9.2 no
    longer lets it change: pytest-dev/pytest-xdist#1386). Tested by
    ``tests/unit/test_scheduler.py``; other ``--dist`` modes are left to xdist.
    """
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class ModuleFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if _has_module_fixture(root / module) else nodeid

    return ModuleFixtureScheduling(config, log)
