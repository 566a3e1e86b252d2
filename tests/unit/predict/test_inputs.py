"""mmtf.predict.inputs: inputs -> encoder inputs, and the long-audio policy (crop / window)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio
from PIL import Image

from mmtf.data.image import build_transform
from mmtf.errors import UserError
from mmtf.predict.inputs import audio_segments, check_long_audio, image_segment

RATE = 16000


def _ramp(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) / n - 0.5            # every sample distinct


def test_short_audio_is_one_segment_whatever_the_policy():
    wave = _ramp(RATE)
    for policy in ("crop", "window"):
        (segment,) = audio_segments(wave, 0, sample_rate=RATE, max_seconds=2.0,
                                    long_audio=policy)
        torch.testing.assert_close(segment.data, wave, rtol=0, atol=0)
    assert segment.span == (0.0, 1.0) and segment.name == "input[0]"


def test_crop_keeps_the_first_max_seconds_and_warns_with_name_length_limit(tmp_path, caplog):
    wave = _ramp(5 * RATE)
    path = tmp_path / "long.wav"
    sf.write(path, wave.numpy(), RATE, subtype="FLOAT")
    with caplog.at_level(logging.WARNING, logger="mmtf.data.inputs"):
        (from_file,) = audio_segments(path, 0, sample_rate=RATE, max_seconds=2.0)
        (from_wave,) = audio_segments(wave, 1, sample_rate=RATE, max_seconds=2.0)
    for segment in (from_file, from_wave):
        torch.testing.assert_close(segment.data, wave[: 2 * RATE], rtol=0, atol=0)
        assert segment.span is None
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert str(path) in messages[0] and "5.00 s" in messages[0] and "(2 s)" in messages[0]
    assert "input[1]" in messages[1]


def test_window_splits_into_equal_windows_within_the_limit(tmp_path):
    wave = _ramp(5 * RATE)                      # 5 s, limit 2 s -> 3 windows of 5/3 s
    path = tmp_path / "long.wav"
    sf.write(path, wave.numpy(), RATE, subtype="FLOAT")
    for item in (path, wave):
        segments = audio_segments(item, 0, sample_rate=RATE, max_seconds=2.0,
                                  long_audio="window")
        bounds = [(0, 26666), (26666, 53333), (53333, 80000)]          # i * 80000 // 3
        assert [s.span for s in segments] == [(a / RATE, b / RATE) for a, b in bounds]
        for segment, (a, b) in zip(segments, bounds):
            torch.testing.assert_close(segment.data, wave[a:b], rtol=0, atol=0)


def test_waveform_with_its_rate_is_resampled_like_torchaudio():
    wave = _ramp(22050)
    (segment,) = audio_segments((wave, 22050), 0, sample_rate=RATE, max_seconds=None)
    expected = torchaudio.functional.resample(wave, 22050, RATE)
    torch.testing.assert_close(segment.data, expected, rtol=1e-4, atol=2e-5)  # float32 conv


def test_bad_inputs_and_policy_are_user_errors():
    with pytest.raises(UserError, match=r"inputs\[3\]: a waveform must be 1-D float"):
        audio_segments(torch.zeros(2, 100), 3, sample_rate=RATE, max_seconds=None)
    with pytest.raises(UserError, match=r"long_audio \('pad'\) must be 'crop'"):
        check_long_audio("pad")


def test_image_file_pil_and_tensor_give_the_same_input(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
    path = tmp_path / "a.png"
    Image.fromarray(pixels).save(path)
    transform = build_transform([{"_target_": "torchvision.transforms.v2.Resize",
                                  "size": [16, 16], "antialias": True}])
    expected = transform(torch.from_numpy(pixels).permute(2, 0, 1).contiguous())
    for item in (path, Image.fromarray(pixels), torch.from_numpy(pixels).permute(2, 0, 1)):
        segment = image_segment(item, 0, transform)
        torch.testing.assert_close(segment.data, expected, rtol=0, atol=0)
        assert segment.data.dtype == torch.float32 and segment.data.shape == (3, 16, 16)
