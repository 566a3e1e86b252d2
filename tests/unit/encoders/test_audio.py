"""AudioEncoder: the log-mel front end against an independent float64 computation, exact padding
invariance, mask lengths, SpecAugment only in training, input limits and config errors."""

from __future__ import annotations

import warnings

import pytest
import torch
import torchaudio

from mmtf.encoders import AudioEncoder, LogMelFrontEnd, SpecAugment
from mmtf.errors import UserError
from tests.unit.presets import flat

from .conftest import TINY_AUDIO


def reference_logmel(wave: torch.Tensor, *, sample_rate: int, n_mels: int, n_fft: int,
                     hop_length: int, win_length: int, f_min: float, f_max: float) -> torch.Tensor:
    """Per-utterance normalised log-mel of one unpadded clip, in float64, from torch.stft with
    built-in centring and torchaudio's filterbank function: (f, t)."""
    window = torch.hann_window(win_length, dtype=torch.float64)
    spec = torch.stft(wave.double(), n_fft, hop_length, win_length, window=window, center=True,
                      pad_mode="constant", return_complex=True).abs().square()   # (freq, t)
    fb = torchaudio.functional.melscale_fbanks(n_fft // 2 + 1, f_min, f_max, n_mels,
                                               sample_rate).double()             # (freq, f)
    logmel = torch.log(fb.T @ spec + 1e-6)
    return (logmel - logmel.mean()) / logmel.std(unbiased=False)


@pytest.mark.parametrize("win_length, f_min, f_max, n", [(400, 0.0, 8000.0, 8000),
                                                         (320, 50.0, 7000.0, 8037)])
def test_front_end_matches_independent_stft(win_length, f_min, f_max, n):
    front = LogMelFrontEnd(sample_rate=16000, n_mels=16, n_fft=400, hop_length=160,
                           win_length=win_length, f_min=f_min, f_max=f_max)
    t = torch.arange(n) / 16000
    wave = 0.1 * torch.randn(n) + 0.3 * torch.sin(2 * torch.pi * 440 * t)
    feats, frames = front(wave[None], torch.tensor([n]))
    ref = reference_logmel(wave, sample_rate=16000, n_mels=16, n_fft=400, hop_length=160,
                           win_length=win_length, f_min=f_min, f_max=f_max)
    assert feats.shape == (1, 16, n // 160 + 1) == (1, *ref.shape)
    assert frames.tolist() == [n // 160 + 1]
    torch.testing.assert_close(feats[0].double(), ref, atol=2e-4, rtol=0)


def test_global_normalisation_uses_config_constants():
    n = 4000
    wave = 0.1 * torch.randn(n)
    kw = dict(sample_rate=16000, n_mels=8, n_fft=256, hop_length=128)
    utt = LogMelFrontEnd(**kw)
    glob = LogMelFrontEnd(**kw, feature_norm="global", feature_mean=-2.0, feature_std=4.0)
    per_band = LogMelFrontEnd(**kw, feature_norm="global", feature_mean=list(range(8)),
                              feature_std=[2.0] * 8)
    raw = reference_logmel(wave, sample_rate=16000, n_mels=8, n_fft=256, hop_length=128,
                           win_length=256, f_min=0.0, f_max=8000.0)
    lengths = torch.tensor([n])
    window = torch.hann_window(256, dtype=torch.float64)
    spec = torch.stft(wave.double(), 256, 128, window=window, center=True, pad_mode="constant",
                      return_complex=True).abs().square()
    fb = torchaudio.functional.melscale_fbanks(129, 0.0, 8000.0, 8, 16000).double()
    logmel = torch.log(fb.T @ spec + 1e-6)                                   # (f, t)
    torch.testing.assert_close(utt(wave[None], lengths)[0][0].double(), raw, atol=2e-4, rtol=0)
    torch.testing.assert_close(glob(wave[None], lengths)[0][0].double(), (logmel + 2.0) / 4.0,
                               atol=1e-4, rtol=0)
    expected = (logmel - torch.arange(8.0, dtype=torch.float64)[:, None]) / 2.0
    torch.testing.assert_close(per_band(wave[None], lengths)[0][0].double(), expected,
                               atol=1e-4, rtol=0)


def test_output_lengths_and_mask_follow_the_frame_arithmetic():
    enc = flat(AudioEncoder, **TINY_AUDIO).eval()
    lengths = torch.tensor([16000, 8000, 8037, 159, 0])
    out = enc(torch.randn(5, 16000), lengths)
    # frames = L // 160 + 1 = 101, 51, 51, 1, 1; two convs (t - 1) // 2 + 1: 101->51->26, 51->26->13
    expected = [26, 13, 13, 1, 1]
    assert out.memory.shape == (5, 26, 32) and out.mask.dtype == torch.bool
    assert out.mask.sum(dim=1).tolist() == expected
    assert enc.output_lengths(lengths).tolist() == expected
    for i, n in enumerate(expected):
        assert out.mask[i, :n].all() and not out.mask[i, n:].any()
        assert (out.memory[i, n:] == 0).all()
    assert torch.isfinite(out.memory).all()


@pytest.mark.parametrize("feature_norm", ["utterance", "global"])
@pytest.mark.parametrize("junk", ["noise", "large", "nan"])
@pytest.mark.parametrize("n", [8037, 7717])   # 51 and 49 frames: 26 (even) / 25 (odd) after conv1
def test_padding_never_changes_valid_memory(feature_norm, junk, n):
    # dropout set but off in eval; SpecAugment configured but off in eval.
    enc = flat(AudioEncoder, **TINY_AUDIO, feature_norm=feature_norm, feature_mean=-3.0, feature_std=2.5,
                       dropout=0.1, attn_dropout=0.1).eval()
    clip = 0.1 * torch.randn(n)                # n is not a multiple of the hop
    with torch.no_grad():
        ref = enc(clip[None]).memory[0]        # unpadded, lengths=None
        valid = ref.shape[0]
        for pad in (0, 7, 160, 3000, 16000):
            filler = {"noise": 100 * torch.randn(pad), "large": torch.full((pad,), 1e4),
                      "nan": torch.full((pad,), float("nan"))}[junk]
            other = 0.1 * torch.randn(n + pad + 500)          # a longer clip pads the batch further
            batch = torch.full((2, n + pad + 500), 7.0)
            batch[0, :n + pad] = torch.cat([clip, filler])
            batch[1] = other
            out = enc(batch, torch.tensor([n, n + pad + 500]))
            assert out.mask[0].sum() == valid
            torch.testing.assert_close(out.memory[0, :valid], ref, atol=1e-5, rtol=0)
            assert (out.memory[0, valid:] == 0).all()
            alone = enc(other[None]).memory[0]
            torch.testing.assert_close(out.memory[1], alone, atol=1e-5, rtol=0)
    if junk == "noise":   # the check can fail: read as signal, the same junk changes the memory
        with torch.no_grad():
            leaked = enc(batch[:1, :n + 3000]).memory[0, :valid]
        assert (leaked - ref).abs().max() > 1e-2


def test_spec_augment_masks_bands_and_spans_only_in_training():
    aug = SpecAugment(freq_masks=1, freq_mask_width=6, time_masks=1, time_mask_width=12,
                      time_mask_mode="fixed")
    feats = torch.randn(64, 16, 40) + 5.0                     # no natural zeros
    assert torch.equal(aug.eval()(feats), feats)
    out = aug.train()(feats)
    zero = out == 0
    band = zero.all(dim=2)                                      # (b, f): a whole band masked
    span = zero.all(dim=1)                                      # (b, t): a whole frame masked
    assert (zero == (band[:, :, None] | span[:, None, :])).all()   # nothing else is touched
    assert (band.sum(1) <= 6).all() and (span.sum(1) <= 12).all()
    assert band.any() and span.any()
    assert not torch.equal(band[0], band[1]) or not torch.equal(span[0], span[1])   # per item
    assert torch.equal(out[~zero], feats[~zero])


@pytest.mark.parametrize("width", [12, 80])
def test_spec_augment_time_masks_fall_within_each_clips_valid_frames(width):
    """A 50-frame clip is masked the same amount in a batch padded to 50 or to 1000 frames."""
    aug = SpecAugment(freq_masks=0, time_masks=2, time_mask_width=width,
                      time_mask_mode="fixed").train()
    frames = torch.full((400,), 50)
    fractions = []
    for padded in (50, 1000):
        torch.manual_seed(0)
        feats = torch.randn(400, 4, padded) + 5.0               # no natural zeros, padding too
        masked = (aug(feats, frames) == 0).all(dim=1)           # (b, t) whole frames masked
        assert not masked[:, 50:].any()                         # padding is never masked
        fractions.append(masked[:, :50].float().mean().item())
    # Two masks of width U[0, min(width, 50)) cover about 1/5 (width 12) to 1/2 (width 80) of a
    # 50-frame clip; before the fix the 1000-frame batch masked about 1/20 of that.
    assert fractions[0] > 0.15
    assert fractions[1] == pytest.approx(fractions[0], abs=0.03)


def test_spec_augment_masks_every_length_in_a_mixed_batch():
    aug = SpecAugment(freq_masks=0, time_masks=1, time_mask_width=10,
                      time_mask_mode="fixed").train()
    frames = torch.tensor([10, 30, 300] * 200)
    masked = (aug(torch.randn(600, 4, 300) + 5.0, frames) == 0).all(dim=1)   # (b, t)
    valid = torch.arange(300) < frames[:, None]
    assert not (masked & ~valid).any()
    per_item = masked.sum(1).float()                            # frames masked per clip
    for length in (10, 30, 300):                                # E[width] = 10 / 2 frames
        assert per_item[frames == length].mean().item() == pytest.approx(5.0, abs=0.6)


def _time_masks(aug: SpecAugment, frames: torch.Tensor, t: int, seed: int = 0) -> torch.Tensor:
    """The frames ``aug`` masks in a batch of ``frames`` valid lengths padded to t, (b, t)."""
    torch.manual_seed(seed)
    masked = (aug(torch.ones(len(frames), 2, t), frames) == 0).all(dim=1)     # (b, t)
    return masked


@pytest.mark.parametrize("fraction", [0.05, 0.2])
def test_adaptive_time_masks_are_at_most_a_fraction_of_each_items_valid_frames(fraction):
    """Park et al. 2020: a mask is narrower than fraction * L frames of an L-frame item, and
    only valid frames are masked, whatever the padding."""
    aug = SpecAugment(freq_masks=0, time_masks=1, time_mask_width=10_000,
                      time_mask_mode="adaptive", time_mask_fraction=fraction,
                      time_mask_multiplicity=1.0).train()
    frames = torch.tensor([20, 60, 100, 150, 300, 700] * 300)
    masked = _time_masks(aug, frames, 800)                                   # one mask each
    widths = masked.sum(1)
    limit = torch.floor(fraction * frames)
    assert (widths <= limit).all()                                          # never wider
    assert not (masked & ~(torch.arange(800) < frames[:, None])).any()      # valid frames only
    for length in (100, 300, 700):          # drawn widths U[0, floor(f L)): their mean, about
        mean = widths[frames == length].float().mean().item()   # half the limit (floor(u W)
        w = int(fraction * length)                              # + start fraction: ~W / 2)
        assert mean == pytest.approx(w / 2, rel=0.2, abs=0.6)
    # The fixed mode's width for the same items: a constant limit, not a fraction.
    fixed = SpecAugment(freq_masks=0, time_masks=1, time_mask_width=10_000,
                        time_mask_mode="fixed").train()
    assert (_time_masks(fixed, frames, 800).sum(1)[frames == 20] > 0.2 * 20).any()


def test_adaptive_time_mask_count_grows_with_length_up_to_time_masks():
    aug = SpecAugment(freq_masks=0, time_masks=5, time_mask_width=20, time_mask_mode="adaptive",
                      time_mask_fraction=0.05, time_mask_multiplicity=0.02)
    frames = torch.tensor([10, 49, 50, 120, 199, 200, 250, 1000, 3000])
    widest, count = aug.time_mask_limits(frames)
    assert count.tolist() == [0, 0, 1, 2, 3, 4, 5, 5, 5]       # floor(0.02 L), at most 5
    assert widest.tolist() == [0, 2, 2, 6, 9, 10, 12, 20, 20]  # floor(0.05 L), at most 20
    # Drawn: count x mean width (widest / 2) frames, less overlaps; 10 frames: never masked.
    aug.train()
    lengths = torch.tensor([10, 60, 200, 1000] * 300)
    masked = _time_masks(aug, lengths, 1000).sum(1).float()
    assert masked[lengths == 10].sum() == 0
    for n, expected in ((60, 1 * 3 / 2), (200, 4 * 10 / 2), (1000, 5 * 20 / 2)):
        assert masked[lengths == n].mean().item() == pytest.approx(expected, rel=0.2)


def test_adaptive_time_masks_equal_fixed_ones_where_no_limit_binds_and_follow_the_seed():
    """The adaptive mode draws the fixed mode's random numbers: long items get the same masks
    bit for bit (a built-in set of long-enough clips trains as before), and torch's seed
    fixes the masks, as it does today."""
    fixed = SpecAugment(freq_masks=1, time_masks=2, time_mask_width=5,
                        time_mask_mode="fixed").train()
    adaptive = SpecAugment(freq_masks=1, time_masks=2, time_mask_width=5,
                           time_mask_mode="adaptive", time_mask_fraction=0.1,
                           time_mask_multiplicity=0.04).train()
    frames = torch.tensor([50, 51, 90, 150])        # >= 50 frames: 5 <= 0.1 L, 2 <= 0.04 L
    feats = torch.randn(4, 16, 150) + 5.0
    torch.manual_seed(1)
    a = fixed(feats, frames)
    torch.manual_seed(1)
    b = adaptive(feats, frames)
    torch.manual_seed(1)
    assert torch.equal(a, b) and torch.equal(adaptive(feats, frames), b)
    short = torch.tensor([20, 20, 20, 20])          # here the limits bind: other masks
    torch.manual_seed(1)
    c = fixed(feats, short)
    torch.manual_seed(1)
    assert not torch.equal(c, adaptive(feats, short))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"time_mask_mode": "relative"}, r"time_mask_mode \('relative'\) must be 'fixed' or "
                                     r"'adaptive'.*model\.encoder\.spec_augment\.time_mask_mode"),
    ({"time_mask_fraction": 0.0}, r"time_mask_fraction \(0\.0\) must be in \(0, 1\]"),
    ({"time_mask_fraction": 1.5}, r"time_mask_fraction \(1\.5\).*model\.encoder"),
    ({"time_mask_multiplicity": 0}, r"time_mask_multiplicity \(0\) must be > 0"),
])
def test_adaptive_time_mask_settings_are_checked(kwargs, match):
    with pytest.raises(UserError, match=match):
        flat(AudioEncoder, **{**TINY_AUDIO, **kwargs})


def test_whisper_padded_features_are_masked_within_and_sized_from_the_clip():
    """Whisper pads every clip to 30 s (here 4 s): all frames count as valid for the encoder,
    but SpecAugment's time masks are sized from, and placed in, the clip's own frames. Before
    the fix a 0.5 s clip (51 frames) got 4 s masks (fraction of 400 frames) anywhere."""
    enc = flat(AudioEncoder, **{**TINY_AUDIO, "features": "whisper", "pad_to_seconds": 4.0, "max_seconds": 4.0,
                                "freq_masks": 0, "time_masks": 2, "time_mask_width": 100,
                                "time_mask_mode": "adaptive", "time_mask_fraction": 0.2,
                                "time_mask_multiplicity": 0.04}).train()
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    enc.spec_augment.register_forward_hook(lambda m, args, out: seen.append((args[0], out)))
    lengths = torch.tensor([8000, 32000] * 40)                  # 0.5 s and 2 s of 4 s
    torch.manual_seed(0)
    with torch.no_grad():
        enc(0.1 * torch.randn(80, 32000), lengths)
    before, after = seen[0]
    masked = ((after == 0) & (before != 0)).all(dim=1)          # (b, t) whole frames masked
    clip = lengths // 160 + 1                                   # 51 and 201 of 400 frames
    assert masked.shape[1] == 400
    assert not (masked & (torch.arange(400) >= clip[:, None])).any()   # never in the padding
    assert (masked.sum(1) <= 2 * torch.floor(0.2 * clip)).all()        # sized from the clip
    assert masked[lengths == 8000].sum(1).max() > 0                    # and still masked


def test_encoder_spec_augment_only_in_train_mode():
    wave, lengths = 0.1 * torch.randn(2, 8000), torch.tensor([8000, 6000])
    enc = flat(AudioEncoder, **{**TINY_AUDIO, "freq_masks": 2, "time_masks": 2})
    plain = flat(AudioEncoder, **{**TINY_AUDIO, "freq_masks": 0, "time_masks": 0})
    plain.load_state_dict(enc.state_dict())
    with torch.no_grad():
        a, b = enc.train()(wave, lengths).memory, enc(wave, lengths).memory
        assert not torch.allclose(a, b)                            # fresh masks each call
        reference = plain.train()(wave, lengths).memory            # dropout is 0: deterministic
        evaluated = enc.eval()(wave, lengths).memory
    torch.testing.assert_close(evaluated, reference)


def test_too_long_input_raises_naming_the_limit():
    enc = flat(AudioEncoder, **TINY_AUDIO, max_seconds=0.5)
    enc(torch.randn(1, 8000))
    with pytest.raises(UserError, match=r"8001 samples .* max_seconds=0\.5 allows 8000"):
        enc(torch.randn(1, 8001), torch.tensor([100]))


@pytest.mark.parametrize("wave, lengths, match", [
    (torch.randn(2, 1, 800), None, r"float waveforms \(batch, samples\), got .*\(2, 1, 800\)"),
    (torch.zeros(2, 800, dtype=torch.int16), None, r"float waveforms"),
    (torch.randn(2, 800), torch.tensor([800, 801]), r"lengths \[800, 801\] must be in \[0, 800\]"),
    (torch.randn(2, 800), torch.tensor([800.0, 10.0]), r"lengths must be integer"),
    (torch.randn(2, 800), torch.tensor([800]), r"lengths must be integer \(batch=2,\)"),
])
def test_bad_inputs_raise(wave, lengths, match):
    with pytest.raises(ValueError, match=match):
        flat(AudioEncoder, **TINY_AUDIO)(wave, lengths)


@pytest.mark.parametrize("override, match", [
    (dict(dim=30), r"^model\.encoder: Attention: dim \(30\) must be divisible by num_heads \(4\)"),
    (dict(dim=36, num_heads=12), r"^model\.encoder: RotaryEmbedding: head_dim \(3\) must be even"),
    (dict(num_kv_heads=3), r"num_heads \(4\) must be a multiple of num_kv_heads \(3\)"),
    (dict(depth=0), r"depth \(0\) must be >= 1"),
    (dict(dropout=1.0), r"dropout \(1\.0\) must be in \[0, 1\)"),
    (dict(n_fft=401), r"n_fft \(401\) must be a positive even number"),
    (dict(win_length=512), r"win_length \(512\) must be in \[1, n_fft=400\]"),
    (dict(hop_length=0), r"hop_length \(0\) must be > 0"),
    (dict(f_max=9000.0), r"f_max \(9000\.0\) <= sample_rate / 2 \(8000\.0\)"),
    (dict(feature_norm="batch"), r"feature_norm \('batch'\) must be 'utterance' or 'global'"),
    (dict(feature_mean=[0.0, 1.0]), r"feature_mean has 2 values; give one number or n_mels \(16\)"),
    (dict(feature_std=0.0), r"feature_std \(0\.0\) must be > 0"),
    (dict(freq_mask_width=17), r"freq_mask_width \(17\) must be <= n_mels \(16\)"),
    (dict(time_masks=-1), r"time_masks \(-1\) must be >= 0"),
    (dict(max_seconds=0), r"max_seconds \(0\) must be > 0"),
])
def test_config_errors_name_the_key(override, match):
    with pytest.raises(UserError, match=match):
        flat(AudioEncoder, **{**TINY_AUDIO, **override})


def test_causal_is_never_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enc = flat(AudioEncoder, **TINY_AUDIO)                         # the default warns about nothing
    assert not any(block.self_attn.causal for block in enc.stack.blocks)
    with pytest.warns(UserWarning, match=r"AudioEncoder built with causal=True"):
        causal = flat(AudioEncoder, **TINY_AUDIO, causal=True)
    assert all(block.self_attn.causal for block in causal.stack.blocks)


def test_half_precision_keeps_the_front_end_in_float32():
    enc = flat(AudioEncoder, **TINY_AUDIO).eval()
    wave = 0.1 * torch.randn(2, 4000)
    ref = enc(wave).memory
    enc = enc.to(torch.bfloat16)
    assert enc.frontend.mel.spectrogram.window.dtype == torch.float32
    assert enc.frontend.mel.mel_scale.fb.dtype == torch.float32
    assert enc.frontend.feature_std.dtype == torch.float32
    assert enc.stem.conv1.weight.dtype == torch.bfloat16
    out = enc(wave).memory
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=0.15, rtol=0)   # bf16 has 8 mantissa bits


def test_rope_plus_sinusoidal_adds_the_time_table_after_the_stem_and_keeps_rope():
    """positions=rope+sinusoidal: the RoPE encoder's stack applied to the stem output plus
    Whisper's sinusoid table (written out here in float64), and neither mode alone."""
    import math

    torch.manual_seed(0)
    both = flat(AudioEncoder, **TINY_AUDIO, positions="rope+sinusoidal").eval()
    rope = flat(AudioEncoder, **TINY_AUDIO, positions="rope").eval()
    table_only = flat(AudioEncoder, **TINY_AUDIO, positions="sinusoidal").eval()
    rope.load_state_dict({k: v for k, v in both.state_dict().items()
                          if not k.startswith("positions.")})
    table_only.load_state_dict(both.state_dict())
    wave, lengths = torch.randn(2, 16000), torch.tensor([16000, 9000])
    feats, frames = both.frontend(wave, lengths)
    x, tokens = both.stem(feats, frames)                                   # (b, s, c)
    s, c = x.shape[1], x.shape[2]
    table = torch.zeros(s, c, dtype=torch.float64)
    for p in range(s):
        for k in range(c // 2):
            angle = p * math.exp(-k * math.log(10000.0) / (c // 2 - 1))
            table[p, k], table[p, c // 2 + k] = math.sin(angle), math.cos(angle)
    mask = torch.arange(s)[None] < tokens[:, None]
    expected = rope.stack(x + table.float(), key_mask=mask).masked_fill(~mask[..., None], 0.0)
    out = both(wave, lengths)
    torch.testing.assert_close(out.memory, expected, atol=1e-5, rtol=0)
    assert not torch.allclose(out.memory, rope(wave, lengths).memory, atol=1e-3)
    assert not torch.allclose(out.memory, table_only(wave, lengths).memory, atol=1e-3)
