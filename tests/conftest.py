"""Shared test setup: a fixed seed per test, a thread count sane for 2-core machines, one xdist
worker per module-scoped fixture, and (tests/ci_skips.py) no silent skips of [dev] packages on
CI. How the suite is organised: tests/README.md."""

from __future__ import annotations

import functools
import os
import random
import re
from pathlib import Path
from typing import Any

# Before torch: mmtf's OpenMP wait setting (mmtf/utils/threads.py) must reach libgomp here and in
# the workers and interpreters the suite starts (it is inherited through the environment).
import mmtf  # noqa: F401

# isort: split
import numpy as np
import pytest
import torch

# pytester: the tests of tests/ci_skips.py run a small pytest session of their own.
pytest_plugins = ["pytester", "tests.ci_skips"]

os.environ.setdefault("HYDRA_FULL_ERROR", "1")
# Under xdist each worker gets one core; alone, use both. In the environment too: the CLIs and
# the DDP ranks a test starts keep the count (mmtf.utils.threads.set_threads respects it) rather
# than each taking every core beside the other worker.
_THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, os.cpu_count() or 1)
os.environ["OMP_NUM_THREADS"] = str(_THREADS)
torch.set_num_threads(_THREADS)


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
