"""Waveform augmentation of training audio: speed, additive noise, gain per item; mixup per batch.

Configured by ``data.augment`` (all off by default, train split only; the keys and defaults are
in conf/data/clotho.yaml and :data:`DEFAULTS`).

Every draw is a pure function of ``(seed, epoch, item)`` (per item: ``sample_rng(...,
stream=AUGMENT_STREAM)``; mixup: seeded by the batch's items), so nothing is checkpointed. Order
per item: speed, noise, gain; mixup runs in :class:`~mmtf.data.collate.Collate`. Why this mixup
variant: docs/design/audio-augmentation.md.

Shapes: s samples; b batch."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mmtf.data.audio import AUDIO_EXTENSIONS, colored_noise, load_audio, resample
from mmtf.data.sampler import sample_rng
from mmtf.errors import ConfigError

__all__ = ["AUGMENT_STREAM", "Mixup", "WaveAugment", "add_noise", "augment_stream", "build_augment",
           "speed"]

AUGMENT_STREAM = 1     # sample_rng stream of the per-item augmentations (0 is the crop's)
_MIXUP_STREAM = 2      # first entropy word of a batch's mixup generator
DEFAULTS: dict[str, dict[str, Any]] = {
    "speed": {"p": 0.0, "factors": [0.9, 1.0, 1.1]},
    "noise": {"p": 0.0, "snr_db": [10.0, 30.0], "folder": None, "exponent": [0.0, 2.0]},
    "gain": {"p": 0.0, "db": [-6.0, 6.0]},
    "mixup": {"p": 0.0, "alpha": 0.4},
}


@dataclass(frozen=True)
class WaveAugment:
    """Speed, noise and gain of one training clip, drawn from a per-item generator.

    Args:
        sample_rate: Hz of the clips.
        max_samples: the longest clip a speed change may give (None = any): a factor that
            would exceed it gives way to the next larger configured one (:meth:`speed`).
        speed_p, speed_factors: probability of a speed change and the factors to pick from.
        noise_p, snr_db: probability of added noise and the (low, high) SNR range in dB.
        noise_files: noise recordings to draw from; empty = generated 1/f^e noise.
        noise_exponent: (low, high) range of the generated noise's exponent e.
        gain_p, gain_db: probability of a gain and its (low, high) range in dB.
    """

    sample_rate: int
    max_samples: int | None = None
    speed_p: float = 0.0
    speed_factors: tuple[float, ...] = (0.9, 1.0, 1.1)
    noise_p: float = 0.0
    snr_db: tuple[float, float] = (10.0, 30.0)
    noise_files: tuple[Path, ...] = ()
    noise_exponent: tuple[float, float] = (0.0, 2.0)
    gain_p: float = 0.0
    gain_db: tuple[float, float] = (-6.0, 6.0)

    def __call__(self, wave: Tensor, rng: np.random.Generator) -> Tensor:
        """Augment ``wave`` (s,) float32 -> (s',) float32; s' differs after a speed change.

        The draws are made in one fixed order whatever is switched on, so a clip's noise does
        not change when, say, the speed probability does.
        """
        do_speed, do_noise, do_gain = rng.random(3) < (self.speed_p, self.noise_p, self.gain_p)
        factor = float(self.speed_factors[int(rng.integers(len(self.speed_factors)))])
        snr = float(rng.uniform(*self.snr_db))
        gain = float(rng.uniform(*self.gain_db))
        if do_speed:
            wave = self.speed(wave, factor)
        if do_noise:
            wave = add_noise(wave, self.noise(wave.shape[0], rng), snr)
        if do_gain:
            wave = wave * 10.0 ** (gain / 20.0)
        return wave.contiguous()

    def speed(self, wave: Tensor, drawn: float) -> Tensor:
        """``wave`` at the drawn factor, or at the next configured factor up when it would
        outgrow ``max_samples`` (none fits: unchanged). Never cut: a cut drops the clip's end
        but not the words of its transcript or the events of its caption."""
        for factor in sorted(f for f in set(self.speed_factors) if f >= drawn):
            if factor == 1.0:
                return wave
            out = speed(wave, self.sample_rate, factor)
            if self.max_samples is None or out.shape[0] <= self.max_samples:
                return out
        return wave

    def noise(self, n: int, rng: np.random.Generator) -> Tensor:
        """n samples of noise (float32): a random window of a random noise file, repeated when
        the file is shorter, or generated 1/f^e noise."""
        if not self.noise_files:
            exponent = float(rng.uniform(*self.noise_exponent))
            return torch.from_numpy(colored_noise(rng, n, exponent).astype(np.float32))
        path = self.noise_files[int(rng.integers(len(self.noise_files)))]
        noise = load_audio(path, sample_rate=self.sample_rate, max_seconds=n / self.sample_rate,
                           crop="random", rng=rng)
        return noise.repeat(math.ceil(n / noise.shape[0]))[:n]


def speed(wave: Tensor, sample_rate: int, factor: float) -> Tensor:
    """Play ``wave`` (s,) ``factor`` times faster (pitch moves with it): resample from
    ``factor * rate`` to ``rate``, the resampling torchaudio's ``functional.speed`` does, with
    mmtf's cached kernels; s -> about s / factor samples."""
    return resample(wave, int(round(factor * sample_rate)), sample_rate)


def add_noise(wave: Tensor, noise: Tensor, snr_db: float) -> Tensor:
    """``wave + c * noise`` with c such that the power ratio is ``snr_db`` (the formula of
    ``torchaudio.functional.add_noise``); silent noise adds nothing (c = 0 instead of NaN).

    The powers are numpy float64 means: a torch reduction splits its sum by thread count, and
    a DataLoader worker (1 thread) would then add other noise than the main process."""
    signal_power = float(np.mean(np.square(wave.numpy(), dtype=np.float64)))
    noise_power = float(np.mean(np.square(noise.numpy(), dtype=np.float64)))
    if noise_power == 0.0:
        return wave
    scale = math.sqrt(signal_power / (noise_power * 10.0 ** (snr_db / 10.0)))
    return wave + float(scale) * noise


@dataclass(frozen=True)
class Mixup:
    """Mix the waveforms of pairs of a batch (Zhang et al. 2018, mixup).

    With probability ``p`` item i becomes ``λ x_i + (1 - λ) x_j`` (j from a permutation of the
    batch, λ ~ Beta(alpha, alpha); unmixed: λ = 1); the task weights both captions' losses.

    Args:
        p: probability that an item is mixed.
        alpha: Beta(alpha, alpha) parameter (small: λ near 0 or 1).
        seed: the run's data seed.
    """

    p: float
    alpha: float
    seed: int = 0

    def generator(self, epoch: int, items: Sequence[int]) -> np.random.Generator:
        """The batch's generator: a function of the seed, the epoch and its item indices."""
        return np.random.default_rng([_MIXUP_STREAM, self.seed, epoch, *items])

    def __call__(self, audio: Tensor, lengths: Tensor, epoch: int,
                 items: Sequence[int]) -> dict[str, Tensor]:
        """Mix a padded batch.

        Args:
            audio: (b, s) zero-padded waveforms; lengths: (b,) valid samples.
            epoch, items: the batch's epoch and the dataset index of each item.

        Returns:
            ``audio`` (b, s) mixed, ``audio_lengths`` (b,), ``mix_index`` (b,) long (each item's
            partner) and ``mix_lambda`` (b,) float32 (the weight of the item's own caption).
        """
        b = audio.shape[0]
        rng = self.generator(epoch, items)
        partner = torch.from_numpy(rng.permutation(b)).long()
        lam = torch.from_numpy(rng.beta(self.alpha, self.alpha, size=b)).float()
        mixed = torch.from_numpy(rng.random(b) < self.p) & (partner != torch.arange(b))
        lam = torch.where(mixed, lam, torch.ones_like(lam))
        partner = torch.where(mixed, partner, torch.arange(b))
        out = lam[:, None] * audio + (1 - lam[:, None]) * audio[partner]
        return {"audio": out, "audio_lengths": torch.maximum(lengths, lengths[partner]),
                "mix_index": partner, "mix_lambda": lam}


def _fail(key: str, value: Any, rule: str) -> ConfigError:
    return ConfigError(f"data.augment.{key} ({value!r}) {rule}; fix data.augment.{key}.")


def _probability(name: str, spec: Mapping[str, Any]) -> float:
    p = spec["p"]
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
        raise _fail(f"{name}.p", p, "must be a probability in [0, 1]")
    return float(p)


def _range(key: str, value: Any, low: float = -math.inf) -> tuple[float, float]:
    if (not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
            or not low <= value[0] <= value[1]):
        bound = "" if low == -math.inf else f" >= {low}"
        raise _fail(key, value, f"must be [low, high] with{bound} low <= high")
    return float(value[0]), float(value[1])


def build_augment(spec: Mapping[str, Any] | None, *, sample_rate: int,
                  max_seconds: float | None, seed: int, targets: str,
                  ) -> tuple[WaveAugment | None, Mixup | None]:
    """The per-item and per-batch augmentations of ``data.augment`` (checked).

    Args:
        spec: the ``data.augment`` mapping (missing groups and keys take the defaults above);
            None = no augmentation.
        sample_rate, max_seconds: the data's (a speed change never makes a clip longer).
        seed: the data seed.
        targets: ``caption`` | ``label``; mixup needs captions.

    Returns:
        ``(WaveAugment or None, Mixup or None)``: None where nothing is switched on.

    Raises:
        ConfigError: a bad key, probability, range, factor or noise folder; mixup on labels.
    """
    if not spec:
        return None, None
    spec = dict(spec)
    unknown = sorted(set(spec) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"data.augment has unknown key(s) {unknown}; the keys are "
                          f"{sorted(DEFAULTS)}.")
    cfg: dict[str, dict[str, Any]] = {}
    for name, defaults in DEFAULTS.items():
        given = spec.get(name) or {}
        if not isinstance(given, Mapping):
            raise _fail(name, given, f"must be a mapping with keys {sorted(defaults)}")
        bad = sorted(set(given) - set(defaults))
        if bad:
            raise ConfigError(f"data.augment.{name} has unknown key(s) {bad}; its keys are "
                              f"{sorted(defaults)}.")
        cfg[name] = {**defaults, **given}
    p = {name: _probability(name, cfg[name]) for name in DEFAULTS}
    factors = cfg["speed"]["factors"]
    if (not isinstance(factors, Sequence) or isinstance(factors, str) or not factors
            or not all(isinstance(f, int | float) and not isinstance(f, bool) and 0.25 <= f <= 4
                       for f in factors)):
        raise _fail("speed.factors", factors, "must be a non-empty list of factors in "
                    "[0.25, 4] (e.g. [0.9, 1.0, 1.1])")
    snr_db = _range("noise.snr_db", cfg["noise"]["snr_db"])
    exponent = _range("noise.exponent", cfg["noise"]["exponent"], low=0.0)
    gain_db = _range("gain.db", cfg["gain"]["db"])
    files: tuple[Path, ...] = ()
    folder = cfg["noise"]["folder"]
    if folder is not None:
        root = Path(str(folder)).expanduser()
        if not root.is_dir():
            raise _fail("noise.folder", str(folder), "is not a folder; point it at a folder of "
                        "noise recordings, or set it to null for generated noise")
        files = tuple(sorted(f for f in root.rglob("*")
                             if f.is_file() and f.suffix.lower() in AUDIO_EXTENSIONS))
        if not files:
            raise _fail("noise.folder", str(folder), f"holds no audio file "
                        f"({', '.join(AUDIO_EXTENSIONS)}); add noise recordings or set it "
                        f"to null for generated noise")
    alpha = cfg["mixup"]["alpha"]
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or alpha <= 0:
        raise _fail("mixup.alpha", alpha, "must be > 0 (the Beta(alpha, alpha) parameter)")
    if p["mixup"] > 0 and targets != "caption":
        raise _fail("mixup.p", p["mixup"], "must be 0 for label data: mixup here weights two "
                    "captions' losses")
    wave = None
    if p["speed"] or p["noise"] or p["gain"]:
        wave = WaveAugment(
            sample_rate=int(sample_rate),
            max_samples=None if max_seconds is None else math.ceil(max_seconds * sample_rate),
            speed_p=p["speed"], speed_factors=tuple(float(f) for f in factors),
            noise_p=p["noise"], snr_db=snr_db, noise_files=files, noise_exponent=exponent,
            gain_p=p["gain"], gain_db=gain_db)
    mixup = Mixup(p=p["mixup"], alpha=float(alpha), seed=int(seed)) if p["mixup"] else None
    return wave, mixup


def augment_stream(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The per-item augmentation generator of item ``index`` in ``epoch``."""
    return sample_rng(seed, epoch, index, stream=AUGMENT_STREAM)
