"""Downstream classification: any mmtf encoder + pooling + a linear or MLP head."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from mmtf.errors import ConfigError
from mmtf.tasks.base import Task, batch_inputs


class ClassificationTask(Task):
    """Encoder -> pooled features (b, c) -> head -> class logits (b, k).

    Args:
        encoder: any mmtf encoder (``pretrained`` / ``freeze`` are its own arguments).
        num_classes: k.
        pooling: "mean" (masked mean over valid positions) or "cls".
        head: "linear" (a linear probe) or "mlp" (one hidden layer of ``hidden_dim``).
        unfreeze_encoder_at_epoch, encoder_lr_scale, layer_decay: the encoder's fine-tuning
            controls (:meth:`Task.init_finetuning`; the head keeps the optimizer's lr).
        optimizer, weight_decay, warmup_steps, min_lr_ratio, label_smoothing, lora: as
            :class:`~mmtf.tasks.captioning.CaptioningTask` (LoRA on the encoder only).
    """

    def __init__(self, *, encoder: nn.Module, num_classes: int, optimizer: Callable,
                 pooling: Literal["mean", "cls"] = "mean", head: Literal["linear", "mlp"] = "linear",
                 hidden_dim: int | None = None, dropout: float = 0.0,
                 unfreeze_encoder_at_epoch: int | None = None, encoder_lr_scale: float = 1.0,
                 layer_decay: float | None = None, weight_decay: float = 0.05,
                 warmup_steps: int = 100, min_lr_ratio: float = 0.05,
                 label_smoothing: float = 0.0, lora: dict[str, Any] | None = None) -> None:
        super().__init__()
        if num_classes < 2:
            raise ConfigError(f"ClassificationTask: num_classes ({num_classes}) must be >= 2.")
        if pooling not in ("mean", "cls"):
            raise ConfigError(f"ClassificationTask: pooling ({pooling!r}) must be 'mean' or "
                              f"'cls'.")
        if head not in ("linear", "mlp"):
            raise ConfigError(f"ClassificationTask: head ({head!r}) must be 'linear' or 'mlp'.")
        self.save_hyperparameters(ignore=["encoder", "optimizer"])
        self.encoder = encoder
        self.optimizer = optimizer
        dim = encoder.dim
        if head == "linear":
            self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(dim, num_classes))
        else:
            hidden = hidden_dim or dim
            self.head = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout),
                                      nn.Linear(hidden, num_classes))
        self.class_names: list[str] | None = None   # from the data, stored in checkpoints
        self.metrics = nn.ModuleDict({
            split: nn.ModuleDict({
                "accuracy": MulticlassAccuracy(num_classes, average="micro"),
                "macro_f1": MulticlassF1Score(num_classes, average="macro"),
            }) for split in ("train_", "val", "test")})   # "train" is a reserved ModuleDict key
        self.init_lora(lora)
        self.init_finetuning(freeze={}, unfreeze_at={"encoder": unfreeze_encoder_at_epoch},
                             lr_scale={"encoder": encoder_lr_scale}, layer_decay=layer_decay)

    def connect_data(self, datamodule: Any) -> None:
        """Check the data's classes (read at its setup) and audio length; keep the class names."""
        self.check_audio_limit(datamodule)
        classes = datamodule.num_classes
        if classes is not None and classes != self.hparams.num_classes:
            raise ConfigError(f"the data has {classes} classes but model.num_classes is "
                              f"{self.hparams.num_classes}; set model.num_classes={classes}.")
        if datamodule.class_names is not None:
            self.class_names = list(datamodule.class_names)

    def features(self, inputs: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Pooled encoder features, (b, c)."""
        return self.encoder.pool(self.encoder(inputs, lengths), mode=self.hparams.pooling)

    def forward(self, inputs: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Class logits, (b, k)."""
        return self.head(self.features(inputs, lengths))

    def configure_optimizers(self) -> dict[str, Any]:
        from mmtf.tasks.optim import configure_adamw_cosine  # training only

        hp = self.hparams
        # A frozen encoder that unfreezes later is already in the optimizer (optim_parts); until
        # then its parameters get no gradient and AdamW leaves them untouched.
        return configure_adamw_cosine(self.optimizer, [self.head, self.encoder],
                                      weight_decay=hp.weight_decay, warmup_steps=hp.warmup_steps,
                                      min_lr_ratio=hp.min_lr_ratio,
                                      total_steps=int(self.trainer.estimated_stepping_batches),
                                      parts=self.optim_parts(), layer_decay=self.layer_decay)

    def _step(self, batch: dict[str, Any], split: str) -> torch.Tensor:
        inputs, lengths = batch_inputs(batch)
        logits = self(inputs, lengths)
        loss = F.cross_entropy(logits, batch["label"],
                               label_smoothing=self.hparams.label_smoothing)
        key = "train_" if split == "train" else split
        b = inputs.shape[0]
        self.log(f"{split}/loss", loss, prog_bar=True, sync_dist=split != "train", batch_size=b)
        for name, metric in self.metrics[key].items():
            metric(logits.detach(), batch["label"])
            self.log(f"{split}/{name}", metric, prog_bar=name == "accuracy", batch_size=b)
        return loss

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._step(batch, "test")

    @torch.no_grad()
    def predict_batch(self, inputs: torch.Tensor, lengths: torch.Tensor | None,
                      ) -> list[dict[str, Any]]:
        """``{"label": int, "class": name}`` per input (the name is the label as text when the
        checkpoint has no class names)."""
        labels = self(inputs, lengths).argmax(-1).tolist()
        names = self.class_names or []
        return [{"label": k, "class": names[k] if k < len(names) else str(k)} for k in labels]

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["mmtf"]["class_names"] = self.class_names

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.class_names = (checkpoint.get("mmtf") or {}).get("class_names")
