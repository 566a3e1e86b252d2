"""Collate: pad a list of examples into one batch dict.

Batch keys: ``audio`` (b, s) float32 zero-padded, ``audio_lengths`` (b,); ``image`` (b, 3, h, w);
``tokens`` (b * k, n) ``[*prompt, ..., eos]`` then pad, k = ``data.captions_per_item`` in
training (item-major), ``token_lengths`` (b * k,), ``references`` (every caption of each item);
``label`` (b,); questions (``targets="qa"``): ``messages``, ``choices``, ``answer``,
``question_type``, ``rotation`` (lists, one entry per example); ``ids``; with mixup ``mix_index`` (b,) and ``mix_lambda`` (b,) float32. Plus
``_skipped`` (items skipped building the batch), which the loader removes.

Chats for a prefix LLM (``targets="chat"``, :mod:`mmtf.data.chat`) replace the media and
token keys by the prefix batch: ``media`` (b, s) float32 audio or (b, 3, h, w) images,
``media_mask`` (b, s) bool (audio: True = a real sample), ``input_ids`` (b, t) long and
``attention_mask`` (b, t) bool, right-padded, ``labels`` (b, t) long unshifted (-100 = not
trained: prompt, media placeholder, padding); in evaluation also ``prompt_ids`` /
``prompt_mask`` (b, p), left-padded, each ending in the generation prompt. ``references``
(every reference of each item), ``ids``; when any item is a multiple-choice question,
``choices``, ``answer``, ``question_type``, ``rotation`` (lists; None for the other items).

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
           dtype: torch.dtype | None = None, side: Literal["right", "left"] = "right",
           ) -> tuple[Tensor, Tensor]:
    """Pad 1-D sequences to the longest, on the right (training) or the left (prompts that
    generation continues); return ``(padded (b, t), lengths (b,))``."""
    tensors = [s if isinstance(s, Tensor) else torch.as_tensor(s, dtype=dtype) for s in seqs]
    lengths = torch.tensor([t.shape[0] for t in tensors], dtype=torch.long)
    longest = int(lengths.max()) if len(tensors) else 0
    out = torch.full((len(tensors), longest), pad_value, dtype=dtype or tensors[0].dtype)
    for i, t in enumerate(tensors):
        if side == "right":
            out[i, : t.shape[0]] = t
        else:
            out[i, longest - t.shape[0]:] = t
    return out, lengths


def length_mask(lengths: Tensor, width: int, side: Literal["right", "left"] = "right",
                ) -> Tensor:
    """(b, width) bool, True on each row's first (right padding) or last (left) ``lengths``."""
    pos = torch.arange(width)[None, :]                                   # (1, width)
    return pos < lengths[:, None] if side == "right" else pos >= width - lengths[:, None]


# The two media mmtf reads; checked once, by the data module (the config boundary).
Modality = Literal["audio", "image"]

class Collate:
    """Batch examples of one modality and kind of targets (picklable, for DataLoader workers).

    Args:
        targets: ``caption`` | ``label`` | ``qa`` (questions as chats: lists, not tensors) |
            ``chat`` (prefix LLM batches of encoded chats, see the module doc).
        pad_id: token padding id (the tokenizer's; 0 in mmtf's own).
        prompts: ``chat`` only: add the left-padded generation prompts (val/test).
        mixup: audio captioning, training only: mix pairs of the batch's waveforms, seeded by
            the examples' ``_key`` (item, epoch), so the pairs do not depend on the worker.
    """

    def __init__(self, *, modality: Modality, targets: str, pad_id: int = 0,
                 mixup: Mixup | None = None, prompts: bool = False) -> None:
        if targets not in ("caption", "label", "qa", "chat"):
            raise UserError(f"targets ({targets!r}) must be 'caption', 'label', 'qa' or "
                            f"'chat'.")
        if mixup is not None and (modality, targets) != ("audio", "caption"):
            raise UserError(f"mixup needs audio captions, not {modality} {targets}s.")
        self.modality, self.targets, self.pad_id, self.mixup = modality, targets, pad_id, mixup
        self.prompts = prompts

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        if self.targets == "chat":
            return self._chats(examples)
        batch: dict[str, Any] = {}
        if self.modality == "audio":
            batch["audio"], batch["audio_lengths"] = pad_1d([e["audio"] for e in examples],
                                                           dtype=torch.float32)  # (b, s)
            if self.mixup is not None:
                keys = [e["_key"] for e in examples]
                batch.update(self.mixup(batch["audio"], batch["audio_lengths"],
                                        epoch=keys[0][1], items=[k[0] for k in keys]))
        else:
            batch["image"] = _stack_images(examples)                   # (b, 3, h, w)
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

    def _chats(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The prefix LLM batch (module doc) of examples carrying a ``chat``
        (:class:`mmtf.data.chat.ChatExample`)."""
        batch: dict[str, Any] = {}
        if self.modality == "audio":
            batch["media"], lengths = pad_1d([e["audio"] for e in examples],
                                             dtype=torch.float32)           # (b, s)
            batch["media_mask"] = length_mask(lengths, batch["media"].shape[1])  # (b, s)
        else:
            batch["media"] = _stack_images(examples)                    # (b, 3, h, w)
        chats = [e["chat"] for e in examples]
        batch["input_ids"], lengths = pad_1d([c.input_ids for c in chats], self.pad_id,
                                             dtype=torch.long)               # (b, t)
        batch["attention_mask"] = length_mask(lengths, batch["input_ids"].shape[1])
        batch["labels"], _ = pad_1d([c.labels for c in chats], -100, dtype=torch.long)
        if self.prompts:
            batch["prompt_ids"], lengths = pad_1d([c.prompt_ids for c in chats], self.pad_id,
                                                  dtype=torch.long, side="left")  # (b, p)
            batch["prompt_mask"] = length_mask(lengths, batch["prompt_ids"].shape[1], "left")
        batch["references"] = [list(e["references"]) for e in examples]
        if any(c.choices is not None for c in chats):
            qa = [e.get("qa") for e in examples]
            batch["choices"] = [None if c.choices is None else list(c.choices) for c in chats]
            batch["answer"] = [None if q is None else q.answer for q in qa]
            batch["question_type"] = [None if q is None else q.question_type for q in qa]
            batch["rotation"] = [c.rotation for c in chats]
        batch["ids"] = [e["id"] for e in examples]
        batch["_skipped"] = [s for e in examples for s in e.get("_skipped", ())]
        return batch


def _stack_images(examples: Sequence[dict[str, Any]]) -> Tensor:
    """(b, 3, h, w) of the examples' images, which must share one size."""
    shapes = {tuple(e["image"].shape) for e in examples}
    if len(shapes) > 1:
        raise ValueError(
            f"images in one batch have different sizes {sorted(shapes)}; add a resize "
            f"and crop to a fixed size to data.transforms.train and data.transforms.eval "
            f"(e.g. Resize(64) + CenterCrop(64)).")
    return torch.stack([e["image"] for e in examples])                   # (b, 3, h, w)


def _is_many(tokens: Any) -> bool:
    """A list of captions (1-D id sequences), not one caption (ids)."""
    return isinstance(tokens, list) and len(tokens) > 0 and np.ndim(tokens[0]) == 1
