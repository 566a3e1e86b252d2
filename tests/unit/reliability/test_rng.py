"""RNG state round trip through a weights-only checkpoint."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from mmtf.reliability import capture_rng_state, restore_rng_state


def draws() -> tuple:
    return (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(),
            np.random.randn(), torch.rand(4).tolist(), torch.randn(2).tolist())


def test_rng_state_survives_a_weights_only_checkpoint(tmp_path):
    random.gauss(0, 1)                  # leaves a cached gaussian in python's generator
    np.random.randn()
    state = capture_rng_state()
    expected = draws()
    path = tmp_path / "rng.pt"
    torch.save({"rng": state}, path)
    loaded = torch.load(path, weights_only=True)["rng"]
    assert draws() != expected          # the generators moved on
    restore_rng_state(loaded)
    assert draws() == expected


def test_restore_rejects_foreign_state():
    with pytest.raises(ValueError, match=r"lacks \['numpy', 'python'\]"):
        restore_rng_state({"torch": torch.get_rng_state()})
