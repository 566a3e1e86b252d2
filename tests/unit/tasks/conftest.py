"""Tiny real tasks (dim 32, one layer) for the task unit tests."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace
from typing import Any

import torch

from mmtf.decoders import TextDecoder
from mmtf.encoders import AudioEncoder, VisionEncoder
from mmtf.tasks import CaptioningTask, ClassificationTask
from tests.unit.presets import flat

ADAMW = partial(torch.optim.AdamW, lr=1e-2)


def audio_encoder(**kw: Any) -> AudioEncoder:
    return flat(AudioEncoder, **{"dim": 32, "depth": 1, "num_heads": 4, "n_mels": 16,
                           "max_seconds": 30.0, **kw})


def vision_encoder(**kw: Any) -> VisionEncoder:
    return flat(VisionEncoder, **{"dim": 32, "depth": 1, "num_heads": 4, "patch_size": 8,
                            "image_size": 32, **kw})


def captioner(*, max_len: int = 64, vocab_size: int = 64, **kw: Any) -> CaptioningTask:
    decoder = flat(TextDecoder, vocab_size=vocab_size, dim=32, depth=1, num_heads=4, context_dim=32,
                          max_len=max_len)
    return CaptioningTask(encoder=audio_encoder(), decoder=decoder, optimizer=ADAMW, **kw)


def classifier(encoder=None, **kw: Any) -> ClassificationTask:
    return ClassificationTask(**{"encoder": encoder or vision_encoder(), "num_classes": 3,
                                 "optimizer": ADAMW, **kw})


def fake_datamodule(**kw: Any) -> SimpleNamespace:
    """The attributes a task reads from a data module in ``connect_data`` (and the entry point
    in ``connect_tokenizer``)."""
    return SimpleNamespace(**{"modality": "audio", "max_seconds": 10.0, "max_caption_tokens": 32,
                              "num_classes": 3,
                              "class_names": ["a", "b", "c"],
                              "tokenizer": None, "source_names": (),
                              "tokenizer_spec": dict, **kw})
