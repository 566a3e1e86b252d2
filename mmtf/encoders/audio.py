"""Audio encoder: raw waveform -> log-mel -> SpecAugment -> conv stem (stride 4) -> transformer.

Features are computed inside the model (on its device; an export takes raw waveforms). After
Whisper (Radford et al. 2022, arXiv:2212.04356): two GELU convolutions before a pre-norm
transformer, both stride 2 by default (40 ms tokens at hop 160 / 16 kHz), RoPE positions.

Padding never leaks into valid positions: samples past ``lengths`` are zeroed before a
hand-centred STFT (``n_fft // 2`` zeros each side), a clip of ``L`` samples has
``L // hop_length + 1`` valid frames, statistics use valid frames only, invalid frames are
zeroed before each convolution, and the transformer gets the key mask.

Whisper's configuration (:mod:`mmtf.pretrained.whisper`) computes Whisper's log-mel exactly;
``pad_to_seconds=30`` pads to 30 s as Whisper does. Why: docs/design/whisper-import.md.

Shapes: b batch, n samples, f mel bins, t frames, s memory length (= tokens), c = dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
import torchaudio
from einops import rearrange
from torch import Tensor, nn

from mmtf.encoders.base import Encoder, EncoderOutput, record_config
from mmtf.errors import UserError, in_config
from mmtf.nn import TransformerStack
from mmtf.nn.positions import FixedPositions, sinusoidal_table
from mmtf.nn.transformer import AttentionLayers, AttentionMaps, BlockOptions
from mmtf.utils.compat import module_apply
from mmtf.utils.parts import as_part

FeatureNorm = Literal["utterance", "global"]
FeatureKind = Literal["mmtf", "whisper"]
PositionKind = Literal["rope", "sinusoidal", "rope+sinusoidal"]
TimeMaskMode = Literal["fixed", "adaptive"]
LOG_EPS = 1e-6   # log(mel + 1e-6): a floor near 16-bit quantisation noise, finite for silence
STD_FLOOR = 1e-5
# Whisper's log-mel: log10(max(mel, 1e-10)), floored 8 below the clip's maximum, (x + 4) / 4.
WHISPER_FLOOR, WHISPER_RANGE = 1e-10, 8.0


def _lengths_mask(lengths: Tensor, size: int) -> Tensor:
    """(b,) lengths -> (b, size) bool, True where position < length."""
    return torch.arange(size, device=lengths.device) < lengths[:, None]


class LogMelFrontEnd(nn.Module):
    """Padding-aware log-mel spectrogram with per-utterance or global normalisation.

    Args:
        sample_rate, n_mels, hop_length: input Hz; mel bands f; samples between frames.
        n_fft: FFT size (even). win_length: Hann window length (<= n_fft; default n_fft).
        f_min, f_max: mel filterbank range in Hz (f_max default sample_rate / 2).
        feature_norm: "utterance" (mean/std over each clip's valid frames and all bands: keeps
            the spectral shape, unlike per-band CMVN) or "global" (fixed constants below).
        feature_mean, feature_std: global statistics of the log-mel features (a scalar or one
            value per band); used when feature_norm="global".
        features: "mmtf" (HTK mel filters, natural log, ``feature_norm``) or "whisper"
            (Whisper's log-mel, see the module docstring; ``feature_norm`` unused).
        pad_to_seconds: zero-pad every clip to this duration, drop the last STFT frame and
            count every frame valid (Whisper's 30 s); None = mmtf's padding mask.
    """

    def __init__(self, *, sample_rate: int = 16000, n_mels: int = 64, n_fft: int = 400,
                 hop_length: int = 160, win_length: int | None = None, f_min: float = 0.0,
                 f_max: float | None = None, feature_norm: FeatureNorm = "utterance",
                 feature_mean: float | Sequence[float] = 0.0,
                 feature_std: float | Sequence[float] = 1.0, features: FeatureKind = "mmtf",
                 pad_to_seconds: float | None = None) -> None:
        super().__init__()
        self.config = record_config(locals())
        win_length = n_fft if win_length is None else win_length
        f_max = sample_rate / 2 if f_max is None else f_max
        _check_front_end(sample_rate, n_mels, n_fft, hop_length, win_length, f_min, f_max,
                         feature_norm, features, pad_to_seconds)
        self.sample_rate, self.n_mels, self.n_fft = sample_rate, n_mels, n_fft
        self.hop_length, self.feature_norm, self.features = hop_length, feature_norm, features
        self.pad_to_samples = (None if pad_to_seconds is None
                               else int(round(pad_to_seconds * sample_rate)))
        whisper = features == "whisper"
        # Built on the CPU: torchaudio's filterbank check calls .item(), impossible on meta.
        with torch.device("cpu"):
            mel = torchaudio.transforms.MelSpectrogram(
                sample_rate=sample_rate, n_fft=n_fft, win_length=win_length,
                hop_length=hop_length, f_min=f_min, f_max=f_max, n_mels=n_mels, power=2.0,
                norm="slaney" if whisper else None, mel_scale="slaney" if whisper else "htk",
                center=False)   # centring is done in forward, see the module doc
        self.mel = mel.to(torch.get_default_device())
        stats = {"feature_mean": _floats(feature_mean), "feature_std": _floats(feature_std)}
        for key, values in stats.items():   # checked as Python floats: works on meta too
            if len(values) not in (1, n_mels):
                raise UserError(f"LogMelFrontEnd: {key} has {len(values)} values; give one "
                                f"number or n_mels ({n_mels}) numbers (model.encoder.frontend.{key}).")
        if min(stats["feature_std"]) <= 0:
            raise UserError(f"LogMelFrontEnd: feature_std ({feature_std}) must be > 0; compute "
                            f"it from the training set's log-mel features.")
        mean, std = (torch.tensor(v, dtype=torch.float32) for v in stats.values())
        self.register_buffer("feature_mean", mean)
        self.register_buffer("feature_std", std)

    def num_frames(self, lengths: Tensor) -> Tensor:
        """Valid frames of clips of ``lengths`` samples: ``lengths // hop_length + 1``; with
        ``pad_to_seconds`` every clip has ``pad_to_samples // hop_length`` (all frames)."""
        if self.pad_to_samples is not None:
            return torch.full_like(lengths, self.pad_to_samples // self.hop_length)
        return self.clip_frames(lengths)

    def clip_frames(self, lengths: Tensor) -> Tensor:
        """Frames that hold the clip itself, (b,) -> (b,): ``lengths // hop_length + 1``, at most
        the padded frame count. Equal to :meth:`num_frames` without ``pad_to_seconds``; with it,
        the part of Whisper's 30 s window that is not silence, which SpecAugment masks
        (docs/design/spec-augment-adaptive.md)."""
        frames = torch.div(lengths, self.hop_length, rounding_mode="floor") + 1
        if self.pad_to_samples is not None:
            frames = frames.clamp(max=self.pad_to_samples // self.hop_length)
        return frames

    def forward(self, wave: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Args:
            wave: (b, n) float waveforms, padded past ``lengths`` with anything.
            lengths: (b,) long, valid samples per clip.

        Returns:
            Normalised log-mel features (b, f, t) with zeros at invalid frames, t = n // hop + 1
            (with ``pad_to_seconds``: t = pad_to_samples // hop), and the valid frame counts (b,).
        """
        n = wave.shape[-1]
        frames = self.num_frames(lengths)
        with torch.autocast(wave.device.type, enabled=False):   # STFT and statistics in fp32
            wave = wave.float().masked_fill(~_lengths_mask(lengths, n), 0.0)
            if self.pad_to_samples is not None:
                wave = F.pad(wave, (0, self.pad_to_samples - n))  # (b, pad_to_samples)
            if self.features == "whisper":
                return self._whisper_features(wave), frames
            half = self.n_fft // 2
            wave = F.pad(wave, (half, half))                     # (b, n + 2 * half)
            feats = torch.log(self.mel(wave) + LOG_EPS)          # (b, f, t)
            valid = _lengths_mask(frames, feats.shape[-1])[:, None, :]   # (b, 1, t)
            if self.feature_norm == "utterance":
                weight = valid.float()
                count = weight.sum(dim=(1, 2), keepdim=True) * self.n_mels     # (b, 1, 1)
                mean = (feats * weight).sum(dim=(1, 2), keepdim=True) / count
                var = ((feats - mean).square() * weight).sum(dim=(1, 2), keepdim=True) / count
                feats = (feats - mean) / var.sqrt().clamp_min(STD_FLOOR)
            else:
                feats = (feats - self.feature_mean[:, None]) / self.feature_std[:, None]
            feats = feats.masked_fill(~valid, 0.0)
        return feats, frames

    def _whisper_features(self, wave: Tensor) -> Tensor:
        """Whisper's log-mel of zero-padded float32 waveforms (b, n) -> (b, f, t)."""
        half = self.n_fft // 2
        # torch.stft(center=True)'s reflect padding at the start; at the end the clip is
        # followed by zeros, as in Whisper's 30 s padded clip (reflected zeros are zeros).
        right = (wave[:, -half - 1:-1].flip(-1) if self.pad_to_samples is not None
                 else wave.new_zeros(wave.shape[0], half))
        wave = torch.cat([wave[:, 1:half + 1].flip(-1), wave, right], dim=1)   # (b, n + n_fft)
        feats = self.mel(wave)                                   # (b, f, n // hop + 1)
        if self.pad_to_samples is not None:
            feats = feats[..., :-1]                              # Whisper drops the last frame
        feats = feats.clamp_min(WHISPER_FLOOR).log10()
        # Zeroed padding only gives floor frames, so the maximum is the clip's own.
        peak = feats.amax(dim=(1, 2), keepdim=True)              # (b, 1, 1)
        return (torch.maximum(feats, peak - WHISPER_RANGE) + 4.0) / 4.0

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> LogMelFrontEnd:
        # Keep the STFT window, filterbank and statistics in float32 under model.half() /
        # bf16-true precision: torch.stft has no bf16 kernel and fp16 mel energies overflow.
        module_apply(self, fn, recurse)
        self.mel.float()
        self.feature_mean, self.feature_std = self.feature_mean.float(), self.feature_std.float()
        return self


class SpecAugment(nn.Module):
    """Frequency and time masking, a fresh mask per item, in training mode only.

    Park et al. 2019 (arXiv:1904.08779). Time masks lie within the item's ``L`` valid frames
    (docs/design/spec-augment-valid-frames.md). ``fixed``: ``time_masks`` masks of width
    < ``min(time_mask_width, L)``; ``adaptive`` (Park et al. 2020): width
    < ``min(time_mask_width, floor(time_mask_fraction * L))`` and at most
    ``floor(time_mask_multiplicity * L)`` masks, same draws as ``fixed``
    (docs/design/spec-augment-adaptive.md).

    Args:
        freq_masks: bands masked per clip; freq_mask_width: max width of each, in mel bins.
        time_masks: spans masked per clip (adaptive: the most per clip); time_mask_width: max
            width of each, in frames.
        time_mask_mode, time_mask_fraction, time_mask_multiplicity: ``fixed`` | ``adaptive``,
            and adaptive's limits above (multiplicity 0.04: one mask per 25 valid frames).
    """

    def __init__(self, *, freq_masks: int = 2, freq_mask_width: int = 8, time_masks: int = 2,
                 time_mask_width: int = 20, time_mask_mode: TimeMaskMode = "adaptive",
                 time_mask_fraction: float = 0.05, time_mask_multiplicity: float = 0.04) -> None:
        super().__init__()
        self.config = record_config(locals())
        for key, value in (("freq_masks", freq_masks), ("freq_mask_width", freq_mask_width),
                           ("time_masks", time_masks), ("time_mask_width", time_mask_width)):
            if value < 0:
                raise UserError(f"SpecAugment: {key} ({value}) must be >= 0; use 0 to switch "
                                f"that masking off (model.encoder.spec_augment.{key}).")
        if time_mask_mode not in ("fixed", "adaptive"):
            raise UserError(f"SpecAugment: time_mask_mode ({time_mask_mode!r}) must be 'fixed' "
                            f"or 'adaptive'; fix model.encoder.spec_augment.time_mask_mode.")
        if not 0 < time_mask_fraction <= 1:
            raise UserError(f"SpecAugment: time_mask_fraction ({time_mask_fraction}) must be in "
                            f"(0, 1] (a share of each clip's valid frames); fix "
                            f"model.encoder.spec_augment.time_mask_fraction.")
        if time_mask_multiplicity <= 0:
            raise UserError(f"SpecAugment: time_mask_multiplicity ({time_mask_multiplicity}) "
                            f"must be > 0 (masks per valid frame, e.g. 0.04); fix "
                            f"model.encoder.spec_augment.time_mask_multiplicity, or time_masks=0 for none.")
        self.freq_masks, self.time_masks = freq_masks, time_masks
        self.time_mask_width, self.time_mask_mode = time_mask_width, time_mask_mode
        self.time_mask_fraction = float(time_mask_fraction)
        self.time_mask_multiplicity = float(time_mask_multiplicity)
        self.freq = torchaudio.transforms.FrequencyMasking(freq_mask_width, iid_masks=True)

    def extra_repr(self) -> str:
        adaptive = (f", time_mask_fraction={self.time_mask_fraction}, time_mask_multiplicity="
                    f"{self.time_mask_multiplicity}" if self.time_mask_mode == "adaptive" else "")
        return (f"freq_masks={self.freq_masks}, freq_mask_width={self.freq.mask_param}, "
                f"time_masks={self.time_masks}, time_mask_width={self.time_mask_width}, "
                f"time_mask_mode={self.time_mask_mode}{adaptive}")

    def time_mask_limits(self, frames: Tensor) -> tuple[Tensor, Tensor]:
        """The widest mask (frames, exclusive bound of the drawn width) and the number of masks
        of items with ``frames`` (b,) valid frames: two (b,) float tensors."""
        valid = frames.to(torch.float32)
        width = valid.clamp(max=self.time_mask_width)
        count = torch.full_like(valid, float(self.time_masks))
        if self.time_mask_mode == "adaptive":
            width = torch.minimum(width, torch.floor(self.time_mask_fraction * valid))
            count = torch.minimum(count, torch.floor(self.time_mask_multiplicity * valid))
        return width, count

    def forward(self, feats: Tensor, frames: Tensor | None = None) -> Tensor:
        """Mask ``feats`` (b, f, t) -> (b, f, t); the identity in eval mode.

        Args:
            feats: normalised features, (b, f, t).
            frames: (b,) valid frames per item; None = all t valid.
        """
        if not self.training or (self.freq_masks == 0 and self.time_masks == 0):
            return feats
        x = rearrange(feats, "b f t -> b 1 f t")   # a 4-D input gets per-item (iid) masks
        for _ in range(self.freq_masks):
            x = self.freq(x)
        x = rearrange(x, "b 1 f t -> b f t")
        if self.time_masks == 0 or self.time_mask_width == 0:
            return x
        b, _, t = x.shape
        if frames is None:
            frames = torch.full((b,), t, device=x.device)
        frames = frames.to(x.device)
        valid = frames.to(torch.float32)[:, None]                               # (b, 1)
        widest, count = (v[:, None] for v in self.time_mask_limits(frames))     # (b, 1) each
        # As torchaudio's TimeMasking, but within [0, L) of each item instead of [0, t). A
        # drawn width w < widest covers at most ceil(w) <= widest frames (widest is whole).
        width = torch.rand(b, self.time_masks, device=x.device) * widest        # (b, k)
        start = torch.rand(b, self.time_masks, device=x.device) * (valid - width)
        position = torch.arange(t, device=x.device)                             # (t,)
        inside = ((position >= start.long()[..., None])
                  & (position < (start + width).long()[..., None]))             # (b, k, t)
        used = torch.arange(self.time_masks, device=x.device) < count           # (b, k)
        inside = inside & used[..., None]
        return x.masked_fill(rearrange(inside.any(dim=1), "b t -> b 1 t"), 0.0)


class ConvStem(nn.Module):
    """Two kernel-3 GELU convolutions (stride 2 and 2: t -> ~t/4; Whisper's 1 and 2: t -> ~t/2)
    that never mix in padded frames.

    With strides (2, 2), output position k is centred on input frame ``stride * k`` (each
    padding-1 convolution centres output i on input ``stride_i * i``) and sees frames
    ``4k - 3 .. 4k + 3``.

    Args:
        in_channels, dim, strides: mel bins f, output width c, the two convolutions' strides.
    """

    def __init__(self, *, in_channels: int, dim: int, strides: Sequence[int] = (2, 2)) -> None:
        super().__init__()
        strides = tuple(int(s) for s in strides)
        if len(strides) != 2 or min(strides) < 1:
            raise UserError(f"ConvStem: stem_strides ({list(strides)}) must be two strides >= 1 "
                            f"(mmtf: [2, 2], Whisper: [1, 2]); fix model.encoder.stem_strides.")
        self.strides = strides
        self.stride = math.prod(strides)   # frames per output position
        self.conv1 = nn.Conv1d(in_channels, dim, kernel_size=3, stride=strides[0], padding=1)
        self.conv2 = nn.Conv1d(dim, dim, kernel_size=3, stride=strides[1], padding=1)

    def output_lengths(self, lengths: Tensor) -> Tensor:
        """Valid positions after both convolutions: ``(t - 1) // stride + 1``, twice."""
        for stride in self.strides:
            lengths = torch.div(lengths - 1, stride, rounding_mode="floor") + 1
        return lengths

    def forward(self, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """x: (b, f, t) features, lengths: (b,) valid frames -> (b, s, c) and (b,) valid tokens."""
        for conv, stride in zip((self.conv1, self.conv2), self.strides):
            # Zero invalid frames before each conv: the kernel's right tap may reach one, and an
            # unpadded clip has zeros (the conv's padding) there. Conv1's bias and GELU made them
            # non-zero, so this also zeroes conv1's invalid outputs before conv2.
            x = x.masked_fill(~_lengths_mask(lengths, x.shape[-1])[:, None], 0.0)
            x = F.gelu(conv(x))                                  # (b, c, ceil(t / stride))
            lengths = torch.div(lengths - 1, stride, rounding_mode="floor") + 1
        x = x.masked_fill(~_lengths_mask(lengths, x.shape[-1])[:, None], 0.0)   # clean padding
        # contiguous: a transposed view would leave the whole residual stream channel-strided
        # (slower norms, adds and GEMM inputs; experiments/training_throughput/README.md).
        return rearrange(x, "b c s -> b s c").contiguous(), lengths


class AudioEncoder(Encoder):
    """Waveforms (b, n) + lengths -> memory (b, s, c), mask (b, s); s ~ n / (4 * hop_length).

    Args:
        dim, depth, num_heads, block: the transformer (see :class:`mmtf.nn.TransformerStack`).
        positions: "rope" (in the attention), "sinusoidal" (Whisper's fixed table added after
            the stem, as long as ``max_seconds`` needs) or "rope+sinusoidal" (both: the memory
            then carries each position's time, which the decoder's cross-attention can read).
        frontend: the log-mel front end (:class:`LogMelFrontEnd`, or a mapping of its
            arguments; None = its defaults; "whisper" features and 30 s padding for Whisper).
        spec_augment: :class:`SpecAugment` (as ``frontend``), training mode only; 0 masks
            switch it off.
        stem_strides: the conv stem's strides (:class:`ConvStem`; Whisper: [1, 2]).
        max_seconds: longest input accepted (the padded width of the batch); longer batches
            raise ValueError. Crop in the data pipeline. None = no limit.
        causal: causal self-attention (streaming research only; warns).
        activation_checkpointing: as :class:`mmtf.nn.TransformerStack`.
        pretrained, freeze: an export folder to load (:meth:`Encoder.load_pretrained`); no
            trainable parameters, pinned to eval mode (:meth:`Encoder.freeze`).
    """

    def __init__(self, *, dim: int = 128, depth: int = 4, num_heads: int = 4,
                 block: BlockOptions | Mapping[str, Any] | None = None,
                 positions: PositionKind = "rope",
                 frontend: LogMelFrontEnd | Mapping[str, Any] | None = None,
                 spec_augment: SpecAugment | Mapping[str, Any] | None = None, stem_strides: Sequence[int] = (2, 2),
                 max_seconds: float | None = 30.0, causal: bool = False,
                 activation_checkpointing: bool = False,
                 pretrained: str | Path | None = None, freeze: bool = False) -> None:
        super().__init__()
        block = as_part(BlockOptions, block)
        frontend = as_part(LogMelFrontEnd, frontend)
        spec_augment = as_part(SpecAugment, spec_augment)
        self.config = record_config({**locals(), **asdict(block), **frontend.config,
                                     **spec_augment.config})
        if positions not in ("rope", "sinusoidal", "rope+sinusoidal"):
            raise UserError(f"AudioEncoder: positions ({positions!r}) must be 'rope', "
                            f"'sinusoidal' or 'rope+sinusoidal'; fix model.encoder.positions.")
        n_mels, pad_to_seconds = frontend.n_mels, self.config["pad_to_seconds"]
        if spec_augment.freq.mask_param > n_mels:
            raise UserError(f"AudioEncoder: freq_mask_width ({spec_augment.freq.mask_param}) "
                            f"must be <= n_mels ({n_mels}); lower "
                            f"model.encoder.spec_augment.freq_mask_width.")
        if max_seconds is not None and max_seconds <= 0:
            raise UserError(f"AudioEncoder: max_seconds ({max_seconds}) must be > 0 or null "
                            f"(no limit).")
        if pad_to_seconds is not None and (max_seconds is None or max_seconds > pad_to_seconds):
            raise UserError(f"AudioEncoder: max_seconds ({max_seconds}) must be <= "
                            f"pad_to_seconds ({pad_to_seconds}): clips are padded to it, never "
                            f"cropped; set model.encoder.max_seconds: {pad_to_seconds}.")
        self.dim, self.max_seconds = dim, max_seconds
        self.max_samples = (None if max_seconds is None
                            else int(round(max_seconds * frontend.sample_rate)))
        self.frontend, self.spec_augment = frontend, spec_augment
        self.stem = ConvStem(in_channels=n_mels, dim=dim, strides=stem_strides)
        max_tokens = 4096 if self.max_samples is None else int(self.output_lengths(
            torch.tensor([self.max_samples], device="cpu")).item())
        # Whisper's fixed table, built in float64 on the CPU (a meta device cannot hold values).
        self.positions = None
        if positions in ("sinusoidal", "rope+sinusoidal"):
            with torch.device("cpu"):
                table = sinusoidal_table(max_tokens, dim)
            self.positions = FixedPositions(table.to(torch.get_default_device()))
        with in_config("model.encoder"):     # the stack and Attention own their rules
            self.stack = TransformerStack(
                depth=depth, dim=dim, num_heads=num_heads, block=block, causal=causal,
                rope=positions in ("rope", "rope+sinusoidal"), max_len=max_tokens,
                activation_checkpointing=activation_checkpointing)
        self.drop = nn.Dropout(block.dropout)    # after the stack: it checks dropout
        self._finish_init(pretrained=pretrained, freeze=freeze, causal=causal)

    @property
    def sample_rate(self) -> int:
        return self.frontend.sample_rate

    def output_lengths(self, lengths: Tensor) -> Tensor:
        """Memory positions (tokens) for clips of ``lengths`` samples, (b,) -> (b,)."""
        return self.stem.output_lengths(self.frontend.num_frames(lengths))

    @property
    def seconds_per_position(self) -> float:
        """Seconds between consecutive memory positions: ``stem.stride * hop / rate``."""
        return self.stem.stride * self.frontend.hop_length / self.sample_rate

    def memory_seconds(self, num_positions: int) -> Tensor:
        """Centre of each memory position in seconds from the clip start, (s,) float64.

        Position k is centred on log-mel frame ``stem.stride * k``, and frame j on sample
        ``j * hop_length`` (the STFT is centred), so k sits at ``k * seconds_per_position``."""
        return torch.arange(num_positions, dtype=torch.float64) * self.seconds_per_position

    def forward(self, inputs: Tensor, lengths: Tensor | None = None, *,
                attention_layers: AttentionLayers | None = None,
                ) -> EncoderOutput | tuple[EncoderOutput, AttentionMaps]:
        """Encode a batch of waveforms.

        Args:
            inputs: (b, n) float mono waveforms at ``sample_rate``, padded with anything.
            lengths: (b,) valid samples per clip (long); None = all n samples valid.
            attention_layers: ``{"self": [layers]}`` whose attention probabilities to return
                (see :meth:`mmtf.nn.TransformerStack.forward`); None = the output alone.

        Returns:
            EncoderOutput: memory (b, s, c), zeros at padding; mask (b, s), True = valid. With
            ``attention_layers`` also ``{"self": {layer: (b, h, s, s)}}``.
        """
        lengths = self._check_inputs(inputs, lengths)
        feats, frames = self.frontend(inputs, lengths)           # (b, f, t), (b,)
        # Masks sized from and placed in the clip, not in Whisper's padding.
        feats = self.spec_augment(feats, self.frontend.clip_frames(lengths))
        return self.encode_features(feats, frames, attention_layers=attention_layers)

    def whisper_features(self, wave: Tensor) -> Tensor:
        """Whisper's log-mel of one whole clip (n,) -> (f, n // hop), unpadded and normalised
        over the whole clip: what ``WhisperFeatureExtractor(truncation=False)`` gives the
        long-form decoding, which slides 30 s windows over these frames
        (:mod:`mmtf.decoders.speech`)."""
        if self.frontend.features != "whisper" or self.frontend.pad_to_samples is None:
            raise UserError("long-form decoding needs Whisper's front end "
                            "(model.encoder.frontend.features=whisper, pad_to_seconds=30).")
        with torch.autocast(wave.device.type, enabled=False):
            return self.frontend._whisper_features(wave.float()[None])[0]

    def encode_features(self, feats: Tensor, frames: Tensor | None = None, *,
                        attention_layers: AttentionLayers | None = None,
                        ) -> EncoderOutput | tuple[EncoderOutput, AttentionMaps]:
        """The encoder after its front end: normalised log-mel ``feats`` (b, f, t) with
        ``frames`` (b,) valid frames (None = all) -> as :meth:`forward`."""
        if frames is None:
            frames = torch.full((feats.shape[0],), feats.shape[-1], dtype=torch.long,
                                device=feats.device)
        x, tokens = self.stem(feats.to(self.stem.conv1.weight.dtype), frames)   # (b, s, c)
        mask = _lengths_mask(tokens, x.shape[1])                 # (b, s)
        if self.positions is not None:
            x = x + self.positions(x.shape[1])                   # (b, s, c)
        maps = None
        # Padded to a fixed duration every position is valid (Whisper attends to padding).
        key_mask = None if self.frontend.pad_to_samples is not None else mask
        if attention_layers is None:
            x = self.stack(self.drop(x), key_mask=key_mask)
        else:
            x, maps = self.stack(self.drop(x), key_mask=key_mask,
                                 attention_layers=attention_layers)
        out = EncoderOutput(x.masked_fill(~mask[..., None], 0.0), mask)
        return out if maps is None else (out, maps)

    def _check_inputs(self, wave: Tensor, lengths: Tensor | None) -> Tensor:
        if wave.dim() != 2 or not wave.is_floating_point():
            raise ValueError(f"AudioEncoder: inputs must be float waveforms (batch, samples), got "
                             f"{wave.dtype} {tuple(wave.shape)}; mix to mono and drop the "
                             f"channel axis in the data pipeline.")
        b, n = wave.shape
        if self.max_samples is not None and n > self.max_samples:
            raise UserError(
                f"AudioEncoder: input is {n} samples ({n / self.sample_rate:.2f} s at "
                f"{self.sample_rate} Hz) but max_seconds={self.max_seconds} allows "
                f"{self.max_samples}; crop clips in the data pipeline or raise "
                f"model.encoder.max_seconds.")
        if lengths is None:
            return torch.full((b,), n, dtype=torch.long, device=wave.device)
        if lengths.shape != (b,) or lengths.is_floating_point() or lengths.is_complex():
            raise ValueError(f"AudioEncoder: lengths must be integer (batch={b},), got "
                             f"{lengths.dtype} {tuple(lengths.shape)}; pass samples per clip.")
        lengths = lengths.to(device=wave.device, dtype=torch.long)
        if bool(((lengths < 0) | (lengths > n)).any()):
            raise ValueError(f"AudioEncoder: lengths {lengths.tolist()} must be in [0, {n}] "
                             f"(the padded width of inputs).")
        return lengths


def _check_front_end(sample_rate: int, n_mels: int, n_fft: int, hop_length: int,
                     win_length: int, f_min: float, f_max: float, feature_norm: str,
                     features: str, pad_to_seconds: float | None) -> None:
    """One place for the front end's rules; messages name the model.encoder.* key."""
    rules = [
        (sample_rate > 0, f"sample_rate ({sample_rate}) must be > 0"),
        (n_mels > 0, f"n_mels ({n_mels}) must be > 0"),
        (n_fft > 0 and n_fft % 2 == 0,
         f"n_fft ({n_fft}) must be a positive even number (frames = samples // hop_length + 1 "
         f"relies on n_fft // 2 zeros each side)"),
        (0 < win_length <= n_fft, f"win_length ({win_length}) must be in [1, n_fft={n_fft}]; "
                                  f"raise n_fft or lower win_length"),
        (hop_length > 0, f"hop_length ({hop_length}) must be > 0"),
        (0 <= f_min < f_max <= sample_rate / 2,
         f"need 0 <= f_min ({f_min}) < f_max ({f_max}) <= sample_rate / 2 ({sample_rate / 2})"),
        (feature_norm in ("utterance", "global"),
         f"feature_norm ({feature_norm!r}) must be 'utterance' or 'global'"),
        (features in ("mmtf", "whisper"), f"features ({features!r}) must be 'mmtf' or 'whisper'"),
        (pad_to_seconds is None or pad_to_seconds * sample_rate >= n_fft,
         f"pad_to_seconds ({pad_to_seconds}) must be null or hold at least n_fft samples"),
    ]
    for ok, message in rules:
        if not ok:
            raise UserError(f"LogMelFrontEnd: {message}; fix it in model.encoder.frontend.")


def _floats(value: float | Sequence[float]) -> list[float]:
    """A number or a list of numbers (Hydra gives ListConfig) as a list of plain floats."""
    if isinstance(value, (int, float)):
        return [float(value)]
    return [float(v) for v in value]
