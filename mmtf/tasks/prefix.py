"""The multimodal prefix model as a LightningModule: encoder -> projector -> LLM, trained on the
answer tokens of chat-rendered items.

A batch carries ``media`` (the encoder's input), ``media_mask`` ((b, n) bool or absent),
``input_ids``, ``attention_mask`` and ``labels`` (unshifted, -100 where not trained: the chat
renderer's output, padded). The fine-tuning controls, per-part learning rates, LoRA, EMA and
exact resume are the base task's (:class:`~mmtf.tasks.base.Task`), with three parts:
``encoder``, ``projector``, ``decoder`` (the LLM). Why: docs/design/prefix-model.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mmtf.decoders.generation import GenerationConfig, GenerationOutput
from mmtf.decoders.lm import CausalLM
from mmtf.decoders.prefix import MediaPrefixLM, PrefixOutput
from mmtf.errors import ConfigError
from mmtf.tasks.base import Task
from mmtf.tasks.captioning import finetuning_controls

PARTS = ("encoder", "projector", "decoder")


@dataclass(frozen=True)
class PrefixFinetuning:
    """The fine-tuning controls of a prefix model (``model.finetuning``): the encoder freezes
    itself (``model.encoder.freeze``), the projector and the LLM here. Layer-wise decay is not
    offered: a linear or MLP projector has no layers."""

    freeze_projector: bool = False
    freeze_decoder: bool = False
    unfreeze_encoder_at_epoch: int | None = None
    unfreeze_projector_at_epoch: int | None = None
    unfreeze_decoder_at_epoch: int | None = None
    encoder_lr_scale: float = 1.0
    projector_lr_scale: float = 1.0
    decoder_lr_scale: float = 1.0


class PrefixLMTask(Task):
    """Trains a :class:`~mmtf.decoders.prefix.MediaPrefixLM` on the answer tokens.

    Args:
        encoder: any mmtf encoder.
        decoder: the LLM (``mmtf.pretrained.llm.llm_decoder``).
        projector: ``{"kind": ..., **settings}`` or a ``_target_`` (see ``MediaPrefixLM``).
        media_token_id, grow_vocab: the placeholder token (see ``MediaPrefixLM``).
        optimizer: partial optimizer (Hydra ``_partial_: true``), called on parameter groups.
        weight_decay, warmup_steps, min_lr_ratio: :mod:`mmtf.tasks.optim`.
        generation: :class:`GenerationConfig` fields for :meth:`generate`.
        finetuning: :class:`PrefixFinetuning` or its keys; None = every part trains.
        lora: LoRA adapters (:meth:`Task.init_lora`), e.g. ``{"parts": ["decoder"], ...}``.
    """

    def __init__(self, *, encoder: nn.Module, decoder: CausalLM,
                 projector: Mapping[str, Any] | str | Callable[..., nn.Module] | nn.Module,
                 media_token_id: int, optimizer: Callable, grow_vocab: bool = False,
                 weight_decay: float = 0.0, warmup_steps: int = 100, min_lr_ratio: float = 0.05,
                 generation: dict | None = None,
                 finetuning: PrefixFinetuning | Mapping[str, Any] | None = None,
                 lora: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["encoder", "decoder", "projector", "optimizer"])
        self.model = MediaPrefixLM(encoder=encoder, decoder=decoder, projector=projector,
                                   media_token_id=media_token_id, grow_vocab=grow_vocab)
        self.optimizer = optimizer
        self.generation = dict(generation or {"strategy": "greedy"})
        GenerationConfig.build(**self.generation)
        self.init_lora(lora)
        ft = finetuning_controls(finetuning, PrefixFinetuning)
        self.finetuning_key = "model.finetuning"
        self.init_finetuning(
            freeze={"projector": ft.freeze_projector, "decoder": ft.freeze_decoder},
            unfreeze_at={name: getattr(ft, f"unfreeze_{name}_at_epoch") for name in PARTS},
            lr_scale={name: getattr(ft, f"{name}_lr_scale") for name in PARTS},
            layer_decay=None)

    @property
    def encoder(self) -> nn.Module:
        return self.model.encoder

    def export_parts(self) -> dict[str, nn.Module]:
        return {"encoder": self.model.encoder, "projector": self.model.projector,
                "decoder": self.model.decoder}

    def configure_optimizers(self) -> dict[str, Any]:
        from mmtf.tasks.optim import configure_adamw_cosine  # training only

        hp = self.hparams
        return configure_adamw_cosine(self.optimizer, [self.model], weight_decay=hp.weight_decay,
                                      warmup_steps=hp.warmup_steps, min_lr_ratio=hp.min_lr_ratio,
                                      total_steps=int(self.trainer.estimated_stepping_batches),
                                      parts=self.optim_parts())

    # ------------------------------------------------------------------ steps
    def forward(self, batch: Mapping[str, Any]) -> PrefixOutput:
        missing = [k for k in ("media", "input_ids", "labels") if k not in batch]
        if missing:
            raise ConfigError(f"PrefixLMTask: the batch has no {missing[0]!r} (keys: "
                              f"{sorted(batch)}); a batch carries media, media_mask, input_ids, "
                              f"attention_mask and labels.")
        return self.model(batch["media"], batch.get("media_mask"), batch["input_ids"],
                          batch.get("attention_mask"), batch["labels"])

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = self(batch).loss
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def _eval_step(self, batch: dict[str, Any], split: str) -> None:
        self.log(f"{split}/loss", self(batch).loss, prog_bar=True, sync_dist=True,
                 batch_size=batch["input_ids"].shape[0])

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    # ------------------------------------------------------------------ generation
    def update_generation(self, overrides: dict[str, Any]) -> None:
        GenerationConfig.build(**{**self.generation, **overrides})
        self.generation.update(overrides)

    def generation_state(self) -> Any:
        return dict(self.generation)

    def restore_generation(self, state: Any) -> None:
        self.generation = dict(state)

    @torch.no_grad()
    def generate(self, batch: Mapping[str, Any], **overrides: Any) -> GenerationOutput:
        """Answers to a batch of prompts (``input_ids`` ending in the generation prompt) with
        the configured generation settings, ``overrides`` on top."""
        return self.model.generate(batch["media"], batch.get("media_mask"), batch["input_ids"],
                                   batch.get("attention_mask"), **{**self.generation, **overrides})


__all__ = ["PrefixFinetuning", "PrefixLMTask"]
