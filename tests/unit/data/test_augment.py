"""Waveform augmentation (mmtf.data.augment): draws are a pure function of (seed, epoch, item),
training only; speed keeps lengths and the encoder's valid frames right; noise hits its SNR;
gain its dB; mixup mixes pairs and the task's loss weights both captions; bad config values are
one-line ConfigErrors naming the key."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchaudio

from mmtf.data import CaptionDataModule
from mmtf.data.augment import Mixup, WaveAugment, add_noise, build_augment, speed
from mmtf.data.collate import Collate
from mmtf.decoders import EncoderDecoder, TextDecoder
from mmtf.encoders import AudioEncoder
from mmtf.errors import ConfigError
from mmtf.text import BPETokenizer
from tests.unit.presets import flat

from .conftest import sine, write_audio

EVERYTHING = {"speed": {"p": 1.0, "factors": [0.9, 1.1]}, "noise": {"p": 1.0},
              "gain": {"p": 1.0}, "mixup": {"p": 1.0, "alpha": 0.4}}


def _dm(root, augment=None, **kw) -> CaptionDataModule:
    dm = flat(CaptionDataModule, format="clotho", root=str(root), batch_size=3, max_seconds=3.0,
                           seed=3, augment=augment, **kw)
    dm.setup("fit")
    dm.setup("test")
    dm.connect(BPETokenizer.train(dm.train_captions(), vocab_size=200))
    return dm


def test_item_draws_are_a_pure_function_of_seed_epoch_item(tiny_audio_captions):
    plain = _dm(tiny_audio_captions)._dataset("train", "random")
    data = _dm(tiny_audio_captions, EVERYTHING)._dataset("train", "random")
    again = _dm(tiny_audio_captions, EVERYTHING)._dataset("train", "random")   # another process
    for item in range(3):
        a = data[(item, 0, 1)]["audio"]
        assert torch.equal(a, again[(item, 0, 1)]["audio"])            # same key: same clip
        assert not torch.equal(a, data[(item, 0, 2)]["audio"])          # next epoch: other draws
        assert a.shape != plain[(item, 0, 1)]["audio"].shape            # sped up or slowed down
    seeded = _dm(tiny_audio_captions, EVERYTHING)._dataset("train", "random")
    seeded.seed = 4
    assert not torch.equal(seeded[(0, 0, 1)]["audio"], data[(0, 0, 1)]["audio"])


def test_augmentation_is_off_in_validation_and_test(tiny_audio_captions):
    plain, augmented = _dm(tiny_audio_captions), _dm(tiny_audio_captions, EVERYTHING)
    for split in ("val", "test"):
        a, b = next(iter(plain._loader(split))), next(iter(augmented._loader(split)))
        assert torch.equal(a["audio"], b["audio"]) and "mix_lambda" not in b
    batch = next(iter(augmented.train_dataloader()))
    assert {"mix_index", "mix_lambda"} <= batch.keys()


def test_mixup_pairs_are_a_pure_function_of_seed_epoch_and_items():
    audio = torch.randn(6, 100)
    lengths = torch.tensor([100, 80, 60, 100, 40, 90])
    mixup = Mixup(p=1.0, alpha=0.4, seed=7)
    out = mixup(audio, lengths, epoch=2, items=[5, 1, 0, 3, 2, 4])
    same = Mixup(p=1.0, alpha=0.4, seed=7)(audio, lengths, epoch=2, items=[5, 1, 0, 3, 2, 4])
    assert all(torch.equal(out[k], same[k]) for k in out)
    other = mixup(audio, lengths, epoch=3, items=[5, 1, 0, 3, 2, 4])
    assert not torch.equal(out["mix_lambda"], other["mix_lambda"])
    j, lam = out["mix_index"], out["mix_lambda"]
    assert sorted(j.tolist()) == list(range(6)) or (j == torch.arange(6)).any()
    expected = lam[:, None] * audio + (1 - lam[:, None]) * audio[j]
    assert torch.equal(out["audio"], expected)
    assert torch.equal(out["audio_lengths"], torch.maximum(lengths, lengths[j]))
    assert ((lam < 1) == (j != torch.arange(6))).all()       # unmixed items keep weight 1
    none = Mixup(p=0.0, alpha=0.4)(audio, lengths, epoch=2, items=list(range(6)))
    assert torch.equal(none["audio"], audio) and (none["mix_lambda"] == 1).all()


def test_collate_seeds_mixup_from_the_examples_keys():
    examples = [{"audio": torch.randn(50 + 10 * i), "tokens": np.array([1, 5, 2]),
                 "references": ["x"], "id": str(i), "_key": (i + 10, 4)} for i in range(4)]
    collate = Collate(modality="audio", targets="caption", mixup=Mixup(p=1.0, alpha=1.0, seed=1))
    batch = collate(examples)
    plain = Collate(modality="audio", targets="caption")(examples)
    reference = Mixup(p=1.0, alpha=1.0, seed=1)(plain["audio"], plain["audio_lengths"],
                                                epoch=4, items=[10, 11, 12, 13])
    assert all(torch.equal(batch[k], reference[k]) for k in reference)


def test_speed_matches_torchaudio_and_the_encoder_mask_follows_the_new_length():
    sr = 16000
    wave = torch.from_numpy(sine(0.7, sr))
    for factor in (0.9, 1.1):
        fast = speed(wave, sr, factor)
        ref, ref_len = torchaudio.functional.speed(wave[None], sr, factor,
                                                   torch.tensor([wave.shape[0]]))
        assert fast.shape[0] == ref.shape[1] == int(ref_len)
        torch.testing.assert_close(fast, ref[0], atol=1e-5, rtol=0)
        assert fast.shape[0] == pytest.approx(wave.shape[0] / factor, abs=1)
    aug = WaveAugment(sample_rate=sr, speed_p=1.0, speed_factors=(0.9,))
    slow = aug(wave, np.random.default_rng(0))
    batch = Collate(modality="audio", targets="label")(
        [{"audio": slow, "label": 0, "id": "a"}, {"audio": torch.randn(16000), "label": 0,
                                                  "id": "b"}])
    assert int(batch["audio_lengths"][0]) == slow.shape[0] == math.ceil(wave.shape[0] / 0.9)
    enc = flat(AudioEncoder, dim=32, depth=1, num_heads=4, n_mels=16, freq_masks=0,
               time_masks=0)
    with torch.no_grad():
        out = enc(batch["audio"], batch["audio_lengths"])
        alone = enc(slow[None])
    frames = slow.shape[0] // 160 + 1                             # the front end's valid frames
    valid = int(enc.stem.output_lengths(torch.tensor([frames]))[0])
    assert int(out.mask[0].sum()) == valid == alone.mask.shape[1]
    torch.testing.assert_close(out.memory[0, :valid], alone.memory[0], atol=1e-5, rtol=0)


def test_a_slowed_clip_is_never_cut_the_nearest_faster_factor_that_fits_is_used():
    # Cutting a slowed clip at max_seconds drops its end but keeps the whole transcript
    # (issue 40, defect 9): the drawn factor is kept when the clip fits, else the next
    # configured factor up that fits, else none (the clip as it came).
    sr, wave = 16000, torch.randn(16000)
    ref = {f: torchaudio.functional.speed(wave[None], sr, f)[0][0] for f in (0.5, 0.8, 2.0)}
    rng = np.random.default_rng
    fits = WaveAugment(sample_rate=sr, max_samples=32000, speed_p=1.0, speed_factors=(0.5,))
    torch.testing.assert_close(fits(wave, rng(0)), ref[0.5], atol=1e-5, rtol=0)
    full = dict(sample_rate=sr, max_samples=16000, speed_p=1.0)
    for factors, want in (((0.5, 0.8, 2.0), ref[2.0]), ((0.5, 1.0, 2.0), wave),
                          ((0.5, 0.8), wave)):
        out = WaveAugment(**full, speed_factors=factors)(wave, rng(0))   # draws 0.5 (index 0)
        torch.testing.assert_close(out, want, atol=1e-5, rtol=0)
    roomy = WaveAugment(sample_rate=sr, max_samples=20000, speed_p=1.0, speed_factors=(0.5, 0.8))
    torch.testing.assert_close(roomy(wave, rng(0)), ref[0.8], atol=1e-5, rtol=0)


def test_speed_in_the_data_path_keeps_every_slowed_clip_whole(tiny_audio_captions):
    def dataset(augment):
        dm = flat(CaptionDataModule, format="clotho", root=str(tiny_audio_captions),
                  batch_size=3, max_seconds=2.2, seed=3, augment=augment)
        dm.setup("fit")
        dm.connect(BPETokenizer.train(dm.train_captions(), vocab_size=200))
        return dm._dataset("train", "random")
    plain, slowed = dataset(None), dataset({"speed": {"p": 1.0, "factors": [0.9]}})
    kept = 0
    for item in range(len(plain)):
        clip, out = plain[(item, 0, 1)]["audio"], slowed[(item, 0, 1)]["audio"]
        assert out.shape[0] <= 35200                                   # max_seconds still holds
        if torch.equal(out, clip):             # 0.9 would not fit: the clip as it came, whole
            continue
        torch.testing.assert_close(out, speed(clip, 16000, 0.9))        # slowed, not cut
        kept += 1
    assert 0 < kept < len(plain)       # 1.2-2 s clips, 2.2 s at most: both cases occur


def test_noise_hits_the_drawn_snr_and_gain_the_drawn_db(tmp_path):
    wave = torch.from_numpy(sine(1.0, 16000))
    noise = torch.randn(16000)
    for snr in (0.0, 10.0, 25.0):
        mixed = add_noise(wave, noise, snr)
        ref = torchaudio.functional.add_noise(wave[None], noise[None], torch.tensor([snr]))[0]
        torch.testing.assert_close(mixed, ref, atol=1e-6, rtol=0)
        measured = 10 * math.log10(wave.square().mean() / (mixed - wave).square().mean())
        assert measured == pytest.approx(snr, abs=1e-3)
    assert torch.equal(add_noise(wave, torch.zeros(16000), 10.0), wave)   # silent noise: no NaN
    aug = WaveAugment(sample_rate=16000, noise_p=1.0, snr_db=(12.0, 12.0), gain_p=1.0,
                      gain_db=(-6.0, -6.0))
    out = aug(wave, np.random.default_rng(0)) / 10 ** (-6 / 20)
    assert 10 * math.log10(wave.square().mean() / (out - wave).square().mean()) == \
        pytest.approx(12.0, abs=1e-3)
    folder = tmp_path / "noise"
    write_audio(folder / "a.wav", (0.1 * np.random.default_rng(0).standard_normal(4000))
                .astype(np.float32), sr=8000)
    from_files, _ = build_augment({"noise": {"p": 1.0, "folder": str(folder)}},
                                  sample_rate=16000, max_seconds=None, seed=0, targets="caption")
    assert from_files.noise_files == (folder / "a.wav",)
    drawn = from_files.noise(24000, np.random.default_rng(0))   # 1 s of 0.5 s file: repeated
    assert drawn.shape == (24000,) and torch.equal(drawn[:8000], drawn[8000:16000])


def test_mixup_loss_is_the_lambda_weighted_sum_of_two_cross_entropies():
    torch.manual_seed(0)
    enc = flat(AudioEncoder, dim=32, depth=1, num_heads=4, n_mels=16, freq_masks=0,
               time_masks=0)
    dec = TextDecoder(vocab_size=20, dim=32, depth=1, num_heads=4, context_dim=32)
    model = EncoderDecoder(encoder=enc, decoder=dec, label_smoothing=0.1).eval()
    audio = torch.randn(3, 4000)
    lengths = torch.tensor([4000, 3000, 2500])
    # [bos, words, eos, pad]: bos 1, eos 2, pad 0; scored: the words and the eos.
    tokens = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0], [1, 9, 10, 2, 0]])
    partner, lam = torch.tensor([2, 0, 1]), torch.full((3,), 0.3)
    loss = model.mixup_forward(audio, lengths, tokens, partner, lam).loss

    def cross_entropy(targets: torch.Tensor) -> torch.Tensor:
        """Token-mean smoothed CE of ``targets`` against the mixed inputs, by hand."""
        memory = enc(audio, lengths)
        logp = dec(targets[:, :-1], memory.memory, memory.mask).log_softmax(-1)
        total, count = 0.0, 0
        for row in range(3):
            for pos in range(targets.shape[1] - 1):
                target = int(targets[row, pos + 1])
                if target == 0:
                    continue
                nll = -logp[row, pos, target]
                total = total + 0.9 * nll - 0.1 * logp[row, pos].mean()
                count += 1
        return total / count

    with torch.no_grad():
        expected = 0.3 * cross_entropy(tokens) + 0.7 * cross_entropy(tokens[partner])
        torch.testing.assert_close(loss, expected, atol=1e-5, rtol=0)
        # Every weight 1: the plain loss; two captions per input: rows follow the partner.
        plain = model(audio, lengths, tokens).loss
        assert torch.equal(model.mixup_forward(audio, lengths, tokens, torch.arange(3),
                                               torch.ones(3)).loss, plain)
        two = tokens.repeat_interleave(2, dim=0)
        torch.testing.assert_close(model.mixup_forward(audio, lengths, two, partner, lam).loss,
                                   expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("spec", "match"), [
    ({"gain": {"p": 1.5}}, r"data\.augment\.gain\.p \(1\.5\) must be a probability in \[0, 1\]"),
    ({"mixup": {"p": -0.1}}, r"data\.augment\.mixup\.p \(-0\.1\)"),
    ({"mixup": {"alpha": 0}}, r"data\.augment\.mixup\.alpha \(0\) must be > 0"),
    ({"speed": {"factors": []}}, r"data\.augment\.speed\.factors \(\[\]\) must be a non-empty"),
    ({"noise": {"snr_db": [30, 10]}}, r"data\.augment\.noise\.snr_db \(\[30, 10\]\) must be "
                                      r"\[low, high\]"),
    ({"noise": {"exponent": [-1, 1]}}, r"data\.augment\.noise\.exponent .* >= 0\.0"),
    ({"reverb": {"p": 1}}, r"data\.augment has unknown key\(s\) \['reverb'\]; the keys are"),
    ({"gain": {"p": 1, "range": 3}}, r"data\.augment\.gain has unknown key\(s\) \['range'\]"),
    ({"noise": {"p": 1, "folder": "EMPTY"}}, r"data\.augment\.noise\.folder \('.*'\) holds no "
                                             r"audio file"),
    ({"noise": {"p": 1, "folder": "MISSING"}}, r"data\.augment\.noise\.folder .* is not a "
                                               r"folder"),
])
def test_bad_augment_values_are_one_line_config_errors(spec, match, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not audio")
    noise = spec.get("noise", {})
    if noise.get("folder") == "EMPTY":
        noise["folder"] = str(tmp_path / "empty")
    elif noise.get("folder") == "MISSING":
        noise["folder"] = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match=match) as err:
        build_augment(spec, sample_rate=16000, max_seconds=None, seed=0, targets="caption")
    assert "\n" not in str(err.value)


def test_mixup_on_label_data_and_augment_on_images_are_config_errors(tiny_audio_labels,
                                                                     tiny_image_captions):
    from mmtf.data import ClassificationDataModule

    with pytest.raises(ConfigError, match=r"data\.augment\.mixup\.p \(1\.0\) must be 0 for "
                                          r"label data"):
        flat(ClassificationDataModule, format="esc50", root=str(tiny_audio_labels),
                                 augment={"mixup": {"p": 1.0}})
    with pytest.raises(ConfigError, match=r"data\.augment is for audio; this data is image"):
        flat(CaptionDataModule, format="coco", root=str(tiny_image_captions),
                          augment={"gain": {"p": 0.5}})
    # All p = 0 (the configs' default): nothing is built, on any data.
    assert build_augment(EVERYTHING | {k: {"p": 0.0} for k in EVERYTHING}, sample_rate=16000,
                         max_seconds=None, seed=0, targets="label") == (None, None)


def test_noise_draws_one_stream_whatever_else_is_switched_on():
    """The per-item draws are made in one order, so switching gain on keeps the noise."""
    wave = torch.from_numpy(sine(0.5, 16000))
    noise_only = WaveAugment(sample_rate=16000, noise_p=1.0)
    with_gain = WaveAugment(sample_rate=16000, noise_p=1.0, gain_p=1.0, gain_db=(0.0, 0.0))
    a = noise_only(wave, np.random.default_rng(5))
    b = with_gain(wave, np.random.default_rng(5))
    assert torch.equal(a, b)
    assert F.mse_loss(a, wave) > 0
