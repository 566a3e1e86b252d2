"""Shared test setup: a fixed seed per test and a thread count sane for 2-core machines."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

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
