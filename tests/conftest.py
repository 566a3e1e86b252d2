"""Shared test setup: a fixed seed per test, a thread count sane for 2-core machines, one xdist
worker per module-scoped fixture, and (tests/ci_skips.py) no silent skips of [dev] packages on
CI. How the suite is organised: tests/README.md."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

# pytester: the tests of tests/ci_skips.py run a small pytest session of their own.
pytest_plugins = ["pytester", "tests.ci_skips"]

os.environ.setdefault("HYDRA_FULL_ERROR", "1")
# Under xdist each worker gets one core; alone, use both.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, os.cpu_count() or 1))


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


@pytest.hookimpl(tryfirst=True)     # before xdist and -m read the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that use a module-scoped fixture share one ``xdist_group``, their module's; tests
    that use a session-trained checkpoint are ``slow``.

    With ``--dist loadgroup`` (pyproject.toml's addopts) xdist sends a group to one worker, so
    each such fixture (a trained run, the installed wheel, the compiled-decoding results) is
    built once, not once per worker that happens to get one of its tests. The other tests are
    distributed one by one, as ``--dist load`` does.
    """
    for item in items:
        if TRAINED_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        if any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values()):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
