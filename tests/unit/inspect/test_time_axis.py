"""Memory position -> seconds for the audio encoder, against a hand computation and the
receptive fields of the real front end and conv stem."""

from __future__ import annotations

import torch

from mmtf.encoders import AudioEncoder, ConvStem
from tests.unit.presets import flat


def tiny_audio(hop_length: int = 160) -> AudioEncoder:
    torch.manual_seed(0)
    return flat(AudioEncoder, dim=32, depth=1, num_heads=4, n_mels=16, hop_length=hop_length).eval()


def test_seconds_per_position_by_hand():
    # 4 frames per position (two stride-2 convs) x 160 samples / 16 kHz = 40 ms;
    # hop 320 gives 80 ms; the audio_captioning experiment's hop 640, 160 ms.
    assert tiny_audio(160).seconds_per_position == 0.04
    assert tiny_audio(320).seconds_per_position == 0.08
    assert tiny_audio(640).seconds_per_position == 0.16
    assert tiny_audio(160).memory_seconds(4).tolist() == [0.0, 0.04, 0.08, 0.12]


def test_a_frame_at_four_k_reaches_position_k_alone():
    # Position k is centred on frame 4k: changing frame 4k changes only output k, frames
    # 4k +- 1 also reach a neighbour.
    torch.manual_seed(0)
    stem = ConvStem(in_channels=4, dim=8)
    x, lengths = torch.randn(1, 4, 40), torch.tensor([40])
    base, _ = stem(x, lengths)
    for frame, expected in ((12, [3]), (13, [3, 4]), (11, [2, 3]), (20, [5])):
        y = x.clone()
        y[..., frame] += 5.0
        out, _ = stem(y, lengths)
        changed = ((out - base).abs().amax(-1) > 1e-6)[0].nonzero().flatten().tolist()
        assert changed == expected, (frame, changed)


def test_frame_j_is_centred_on_sample_j_times_hop():
    # An impulse at sample 10 * hop lights frames 9, 10, 11 (n_fft 400 = 2.5 hops), equally
    # far on both sides: frame 10 is centred on it.
    encoder = tiny_audio(160)
    wave = torch.zeros(1, 16000)
    wave[0, 1600] = 1.0
    feats = encoder.frontend.mel(torch.nn.functional.pad(wave, (200, 200)))[0]   # (f, t)
    energy = feats.sum(0)
    lit = (energy > 1e-9).nonzero().flatten().tolist()
    assert lit == [9, 10, 11]
    torch.testing.assert_close(energy[9], energy[11])
