"""Audio decoding shared by every mmtf dataset: soundfile -> mono -> resample -> crop.

``soundfile`` decodes; torchaudio only resamples (kernels cached per rate pair). ``channels=None``
mixes any channel count down to mono; ``channels=k`` makes any other count a :class:`DataError`.
Cropping happens at the file's rate before resampling (a 10-minute file decodes only the crop).
Crop policies: ``random`` (training), ``center``, ``start``, ``full``.

Shapes: s samples at the model rate; f frames at the file's rate; c channels."""

from __future__ import annotations

import functools
import io
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import soundfile as sf
import torch
import torchaudio
from torch import Tensor

from mmtf.data.errors import check_media_file
from mmtf.errors import DataError, UserError

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".mp3", ".opus", ".aiff", ".aif")
Crop = Literal["random", "center", "start", "full"]
CROP_CHOICES = ("random", "center", "start", "full")

# libsndfile's header log says e.g. "data : 128000 (should be 63956)" for a cut-off WAV.
_SHOULD_BE = re.compile(r"^\s*data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
_STREAMING_SIZES = {0, 0xFFFFFFFF, 0x7FFFFFFF}  # placeholder sizes written by streaming encoders
_FIX_DECODE = "re-encode it (e.g. `ffmpeg -i in -ar 16000 out.wav`) or remove it from the index"


@dataclass(frozen=True)
class AudioInfo:
    """What the header says about one file."""

    frames: int
    sample_rate: int
    channels: int

    @property
    def duration(self) -> float:
        """Length in seconds."""
        return self.frames / self.sample_rate


def _check_header(path: Path, info: AudioInfo, log: str, channels: int | None,
                  where: str | None) -> None:
    if info.frames <= 0:
        raise DataError.make("zero_length", path, "audio has no samples (0 frames)",
                             "remove it from the index", where)
    for declared, actual in _SHOULD_BE.findall(log):
        if int(declared) > int(actual) and int(declared) not in _STREAMING_SIZES:
            raise DataError.make(
                "truncated", path,
                f"file is truncated (header promises {declared} data bytes, file holds {actual})",
                "re-copy or re-download it", where)
    if channels is not None and info.channels != channels:
        raise DataError.make(
            "channels", path, f"has {info.channels} channel(s) but data.channels={channels}",
            "set data.channels=null to mix any channel count down to mono, or re-encode the file",
            where)


def audio_info(path: str | os.PathLike, *, channels: int | None = None,
               where: str | None = None, data: bytes | None = None) -> AudioInfo:
    """Frames, sample rate and channel count from one audio file's validated header (no
    samples are decoded); ``path``, ``channels``, ``where``, ``data`` as :func:`load_audio`.

    Raises:
        DataError: missing, empty, undecodable, truncated (WAV), zero-length or wrong channels.
    """
    path = _source_name(path, data, where)
    try:
        raw = sf.info(str(path) if data is None else io.BytesIO(data))
    except (sf.LibsndfileError, RuntimeError, TypeError) as e:
        codec = missing_codec(path)
        if codec is not None:   # every file of this kind fails alike: not a skippable row
            raise DataError.make("undecodable", path, f"cannot be decoded: {codec}",
                                 "install a soundfile whose libsndfile decodes it (soundfile>=0.12 "
                                 "wheels bundle libsndfile >= 1.1 with MP3), or convert the clips "
                                 "to FLAC", where, skippable=False) from None
        raise DataError.make("undecodable", path, f"cannot be decoded ({e})", _FIX_DECODE,
                             where) from None
    info = AudioInfo(frames=int(raw.frames), sample_rate=int(raw.samplerate),
                     channels=int(raw.channels))
    _check_header(path, info, raw.extra_info, channels, where)
    return info


def _source_name(path: str | os.PathLike, data: bytes | None, where: str | None) -> Path | str:
    """The file checked for existence (``data`` is None), or the name of in-memory bytes (a
    shard member, named ``<shard url>:<member>``: kept a str so a URL's ``//`` survives)."""
    if data is None:
        path = Path(path)
        check_media_file(path, where)
        return path
    if not data:
        raise DataError.make("empty_file", path, "member is empty (0 bytes)",
                             "rewrite the shard or remove the sample", where)
    return str(path)


# File extension -> the libsndfile major format that decodes it.
_CODECS = {".mp3": "MP3", ".flac": "FLAC", ".ogg": "OGG", ".opus": "OGG", ".wav": "WAV"}


def missing_codec(path: str | os.PathLike) -> str | None:
    """Why this libsndfile cannot decode files like ``path`` at all (no decoder for the
    format, e.g. MP3 before libsndfile 1.1), or None when it has the decoder."""
    fmt = _CODECS.get(Path(path).suffix.lower())
    if fmt is None or fmt in sf.available_formats():
        return None
    return (f"this libsndfile ({sf.__libsndfile_version__}) has no {fmt} decoder "
            f"(it decodes {sorted(sf.available_formats())})")


@functools.lru_cache(maxsize=32)
def get_resampler(orig: int, new: int) -> torchaudio.transforms.Resample:
    """The cached resampler for one rate pair (its sinc kernel is computed once)."""
    return torchaudio.transforms.Resample(orig_freq=orig, new_freq=new)


def resample(wave: Tensor, orig: int, new: int) -> Tensor:
    """Resample ``wave`` (..., s) from ``orig`` Hz to ``new`` Hz (no-op when equal).

    On one thread: the convolution's result depends on how many threads split it (by one ulp,
    for some lengths), and a DataLoader worker has one; so a clip is the same bits in a worker
    and in the main process (``data.loader.num_workers`` changes no example)."""
    if orig == new:
        return wave
    threads = torch.get_num_threads()
    try:
        if threads != 1:
            torch.set_num_threads(1)
        with torch.no_grad():
            return get_resampler(int(orig), int(new))(wave)
    finally:
        if threads != 1:
            torch.set_num_threads(threads)


def is_cropped(frames: int, want: int | None, crop: Crop) -> bool:
    """Whether :func:`crop_window` keeps less than the whole ``frames``-long file."""
    return want is not None and crop != "full" and frames > want


def crop_window(frames: int, want: int | None, crop: Crop,
                rng: np.random.Generator | None = None) -> tuple[int, int]:
    """Start and length (in frames) of the part of a ``frames``-long file to decode: at most
    ``want`` (None = all) chosen by ``crop`` (``random`` with ``rng``, else a fresh unseeded
    generator | ``center`` | ``start`` | ``full``)."""
    if crop not in CROP_CHOICES:
        raise UserError(f"crop ({crop!r}) must be one of {CROP_CHOICES}.")
    if not is_cropped(frames, want, crop):
        return 0, frames
    slack = frames - want
    if crop == "random":
        rng = rng if rng is not None else np.random.default_rng()
        return int(rng.integers(0, slack + 1)), want
    if crop == "center":
        return slack // 2, want
    return 0, want


def load_audio(path: str | os.PathLike, *, sample_rate: int | None = 16000,
               max_seconds: float | None = None, crop: Crop = "center",
               channels: int | None = None, rng: np.random.Generator | None = None,
               where: str | None = None, check_header: bool = True,
               data: bytes | None = None) -> Tensor:
    """Decode one audio file to a mono float32 waveform (s,) at ``sample_rate``.

    Args:
        path: WAV, FLAC, OGG or MP3 file (with ``data``: only its name in messages).
        sample_rate: the model's rate (None: keep the file's).
        max_seconds, crop: keep at most this much audio (None = all), chosen by ``crop``
            (``random`` | ``center`` | ``start``; ``full`` ignores ``max_seconds``).
        channels: required channel count, or None to accept any (mixed down to mono).
        rng, where: generator for ``crop="random"``; the index entry naming the file (messages).
        check_header: also run the header checks of :func:`audio_info` (e.g. truncated WAV).
        data: the file's bytes when it is not a file of its own (a tar shard member).

    Raises:
        DataError: the file is missing, empty, truncated, undecodable, has no samples, has
            NaN/inf samples or the wrong channel count.
    """
    if max_seconds is not None and max_seconds <= 0:
        raise UserError(f"max_seconds ({max_seconds}) must be > 0 or None (no limit).")
    path = _source_name(path, data, where)

    def window(info: AudioInfo, subtype: str) -> tuple[int, int]:
        return crop_window(info.frames, _frames_wanted(max_seconds, info), crop, rng)

    samples, info = _decode(path, data, where, channels, check_header, window, stored=False)
    return _mono_at_rate(samples, info.sample_rate, sample_rate)


@dataclass(frozen=True, eq=False)
class StoredAudio:
    """A whole audio file kept by :class:`mmtf.data.datasets.MediaDataset`'s decoded-media
    cache; :meth:`clip` gives the bits :func:`load_audio` decodes from the file. Either the file's
    samples (``final=False``: 16-bit PCM as int16, exactly libsndfile's float after ``/ 32768``)
    or, for a never-cropped file at another rate, the resampled waveform (``final=True``)."""

    samples: np.ndarray            # (f, c) int16 or float32 at sample_rate; final: (s, 1) float32
    sample_rate: int
    final: bool = False

    @property
    def nbytes(self) -> int:
        """Memory held by the samples."""
        return int(self.samples.nbytes)

    def clip(self, *, sample_rate: int | None = 16000, max_seconds: float | None = None,
             crop: Crop = "center", rng: np.random.Generator | None = None) -> Tensor:
        """The waveform :func:`load_audio` returns for these arguments, (s,) float32 (for the
        final form: the arguments it was made with)."""
        if self.final:    # a copy: the caller may change it in place, the cache stays
            return torch.from_numpy(self.samples[:, 0].copy())                # (s,)
        info = AudioInfo(frames=self.samples.shape[0], sample_rate=self.sample_rate,
                         channels=self.samples.shape[1])
        start, count = crop_window(info.frames, _frames_wanted(max_seconds, info), crop, rng)
        part = self.samples[start:start + count]                            # (f', c)
        # A new array either way: the caller may change the waveform in place.
        part = (part.astype(np.float32) * np.float32(1 / 0x8000) if part.dtype == np.int16
                else part.copy())
        return _mono_at_rate(part, self.sample_rate, sample_rate)

    def finalized(self, *, sample_rate: int | None, max_seconds: float | None,
                  crop: Crop) -> StoredAudio:
        """The final form when it applies (the file is never cropped at these settings and
        needs resampling to ``sample_rate``), else this one."""
        frames = self.samples.shape[0]
        want = _frames_wanted(max_seconds, AudioInfo(frames, self.sample_rate, 1))
        if (self.final or is_cropped(frames, want, crop)
                or sample_rate in (None, self.sample_rate)):
            return self
        wave = self.clip(sample_rate=sample_rate, max_seconds=max_seconds, crop=crop)  # (s,)
        return StoredAudio(samples=wave.numpy()[:, None], sample_rate=sample_rate, final=True)


# Subtypes whose windows read from the file equal the same slice of the whole decoded file.
_LOSSLESS_SUBTYPES = ("PCM_S8", "PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE")


def read_stored_audio(path: str | os.PathLike, *, channels: int | None = None,
                      where: str | None = None, data: bytes | None = None,
                      max_bytes: int | None = None) -> StoredAudio | None:
    """Decode a whole losslessly coded file for keeping in memory (see :class:`StoredAudio`);
    None (nothing decoded) when the coding is lossy or the samples exceed ``max_bytes``.
    ``path``, ``channels``, ``where``, ``data``: as :func:`load_audio`.

    Raises:
        DataError: as :func:`load_audio`.
    """
    path = _source_name(path, data, where)

    def whole_if_kept(info: AudioInfo, subtype: str) -> tuple[int, int] | None:
        itemsize = 2 if subtype == "PCM_16" else 4
        if subtype not in _LOSSLESS_SUBTYPES or (
                max_bytes is not None and info.frames * info.channels * itemsize > max_bytes):
            return None
        return 0, info.frames

    decoded = _decode(path, data, where, channels, False, whole_if_kept, stored=True)
    if decoded is None:
        return None
    samples, info = decoded
    return StoredAudio(samples=samples, sample_rate=info.sample_rate)


def _frames_wanted(max_seconds: float | None, info: AudioInfo) -> int | None:
    return None if max_seconds is None else max(1, math.ceil(max_seconds * info.sample_rate))


def _decode(path: Path | str, data: bytes | None, where: str | None, channels: int | None,
            check_header: bool, window: Callable[[AudioInfo, str], tuple[int, int] | None],
            *, stored: bool) -> tuple[np.ndarray, AudioInfo] | None:
    """Open, check and read ``window(info, subtype)`` = (start, count) frames of one file:
    ``((f, c) samples, info)``, or None when ``window`` declines. Samples are float32, or with
    ``stored`` as :class:`StoredAudio` keeps them (int16 for 16-bit PCM)."""
    try:
        with sf.SoundFile(str(path) if data is None else io.BytesIO(data)) as f:
            info = AudioInfo(frames=int(f.frames), sample_rate=int(f.samplerate),
                             channels=int(f.channels))
            if check_header:
                _check_header(path, info, f.extra_info, channels, where)
            else:  # probe() checked the header; only what costs nothing to check again
                _check_header(path, info, "", channels, where)
            span = window(info, f.subtype)
            if span is None:
                return None
            start, count = span
            if start:
                f.seek(start)
            read_as = "int16" if stored and f.subtype == "PCM_16" else "float32"
            samples = f.read(count, dtype=read_as, always_2d=True)       # (f, c)
    except (sf.LibsndfileError, RuntimeError, TypeError) as e:
        raise DataError.make("undecodable", path, f"cannot be decoded ({e})", _FIX_DECODE,
                             where) from None
    # Lossy decoders may return a frame or so less than the header says; a big gap is a cut file.
    if count - samples.shape[0] > max(2048, 0.01 * count):
        raise DataError.make("truncated", path,
                             f"file is truncated (decoded {samples.shape[0]} of {count} frames)",
                             "re-copy or re-download it", where)
    if samples.shape[0] == 0:
        raise DataError.make("zero_length", path, "audio has no samples after decoding",
                             "remove it from the index", where)
    if samples.dtype != np.int16 and not np.isfinite(samples).all():
        bad = int((~np.isfinite(samples)).sum())
        raise DataError.make("non_finite", path, f"has {bad} NaN/inf sample(s)",
                             "re-encode it as integer PCM or remove it from the index", where)
    return samples, info


def _mono_at_rate(samples: np.ndarray, file_rate: int, sample_rate: int | None) -> Tensor:
    """(f, c) float32 at ``file_rate`` -> (s,) float32 mono at ``sample_rate`` (None: kept)."""
    wave = torch.from_numpy(samples.mean(axis=1) if samples.shape[1] > 1 else samples[:, 0])
    wave = resample(wave, file_rate, sample_rate or file_rate)               # (s,)
    return wave.contiguous()


def fast_fft_len(n: int) -> int:
    """The smallest 2^a 3^b 5^c >= n: FFT sizes pocketfft handles fast (a prime n is 10x slower)."""
    best = 1 << max(0, n - 1).bit_length()
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35 << max(0, (n - 1) // p35).bit_length()  # times the power of 2 that reaches n
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


def colored_noise(rng: np.random.Generator, n: int, exponent: float) -> np.ndarray:
    """Unit-RMS noise (n,) float64 with a 1/f^exponent power spectrum (0 = white, 1 = pink, 2 =
    brown): the built-in sets' background and noise events, and additive-noise augmentation."""
    m = fast_fft_len(n)
    spec = np.fft.rfft(rng.standard_normal(m))
    f = np.arange(spec.shape[0], dtype=np.float64)
    f[0] = 1.0
    spec *= f ** (-exponent / 2)
    x = np.fft.irfft(spec, m)[:n]
    return x / (np.sqrt(np.mean(x**2)) + 1e-12)
