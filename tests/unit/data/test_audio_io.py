"""Audio decoding: formats, mono mixing, resampling, cropping and every kind of bad file."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import torch

from mmtf.data import DataError, audio_info, load_audio
from mmtf.data.audio import crop_window, get_resampler, resample
from tests.unit.data.conftest import sine, write_audio
from tests.unit.presets import flat


def _dominant_hz(x: np.ndarray, sr: int) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spec) * sr / len(x))


@pytest.mark.parametrize("ext,kw", [("wav", {"subtype": "PCM_16"}), ("flac", {}),
                                    ("wav", {"subtype": "FLOAT"})])
def test_lossless_round_trip(tmp_path, ext, kw):
    ref = sine(0.5, 16000)
    path = write_audio(tmp_path / f"a.{ext}", ref, **kw)
    out = load_audio(path, sample_rate=16000)
    assert out.dtype == torch.float32 and out.shape == (8000,)
    np.testing.assert_allclose(out.numpy(), ref, atol=1.0 / 32768 + 1e-7)


@pytest.mark.parametrize("ext,kw", [("ogg", {"subtype": "VORBIS"}),
                                    ("mp3", {"subtype": "MPEG_LAYER_III"})])
def test_lossy_formats_decode_to_the_same_tone(tmp_path, ext, kw):
    path = write_audio(tmp_path / f"a.{ext}", sine(1.0, 16000, hz=440.0), **kw)
    out = load_audio(path, sample_rate=16000).numpy()
    assert abs(len(out) - 16000) <= 1152 * 2  # codec frame padding at most
    assert abs(_dominant_hz(out, 16000) - 440.0) < 3.0


def test_channels_are_averaged_to_mono(tmp_path):
    left, right = sine(0.25, 16000, 440.0), sine(0.25, 16000, 1000.0, amp=0.25)
    third = np.full_like(left, 0.1)
    path = write_audio(tmp_path / "s.wav", np.stack([left, right, third], 1), subtype="FLOAT")
    out = load_audio(path, sample_rate=16000)
    np.testing.assert_allclose(out.numpy(), (left + right + third) / 3, atol=1e-6)


def test_required_channel_count(tmp_path):
    path = write_audio(tmp_path / "st.wav", np.zeros((1600, 2), np.float32) + 0.1)
    assert load_audio(path, channels=2).shape == (1600,)
    with pytest.raises(DataError, match=r"st\.wav.*2 channel\(s\) but data\.channels=1") as e:
        load_audio(path, channels=1)
    assert e.value.reason == "channels"
    with pytest.raises(DataError, match="data.channels=1"):
        audio_info(path, channels=1)


def test_resampling_matches_the_analytic_signal(tmp_path):
    path = write_audio(tmp_path / "hi.wav", sine(1.0, 44100, hz=1000.0), 44100, subtype="FLOAT")
    out = load_audio(path, sample_rate=16000).numpy()
    assert len(out) == 16000
    ref = sine(1.0, 16000, hz=1000.0)
    # Away from the edges (the sinc kernel sees zeros beyond them) it is the same sine.
    np.testing.assert_allclose(out[200:-200], ref[200:-200], atol=5e-3)


def test_resampler_kernel_is_cached_per_rate_pair():
    assert get_resampler(44100, 16000) is get_resampler(44100, 16000)
    assert get_resampler(44100, 16000) is not get_resampler(22050, 16000)
    x = torch.randn(100)
    assert resample(x, 16000, 16000) is x


def test_keep_native_rate(tmp_path):
    path = write_audio(tmp_path / "n.wav", sine(0.1, 22050), 22050)
    assert load_audio(path, sample_rate=None).shape == (2205,)


@pytest.mark.parametrize("crop,start", [("center", 3000), ("start", 0)])
def test_deterministic_crops(tmp_path, crop, start):
    ref = np.linspace(-0.5, 0.5, 16000, dtype=np.float32)
    path = write_audio(tmp_path / "r.wav", ref, subtype="FLOAT")
    out = load_audio(path, max_seconds=0.625, crop=crop).numpy()  # 10000 samples
    np.testing.assert_array_equal(out, ref[start:start + 10000])


def test_random_crop_is_seeded_and_in_range(tmp_path):
    ref = np.linspace(-0.5, 0.5, 16000, dtype=np.float32)
    path = write_audio(tmp_path / "r.wav", ref, subtype="FLOAT")
    starts = []
    for seed in range(6):
        out = load_audio(path, max_seconds=0.25, crop="random",
                         rng=np.random.default_rng(seed)).numpy()
        start = int(np.argmin(np.abs(ref - out[0])))
        np.testing.assert_array_equal(out, ref[start:start + 4000])
        again = load_audio(path, max_seconds=0.25, crop="random", rng=np.random.default_rng(seed))
        np.testing.assert_array_equal(out, again.numpy())
        starts.append(start)
    assert len(set(starts)) > 1 and all(0 <= s <= 12000 for s in starts)


def test_full_crop_and_short_files_are_not_cut(tmp_path):
    path = write_audio(tmp_path / "r.wav", sine(1.0, 16000))
    assert load_audio(path, max_seconds=0.5, crop="full").shape == (16000,)
    assert load_audio(path, max_seconds=5.0, crop="random").shape == (16000,)
    assert crop_window(100, 40, "center") == (30, 40)
    with pytest.raises(ValueError, match=r"crop \('middle'\)"):
        crop_window(100, 40, "middle")


# ------------------------------------------------------------------ bad input
def test_missing_file_names_file_and_row(tmp_path):
    with pytest.raises(DataError, match=r"nope\.wav \(x\.csv line 7\): file not found") as e:
        load_audio(tmp_path / "nope.wav", where="x.csv line 7")
    assert e.value.reason == "missing_file" and isinstance(e.value, ValueError)


def test_empty_file(tmp_path):
    (tmp_path / "e.wav").write_bytes(b"")
    with pytest.raises(DataError, match=r"e\.wav: file is empty \(0 bytes\)") as e:
        audio_info(tmp_path / "e.wav")
    assert e.value.reason == "empty_file"


def test_random_bytes_are_undecodable(tmp_path):
    (tmp_path / "r.wav").write_bytes(np.random.default_rng(0).bytes(4000))
    for fn in (audio_info, load_audio):
        with pytest.raises(DataError, match=r"r\.wav: cannot be decoded.*re-encode") as e:
            fn(tmp_path / "r.wav")
        assert e.value.reason == "undecodable"


def test_truncated_wav_is_detected_from_the_header(tmp_path):
    path = write_audio(tmp_path / "t.wav", sine(1.0, 16000))
    path.write_bytes(path.read_bytes()[:12000])
    for fn in (audio_info, load_audio):
        with pytest.raises(DataError, match=r"t\.wav: file is truncated") as e:
            fn(path)
        assert e.value.reason == "truncated"


@pytest.mark.parametrize("ext", ["flac", "mp3"])
def test_truncated_compressed_files_fail_on_decode(tmp_path, ext):
    path = write_audio(tmp_path / f"t.{ext}", np.random.default_rng(0).normal(0, .1, 32000)
                       .astype(np.float32))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    with pytest.raises(DataError, match=rf"t\.{ext}") as e:
        load_audio(path)
    assert e.value.reason in ("truncated", "undecodable")


def test_zero_length_audio(tmp_path):
    path = write_audio(tmp_path / "z.wav", np.zeros((0, 1), np.float32))
    with pytest.raises(DataError, match="no samples") as e:
        audio_info(path)
    assert e.value.reason == "zero_length"
    with pytest.raises(DataError, match="no samples"):
        load_audio(path)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_samples(tmp_path, bad):
    x = sine(0.1, 16000)
    x[10] = bad
    path = write_audio(tmp_path / "n.wav", x, subtype="FLOAT")
    with pytest.raises(DataError, match=r"n\.wav: has 1 NaN/inf sample") as e:
        load_audio(path)
    assert e.value.reason == "non_finite"


def test_data_error_survives_a_worker_reraise():
    # DataLoader workers re-raise as exc_type(message): one positional arg must work.
    err = DataError("Caught DataError in DataLoader worker process 0.")
    assert str(err).startswith("Caught") and err.reason == "invalid"


def test_info_reports_duration(tmp_path):
    path = write_audio(tmp_path / "d.flac", sine(1.5, 8000), 8000)
    info = audio_info(path)
    assert (info.frames, info.sample_rate, info.channels) == (12000, 8000, 1)
    assert info.duration == pytest.approx(1.5)
    assert os.path.exists(path)


# ------------------------------------------------------------------ decoded-audio cache
def _caption_items(paths):
    from mmtf.data.formats.base import LabelItem

    return [LabelItem(id=str(i), path=p, label=i, where=f"line {i}") for i, p in enumerate(paths)]


@pytest.mark.parametrize("ext,subtype,rate,channels", [
    ("wav", "PCM_16", 16000, 1),
    ("flac", "PCM_16", 22050, 2),      # FLAC, resampled, stereo mixed down
    ("wav", "PCM_24", 16000, 1),
    ("wav", "FLOAT", 44100, 2),
])
def test_decoded_audio_cache_reads_once_and_changes_no_sample(tmp_path, monkeypatch, ext,
                                                              subtype, rate, channels):
    from mmtf.data import datasets

    rng = np.random.default_rng(1)
    paths = []
    for i, seconds in enumerate((1.3, 0.7, 1.9)):
        wave = rng.uniform(-0.9, 0.9, (int(seconds * rate), channels)).astype(np.float32)
        paths.append(write_audio(tmp_path / f"{i}.{ext}", wave, rate, subtype=subtype))
    items = _caption_items(paths)
    whole, windows = [], []
    real_whole, real_window = datasets.read_stored_audio, datasets.load_audio
    monkeypatch.setattr(datasets, "read_stored_audio",
                        lambda p, **kw: whole.append(p.name) or real_whole(p, **kw))
    monkeypatch.setattr(datasets, "load_audio",
                        lambda p, **kw: windows.append(p.name) or real_window(p, **kw))
    # Room for the first two files and a little (16-bit PCM is kept as int16, the rest as
    # float32): the third is asked for once, does not fit, and is not asked for again.
    itemsize = 2 if subtype == "PCM_16" else 4
    room = (int(1.3 * rate) + int(0.7 * rate)) * channels * itemsize + 100
    kw = dict(modality="audio", sample_rate=16000, max_seconds=1.0, crop="random", seed=3)
    cached = datasets.LabelDataset(items, cache_bytes=room, **kw)
    keys = [(i, 0, epoch) for epoch in range(3) for i in range(3)]
    got = [cached[key]["audio"] for key in keys]
    # Each file is read whole once; the one that does not fit is then decoded window by window
    # from the file, every epoch.
    assert whole == ["0." + ext, "1." + ext, "2." + ext]
    assert windows == ["2." + ext] * 3
    assert sorted(cached._cache) == [0, 1]
    assert cached._cache_left == room - sum(s.nbytes for s in cached._cache.values()) >= 100
    # The 0.7 s file is never cropped to 1 s: it is kept as the resampled mono waveform when its
    # rate is not the model's (resampled once); the cropped 1.3 s file as the file's samples.
    assert cached._cache[1].final == (rate != 16000) and not cached._cache[0].final
    windows.clear()
    plain = datasets.LabelDataset(items, **kw)
    for key, wave in zip(keys, got):   # libsndfile's own seek and float decode, each time
        torch.testing.assert_close(wave, plain[key]["audio"], rtol=0, atol=0)
    # Random crops still move with the epoch (the 1.3 s file, cropped to 1 s).
    assert not torch.equal(got[0], got[3])
    # A caller changing a waveform in place leaves the cache as decoded.
    for index in (0, 1):
        cached[(index, 0, 0)]["audio"].zero_()
        torch.testing.assert_close(cached[(index, 0, 0)]["audio"], plain[(index, 0, 0)]["audio"],
                                   rtol=0, atol=0)


@pytest.mark.parametrize("ext,subtype", [("ogg", "VORBIS"), ("mp3", "MPEG_LAYER_III")])
def test_lossy_audio_is_decoded_from_the_file_every_time(tmp_path, monkeypatch, ext, subtype):
    from mmtf.data import datasets

    path = write_audio(tmp_path / f"a.{ext}", sine(1.0, 16000), subtype=subtype)
    opened = []
    real_whole = datasets.read_stored_audio
    monkeypatch.setattr(datasets, "read_stored_audio",
                        lambda p, **kw: opened.append(p.name) or real_whole(p, **kw))
    cached = datasets.LabelDataset(_caption_items([path]), modality="audio",
                                   max_seconds=0.5, crop="random", cache_bytes=10 ** 7)
    plain = datasets.LabelDataset(_caption_items([path]), modality="audio", max_seconds=0.5,
                                  crop="random")
    for epoch in range(3):
        torch.testing.assert_close(cached[(0, 0, epoch)]["audio"], plain[(0, 0, epoch)]["audio"],
                                   rtol=0, atol=0)
    # Asked once: a lossy file is never kept (a window decoded after a seek is not a slice
    # of the whole decode), and not reopened to ask again.
    assert opened == [f"a.{ext}"] and not cached._cache


@pytest.fixture(scope="module")
def tiny_audio_captions_22k(tmp_path_factory):
    """The tiny caption set written at 22.05 kHz: the model's 16 kHz needs resampling."""
    from mmtf.synthetic import ensure_synthetic
    from tests.unit.data.conftest import TINY_AUDIO

    return ensure_synthetic(tmp_path_factory.mktemp("synth22k") / "audio_captions",
                            "audio_captions", **TINY_AUDIO, sample_rate=22050)


def _two_epochs(root, max_seconds=1.5, **kw):
    """The training batches' waveforms over two epochs, and the training dataset."""
    from mmtf.data import CaptionDataModule
    from mmtf.text import build_tokenizer

    dm = flat(CaptionDataModule, format="clotho", root=str(root), batch_size=3,
                           max_seconds=max_seconds, seed=0, **kw)
    dm.setup("fit")
    dm.connect(build_tokenizer({"kind": "char"}, dm.train_captions))
    loader = dm.train_dataloader()
    out = []
    for epoch in range(2):
        loader.batch_sampler.set_epoch(epoch)
        out += [b["audio"] for b in loader]
    return out, loader.dataset


def test_audio_data_module_caches_with_media_cache_mb(tiny_audio_captions, caplog):
    with caplog.at_level(logging.INFO, logger="mmtf.data"):
        cached, dataset = _two_epochs(tiny_audio_captions, media_cache_mb=1)
    # The epoch's line says what the cache holds (six 1-2 s clips of 16-bit samples).
    held = sum(s.nbytes for s in dataset._cache.values()) / 2 ** 20
    assert f"kept decoded: 6 of 6 items, {held:.1f} of 1.0 MiB" in caplog.text
    plain, _ = _two_epochs(tiny_audio_captions)
    assert len(dataset._cache) == 6       # the six training clips, 16-bit PCM kept as int16
    assert all(s.samples.dtype == np.int16 for s in dataset._cache.values())
    for a, b in zip(cached, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_resampled_clips_are_kept_resampled_when_never_cropped(tiny_audio_captions_22k):
    # The clips last 1.7-2.0 s: those under max_seconds are never cropped.
    cached, dataset = _two_epochs(tiny_audio_captions_22k, max_seconds=1.9, media_cache_mb=1)
    plain, _ = _two_epochs(tiny_audio_captions_22k, max_seconds=1.9)
    kept = dataset._cache.values()
    # Clips of at most max_seconds as 16 kHz waveforms, longer ones as their 22.05 kHz samples
    # (cropped, then resampled, each epoch).
    short = [s for s in kept if s.final]
    long = [s for s in kept if not s.final]
    assert short and long and len(dataset._cache) == 6
    assert all(s.sample_rate == 16000 and s.samples.dtype == np.float32 for s in short)
    assert all(s.sample_rate == 22050 and s.samples.shape[0] > 1.9 * 22050 for s in long)
    for a, b in zip(cached, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
