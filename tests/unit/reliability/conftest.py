"""Reliability tests compare weights bit for bit: run every fit with one thread (the forked
children must anyway: OpenMP thread pools do not survive ``fork``)."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def quiet_lightning():
    """Lightning's banners and PossibleUserWarnings (tiny data) are noise here."""
    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="lightning")
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        yield
    logger.setLevel(level)
