"""A tiny contrastive checkpoint on disk, as ``mmtf.train`` writes one, in well under a second.

The task is built from the real configs (``conf/model/encoder/*_tiny.yaml``,
``conf/model/text_encoder/text_tiny.yaml``), its checkpoint written by the task's own
``on_save_checkpoint`` (what a Lightning Trainer calls), so ``mmtf.load`` / ``build_task``
rebuild it exactly as they rebuild a trained run's. Random weights: tests compare against the
checkpoint's towers called by hand, never against learnt rankings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from mmtf.text import CharTokenizer

CONF = Path(__file__).resolve().parents[3] / "conf"
RATE = 16000
IMAGE_SIZE = 32
CORPUS = ["a dog barks", "rain falls on a roof", "a siren wails", "birds sing", "quiet hum"]


def contrastive_config(modality: Literal["audio", "image"], vocab_size: int, *,
                       embed_dim: int = 16, max_seconds: float = 2.0) -> dict[str, Any]:
    """The composed config a contrastive run stores: model (and the image eval transform)."""
    part = "audio_tiny" if modality == "audio" else "vision_tiny"
    encoder = OmegaConf.to_container(OmegaConf.load(CONF / "model/encoder" / f"{part}.yaml"))
    encoder["depth"] = 1
    if modality == "audio":
        encoder["max_seconds"] = max_seconds
    else:
        encoder["image_size"] = IMAGE_SIZE
    text = OmegaConf.to_container(OmegaConf.load(CONF / "model/text_encoder/text_tiny.yaml"))
    text.update(vocab_size=vocab_size, depth=1)
    model = {"_target_": "mmtf.tasks.ContrastiveTask", "encoder": encoder, "text_encoder": text,
             "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3},
             "embed_dim": embed_dim}
    data: dict[str, Any] = {}
    if modality == "image":
        data["transforms"] = {"eval": [{"_target_": "torchvision.transforms.v2.Resize",
                                        "size": [IMAGE_SIZE, IMAGE_SIZE], "antialias": True}]}
    return {"model": model, "data": data}


def save_contrastive_ckpt(path: Path, *, modality: Literal["audio", "image"] = "audio",
                          seed: int = 0, embed_dim: int = 16, max_seconds: float = 2.0) -> Path:
    """Write a random-weight contrastive checkpoint to ``path`` (seeded: the same ``seed``
    gives the same weights)."""
    tokenizer = CharTokenizer.train(CORPUS)
    cfg = contrastive_config(modality, tokenizer.vocab_size, embed_dim=embed_dim,
                             max_seconds=max_seconds)
    torch.manual_seed(seed)
    task = instantiate(OmegaConf.create(cfg["model"]))
    task.use_tokenizer(tokenizer)
    task.run_config = cfg
    checkpoint: dict[str, Any] = {"state_dict": task.state_dict()}
    task.on_save_checkpoint(checkpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, path)
    return path
