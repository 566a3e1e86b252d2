"""From raw inputs to a task's predictions: what ``mmtf.predict`` and the notebook API share.

Inputs are preprocessed as the checkpoint's data pipeline does: audio files decoded, mixed to
mono and resampled to the encoder's rate; images to RGB through the stored
``data.transforms.eval``; in-memory waveforms (at the encoder's rate, or ``(waveform, rate)``),
PIL images and (3, h, w) tensors too. Audio longer than ``model.encoder.max_seconds`` follows
``long_audio``: ``crop`` (its start, with a warning), ``window`` (the fewest equal windows, each
row with its ``start``/``end``), or ``sequential`` / ``chunked`` (whole, to the task's speech
decoding). Why: docs/design/long-audio.md

Shapes: s samples at the encoder's rate; b batch.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torchvision.transforms import v2

from mmtf.data.audio import audio_info, load_audio, resample
from mmtf.data.collate import pad_1d
from mmtf.data.image import build_eval_image_transform, load_image, to_rgb
from mmtf.errors import UserError
from mmtf.tasks.base import Task

log = logging.getLogger(__name__)

LongAudio = Literal["crop", "window", "sequential", "chunked"]
LONG_AUDIO: tuple[str, ...] = ("crop", "window", "sequential", "chunked")
WHOLE = ("sequential", "chunked")      # the task decodes the whole input
Input = str | os.PathLike | Tensor | np.ndarray | tuple | Image.Image


@dataclass(frozen=True)
class Segment:
    """One encoder input: a waveform (s,) or an image (3, h, w), the input it came from, and
    its time span (seconds) when ``long_audio="window"``."""

    name: str
    data: Tensor
    span: tuple[float, float] | None = None


def check_long_audio(long_audio: str) -> str:
    """``long_audio`` if valid; a UserError naming the key and the choices otherwise."""
    if long_audio not in LONG_AUDIO:
        raise UserError(f"long_audio ({long_audio!r}) must be 'crop' (keep the first "
                        f"model.encoder.max_seconds), 'window' (predict every window), "
                        f"'sequential' or 'chunked' (Whisper long-form speech decoding of the "
                        f"whole input).")
    return long_audio


def _name(item: Input, index: int) -> str:
    return str(item) if isinstance(item, (str, os.PathLike)) else f"input[{index}]"


def _waveform(item: Input, index: int, sample_rate: int) -> Tensor:
    """An in-memory waveform as (s,) float32 at ``sample_rate``."""
    wave, rate = item if isinstance(item, tuple) else (item, sample_rate)
    wave = torch.as_tensor(np.asarray(wave) if not isinstance(wave, Tensor) else wave)
    if wave.dim() != 1 or not wave.is_floating_point():
        raise UserError(f"inputs[{index}]: a waveform must be 1-D float (samples,), got "
                        f"{wave.dtype} {tuple(wave.shape)}; mix it to mono first.")
    return resample(wave.float().cpu(), int(rate), sample_rate)


def audio_segments(item: Input, index: int, *, sample_rate: int, max_seconds: float | None,
                   long_audio: LongAudio = "crop") -> list[Segment]:
    """The encoder inputs of one audio input under the ``long_audio`` policy."""
    name = _name(item, index)
    if long_audio in WHOLE:
        max_seconds = None
    limit = None if max_seconds is None else int(round(max_seconds * sample_rate))
    if isinstance(item, (str, os.PathLike)):
        info = audio_info(item)
        crop = long_audio == "crop" and max_seconds is not None and info.duration > max_seconds
        # Decode only what is kept: a crop of a long file reads max_seconds, not the file.
        wave = load_audio(item, sample_rate=sample_rate, max_seconds=max_seconds if crop else None,
                          crop="start")
        seconds = info.duration
    else:
        wave = _waveform(item, index, sample_rate)
        seconds = wave.shape[0] / sample_rate
    if limit is not None and wave.shape[0] > limit and long_audio == "crop":
        wave = wave[:limit]
    if long_audio in WHOLE:
        return [Segment(name, wave)]
    if long_audio == "crop":
        if max_seconds is not None and seconds > max_seconds:
            log.warning("%s: %.2f s is longer than model.encoder.max_seconds (%g s); reading "
                        "its first %g s (long_audio=crop; long_audio=window covers all of it).",
                        name, seconds, max_seconds, max_seconds)
        return [Segment(name, wave)]
    n = wave.shape[0]
    count = 1 if limit is None else max(1, math.ceil(n / limit))
    # Equal windows (widths differ by at most one sample), none longer than the limit.
    bounds = [i * n // count for i in range(count + 1)]
    return [Segment(name, wave[a:b], (a / sample_rate, b / sample_rate))
            for a, b in zip(bounds, bounds[1:])]


def image_segment(item: Input, index: int, transform) -> Segment:
    """The encoder input of one image: a file, a PIL image or a (3, h, w) tensor."""
    if isinstance(item, (str, os.PathLike)):
        image = load_image(item)
    elif isinstance(item, Image.Image):
        image = v2.functional.pil_to_tensor(to_rgb(item))
    elif isinstance(item, Tensor) and item.dim() == 3 and item.shape[0] == 3:
        image = item.cpu()
    else:
        raise UserError(f"inputs[{index}]: an image must be a file path, a PIL image or a "
                        f"(3, h, w) tensor, got {type(item).__name__}.")
    return Segment(_name(item, index), transform(image))      # (3, h, w) float32


def input_segments(task: Task, inputs: Sequence[Input] | Input,
                   long_audio: LongAudio = "crop") -> list[list[Segment]]:
    """The encoder inputs of each input (several only with ``long_audio="window"``),
    preprocessed as the checkpoint's data pipeline does."""
    check_long_audio(long_audio)
    if isinstance(inputs, (str, os.PathLike, Tensor, np.ndarray, Image.Image)):
        inputs = [inputs]
    if task.modality == "audio":
        encoder = task.encoder
        return [audio_segments(item, i, sample_rate=encoder.sample_rate,
                               max_seconds=encoder.max_seconds, long_audio=long_audio)
                for i, item in enumerate(inputs)]
    transform = build_eval_image_transform((task.run_config or {}).get("data") or {})
    return [[image_segment(item, i, transform)] for i, item in enumerate(inputs)]


def encoder_batch(task: Task, segments: Sequence[Segment]) -> tuple[Tensor, Tensor | None]:
    """Segments as one encoder batch on the task's device: waveforms (b, s) + lengths (b,), or
    images (b, 3, h, w) and None."""
    device = next(task.parameters()).device
    if task.modality == "audio":
        x, lengths = pad_1d([s.data for s in segments], dtype=torch.float32)    # (b, s)
        return x.to(device), lengths.to(device)
    return torch.stack([s.data for s in segments]).to(device), None            # (b, 3, h, w)


@torch.no_grad()
def predict_inputs(task: Task, inputs: Sequence[Input], *, batch_size: int = 8,
                   long_audio: LongAudio = "crop") -> list[dict[str, Any]]:
    """Predict ``inputs`` (audio or images, files already expanded) with ``task`` (in eval
    mode, on its device), ``batch_size`` inputs per forward pass.

    Returns:
        One dict per prediction: ``path`` (or ``input[i]``), ``start``/``end`` with
        ``long_audio="window"``, and the task's ``predict_batch`` keys.
    """
    segments = [s for per_input in input_segments(task, inputs, long_audio) for s in per_input]
    rows: list[dict[str, Any]] = []
    for start in range(0, len(segments), batch_size):
        chunk = segments[start:start + batch_size]
        for segment, row in zip(chunk, task.predict_batch(*encoder_batch(task, chunk))):
            span = {} if segment.span is None else {"start": round(segment.span[0], 3),
                                                    "end": round(segment.span[1], 3)}
            rows.append({"path": segment.name, **span, **row})
    return rows


__all__ = ["LONG_AUDIO", "Input", "LongAudio", "Segment", "audio_segments", "check_long_audio",
           "encoder_batch", "image_segment", "input_segments", "predict_inputs"]
