"""Collate: pad a list of examples into one batch dict.

Batch keys: ``audio`` (b, s) float32 zero-padded, ``audio_lengths`` (b,); ``image`` (b, 3, h, w);
``tokens`` (b * k, n) ``[*prompt, ..., eos]`` then pad, k = ``data.captions_per_item`` in
training (item-major), ``token_lengths`` (b * k,), ``references`` (every caption of each item);
``label`` (b,); questions (``targets="qa"``): ``messages``, ``choices``, ``answer``,
``question_type``, ``rotation`` (lists, one entry per example); ``ids``; with mixup ``mix_index`` (b,) and ``mix_lambda`` (b,) float32. Plus
``_skipped`` (items skipped building the batch), which the loader removes.

Shapes: b batch, s samples, n tokens, h/w image size."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from mmtf.data.augment import Mixup
from mmtf.errors import UserError


def pad_1d(seqs: Sequence[Tensor | Sequence[int]], pad_value: float = 0.0,
           dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """Right-pad 1-D sequences to the longest; return ``(padded (b, t), lengths (b,))``."""
    tensors = [s if isinstance(s, Tensor) else torch.as_tensor(s, dtype=dtype) for s in seqs]
    lengths = torch.tensor([t.shape[0] for t in tensors], dtype=torch.long)
    longest = int(lengths.max()) if len(tensors) else 0
    out = torch.full((len(tensors), longest), pad_value, dtype=dtype or tensors[0].dtype)
    for i, t in enumerate(tensors):
        out[i, : t.shape[0]] = t
    return out, lengths


# The two media mmtf reads; checked once, by the data module (the config boundary).
Modality = Literal["audio", "image"]

class Collate:
    """Batch examples of one modality and kind of targets (picklable, for DataLoader workers).

    Args:
        targets: ``caption`` | ``label`` | ``qa`` (questions as chats: lists, not tensors).
        pad_id: token padding id (the tokenizer's; 0 in mmtf's own).
        mixup: audio captioning, training only: mix pairs of the batch's waveforms, seeded by
            the examples' ``_key`` (item, epoch), so the pairs do not depend on the worker.
    """

    def __init__(self, *, modality: Modality, targets: str, pad_id: int = 0,
                 mixup: Mixup | None = None) -> None:
        if targets not in ("caption", "label", "qa"):
            raise UserError(f"targets ({targets!r}) must be 'caption', 'label' or 'qa'.")
        if mixup is not None and (modality, targets) != ("audio", "caption"):
            raise UserError(f"mixup needs audio captions, not {modality} {targets}s.")
        self.modality, self.targets, self.pad_id, self.mixup = modality, targets, pad_id, mixup

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        batch: dict[str, Any] = {}
        if self.modality == "audio":
            batch["audio"], batch["audio_lengths"] = pad_1d([e["audio"] for e in examples],
                                                           dtype=torch.float32)  # (b, s)
            if self.mixup is not None:
                keys = [e["_key"] for e in examples]
                batch.update(self.mixup(batch["audio"], batch["audio_lengths"],
                                        epoch=keys[0][1], items=[k[0] for k in keys]))
        else:
            shapes = {tuple(e["image"].shape) for e in examples}
            if len(shapes) > 1:
                raise ValueError(
                    f"images in one batch have different sizes {sorted(shapes)}; add a resize "
                    f"and crop to a fixed size to data.transforms.train and data.transforms.eval "
                    f"(e.g. Resize(64) + CenterCrop(64)).")
            batch["image"] = torch.stack([e["image"] for e in examples])  # (b, 3, h, w)
        if self.targets == "caption":
            # Several training captions per item (data.captions_per_item) come as a list of
            # id sequences each and are laid out item-major: rows i*k .. i*k+k-1 are item i's.
            captions = [t for e in examples
                        for t in (e["tokens"] if _is_many(e["tokens"]) else [e["tokens"]])]
            batch["tokens"], batch["token_lengths"] = pad_1d(
                captions, self.pad_id, dtype=torch.long)                 # (b * k, n)
            batch["references"] = [list(e["references"]) for e in examples]
        elif self.targets == "qa":
            for key in ("messages", "choices", "answer", "question_type", "rotation"):
                batch[key] = [e[key] for e in examples]
        else:
            batch["label"] = torch.tensor([e["label"] for e in examples], dtype=torch.long)
        batch["ids"] = [e["id"] for e in examples]
        batch["_skipped"] = [s for e in examples for s in e.get("_skipped", ())]
        return batch


def _is_many(tokens: Any) -> bool:
    """A list of captions (1-D id sequences), not one caption (ids)."""
    return isinstance(tokens, list) and len(tokens) > 0 and np.ndim(tokens[0]) == 1
