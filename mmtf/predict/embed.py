"""Embeddings of a contrastive checkpoint from raw inputs: what ``Model.embed_audio`` /
``embed_image`` / ``embed_text``, ``mmtf.retrieve`` and the CLAP score of ``mmtf.evaluate`` share.

Media go through the same input handling as ``caption`` (:mod:`mmtf.predict.inputs`: decoded,
mixed to mono, resampled to the encoder's rate; images through the stored eval transforms).
Audio longer than ``model.encoder.max_seconds`` follows ``long_audio``: ``crop`` (its first
``max_seconds``, with a warning) or ``window`` (the fewest equal windows within the limit, each
embedded, their mean re-normalised: one embedding per input either way). Every embedding is
L2-normalised and computed in eval mode. Why: docs/design/retrieval-index.md

Shapes: n inputs, w windows of one input, e = the embedding width.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmtf.errors import UserError
from mmtf.predict.inputs import Input, encoder_batch, input_segments
from mmtf.tasks.contrastive import ContrastiveTask

EmbedLongAudio = Literal["crop", "window"]


def is_contrastive(task: nn.Module) -> bool:
    """True for a task with a shared media-text space (a :class:`ContrastiveTask`)."""
    return isinstance(task, ContrastiveTask)


def require_contrastive(task: nn.Module, call: str) -> None:
    """A UserError naming ``call`` unless ``task`` embeds media and text into one space."""
    if not is_contrastive(task):
        raise UserError(f"{call}: a {type(task).__name__} has no shared media-text embedding; "
                        f"load a contrastive checkpoint (trained with model=contrastive).")


def _check_batch_size(call: str, batch_size: int) -> None:
    if batch_size < 1:
        raise UserError(f"{call}: batch_size ({batch_size}) must be >= 1.")


class _EvalMode:
    """The task in eval mode inside the block, its previous mode restored after it."""

    def __init__(self, task: nn.Module) -> None:
        self.task, self.was_training = task, task.training

    def __enter__(self) -> None:
        self.task.eval()

    def __exit__(self, *exc: object) -> None:
        self.task.train(self.was_training)


@torch.no_grad()
def embed_media_inputs(task: nn.Module, inputs: Sequence[Input] | Input, *,
                       modality: Literal["audio", "image"], batch_size: int = 16,
                       long_audio: EmbedLongAudio = "crop") -> Tensor:
    """One L2-normalised embedding per input, (n, e) float32 on the task's device.

    Args:
        task: a contrastive task (``embed_media``) whose encoder reads ``modality``.
        inputs: files, waveforms (at the encoder's rate, or ``(waveform, rate)``), PIL images
            or (3, h, w) tensors, as ``caption`` takes them.
        modality: what the caller means to embed; another than the checkpoint's is an error.
        batch_size: encoder inputs (windows) per forward pass.
        long_audio: ``crop`` or ``window`` (the mean of the window embeddings, re-normalised).

    Raises:
        UserError: not a contrastive task, the wrong modality, a bad ``long_audio``.
    """
    call = f"embed_{modality}"
    require_contrastive(task, call)
    if task.modality != modality:
        raise UserError(f"{call}: this checkpoint embeds {task.modality} (its encoder is a "
                        f"{type(task.encoder).__name__}); use embed_{task.modality}.")
    if long_audio not in ("crop", "window"):
        raise UserError(f"{call}: long_audio ({long_audio!r}) must be 'crop' (the first "
                        f"model.encoder.max_seconds) or 'window' (the mean of the window "
                        f"embeddings).")
    _check_batch_size(call, batch_size)
    per_input = input_segments(task, inputs, long_audio)
    flat = [(i, s) for i, segments in enumerate(per_input) for s in segments]
    rows: list[Tensor] = []
    with _EvalMode(task):
        for start in range(0, len(flat), batch_size):
            chunk = [s for _, s in flat[start:start + batch_size]]
            rows.append(task.embed_media(*encoder_batch(task, chunk)).float())   # (b, e)
    device = next(task.parameters()).device
    if not rows:
        return torch.zeros(0, task.hparams.embed_dim, device=device)
    windows = torch.cat(rows)                                                  # (sum w, e)
    owner = torch.tensor([i for i, _ in flat], device=windows.device)          # (sum w,)
    if owner.numel() == len(per_input):                                        # one per input
        return windows
    # Mean of each input's window embeddings: a sum over its rows, then re-normalised.
    sums = torch.zeros(len(per_input), windows.shape[1], device=windows.device)
    sums.index_add_(0, owner, windows)                                         # (n, e)
    return F.normalize(sums, dim=-1)


@torch.no_grad()
def embed_text_inputs(task: nn.Module, texts: Sequence[str] | str, *,
                      batch_size: int = 64) -> Tensor:
    """One L2-normalised embedding per text, (n, e) float32, from a contrastive task's text
    tower (its tokenizer and truncation).

    Raises:
        UserError: not a contrastive task, an item that is not a string.
    """
    require_contrastive(task, "embed_text")
    texts = [texts] if isinstance(texts, str) else list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise UserError(f"embed_text: item {i} is a {type(text).__name__}, not a string.")
    _check_batch_size("embed_text", batch_size)
    with _EvalMode(task):
        return task.embed_texts(texts, batch_size=batch_size).float()          # (n, e)


__all__ = ["EmbedLongAudio", "embed_media_inputs", "embed_text_inputs", "is_contrastive",
           "require_contrastive"]
