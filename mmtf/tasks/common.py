"""Glue shared by the Lightning tasks: batch unpacking, optimizer/schedule wiring, DDP gathering."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from torch import Tensor, nn

from mmtf.tasks.optim import build_optimizer, warmup_cosine


def batch_inputs(batch: dict[str, Any]) -> tuple[Tensor, Tensor | None]:
    """The encoder input of a batch: waveforms (b, samples) + lengths, or images (b, 3, h, w)."""
    if "audio" in batch:
        return batch["audio"], batch["audio_lengths"]
    if "image" in batch:
        return batch["image"], None
    raise KeyError(f"batch has neither 'audio' nor 'image' (keys: {sorted(batch)}); the data "
                   f"module's collate must provide one of them.")


def gather_objects(obj: Any) -> list[Any]:
    """All ranks' ``obj`` in rank order (a one-element list when not distributed)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (``obj`` itself when not distributed)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def configure_adamw_cosine(module: L.LightningModule, optimizer: Callable, modules: list[nn.Module],
                           weight_decay: float, warmup_steps: int, min_lr_ratio: float,
                           include_frozen: bool = False) -> dict[str, Any]:
    """Optimizer over decay/no-decay groups plus warmup+cosine stepped every optimizer step."""
    opt = build_optimizer(optimizer, modules, weight_decay, include_frozen)
    total = int(module.trainer.estimated_stepping_batches) if module._trainer is not None else 1
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, warmup_cosine(warmup_steps, max(1, total), min_lr_ratio))
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def check_limits(datamodule: Any, encoder: nn.Module, decoder: nn.Module | None = None,
                 max_new_tokens: int | None = None) -> None:
    """Reject data settings the model cannot hold, at setup, instead of an index or shape error
    deep in the model: captions longer than the decoder's positions, audio longer than the
    encoder accepts."""
    enc_seconds = getattr(encoder, "max_seconds", None)
    data_seconds = getattr(datamodule, "max_seconds", None)
    audio = getattr(datamodule, "modality", None) == "audio"
    if audio and enc_seconds is not None and (data_seconds is None or data_seconds > enc_seconds):
        raise ValueError(f"data.max_seconds ({data_seconds}) exceeds model.encoder.max_seconds "
                         f"({enc_seconds}); set data.max_seconds <= {enc_seconds} (clips are "
                         f"cropped to it) or raise model.encoder.max_seconds.")
    if decoder is None:
        return
    caption_tokens = getattr(datamodule, "max_caption_tokens", None)
    if caption_tokens is not None and caption_tokens > decoder.max_len:
        raise ValueError(f"data.max_caption_tokens ({caption_tokens}) exceeds "
                         f"model.decoder.max_len ({decoder.max_len}); lower "
                         f"data.max_caption_tokens (longer captions are truncated and counted) "
                         f"or raise model.decoder.max_len.")
    if max_new_tokens is not None and max_new_tokens + 1 > decoder.max_len:
        raise ValueError(f"model.generation.max_new_tokens ({max_new_tokens}) + bos exceeds "
                         f"model.decoder.max_len ({decoder.max_len}); lower max_new_tokens.")
