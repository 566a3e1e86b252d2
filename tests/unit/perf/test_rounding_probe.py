"""experiments/audio_captioning_synth/rounding_probe.py: inside it the front end's features move
by rounding only (float32 noise, yet not the same bits) as re² + im², and leaving it restores
torchaudio's own bits."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from mmtf.encoders.audio import LogMelFrontEnd

SCRIPT = (Path(__file__).resolve().parents[3] / "experiments" / "audio_captioning_synth"
          / "rounding_probe.py")


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("rounding_probe", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_probe_changes_rounding_only_and_is_undone(probe):
    front_end = LogMelFrontEnd(n_fft=512, hop_length=320)      # the default recipe's
    wave = torch.randn(2, 48_000, generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([48_000, 30_000])
    before, frames = front_end(wave, lengths)
    with probe.power_rounded_differently():
        probed, probed_frames = front_end(wave, lengths)
    after, _ = front_end(wave, lengths)

    assert torch.equal(frames, probed_frames)
    assert not torch.equal(before, probed), "the probe changed no bit of the features"
    # Rounding only: normalised log-mels (unit variance) moved by float32 noise.
    assert (before - probed).abs().max() < 1e-4
    assert torch.equal(before, after), "leaving the probe did not restore torchaudio's spectrogram"


def test_the_power_is_re2_plus_im2(probe):
    import torchaudio.functional as F

    wave = torch.randn(1, 4000, generator=torch.Generator().manual_seed(1))
    window = torch.hann_window(400)
    with probe.power_rounded_differently():
        power = F.spectrogram(wave, 0, window, 400, 160, 400, 2.0, False)
    z = torch.stft(wave, 400, 160, 400, window, return_complex=True)
    assert torch.equal(power, z.real * z.real + z.imag * z.imag)
