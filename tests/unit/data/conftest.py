"""Fixtures of the data tests: tiny synthetic sets (generated once per session) and file writers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mmtf.synthetic import ensure_synthetic

TINY_AUDIO = dict(num_train=6, num_val=3, num_test=3, min_seconds=1.0, max_seconds=2.0, seed=0)
TINY_IMAGE = dict(num_train=6, num_val=3, num_test=3, image_size=32, seed=0)


def sine(seconds: float, sr: int, hz: float = 440.0, amp: float = 0.5) -> np.ndarray:
    """A float32 sine, the reference signal of the I/O tests."""
    t = np.arange(int(round(seconds * sr))) / sr
    return (amp * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def write_audio(path: Path, data: np.ndarray, sr: int = 16000, **kw) -> Path:
    """Write with soundfile (format from the extension) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), data, sr, **kw)
    return path


@pytest.fixture(scope="session")
def tiny_audio_captions(tmp_path_factory) -> Path:
    """6/3/3 clips of 1-2 s in the Clotho layout (read-only: copy before breaking it)."""
    return ensure_synthetic(tmp_path_factory.mktemp("synth") / "audio_captions",
                            "audio_captions", **TINY_AUDIO)


@pytest.fixture(scope="session")
def tiny_image_captions(tmp_path_factory) -> Path:
    """6/3/3 images of 32x32 as COCO captions."""
    return ensure_synthetic(tmp_path_factory.mktemp("synth") / "image_captions",
                            "image_captions", **TINY_IMAGE)


@pytest.fixture(scope="session")
def tiny_audio_labels(tmp_path_factory) -> Path:
    """20 clips in 5 folds, ESC-50 layout."""
    return ensure_synthetic(tmp_path_factory.mktemp("synth") / "audio_labels", "audio_labels",
                            num_clips=20, min_seconds=1.0, max_seconds=1.5)


@pytest.fixture(scope="session")
def tiny_image_labels(tmp_path_factory) -> Path:
    """8/4/4 images of 32x32, ImageFolder layout."""
    return ensure_synthetic(tmp_path_factory.mktemp("synth") / "image_labels", "image_labels",
                            num_train=8, num_val=4, num_test=4, image_size=32)
