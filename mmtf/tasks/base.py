"""What every mmtf task offers the CLIs (``evaluate``, ``predict``, ``export``).

A task is a LightningModule around one mmtf encoder. Besides Lightning's hooks it offers:

* ``encoder`` and ``modality`` (``audio`` | ``image``): what inputs it takes;
* :meth:`Task.connect_data`: hand the data module what the task owns (the tokenizer), take what
  the task needs from it (caption parser, class names) and check the data against the model's
  limits. ``setup`` calls it with the trainer's data module; ``evaluate`` calls it directly;
* :meth:`Task.update_generation`: generation overrides (tasks that generate text);
* :meth:`Task.predict_batch`: one dict per input (``caption``, or ``label`` + ``class``);
* :meth:`Task.export_parts`: the part modules ``mmtf.export`` can write;
* ``run_config`` (the composed config) and ``tokenizer``, stored in every checkpoint under
  ``checkpoint["mmtf"]`` as plain data, so it loads with ``weights_only=True``.

Why one interface instead of ``hasattr`` probes: see docs/design/task-interface.md
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from torch import nn

from mmtf.encoders import AudioEncoder
from mmtf.utils.config import ConfigError
from mmtf.utils.fsdp import shard_model

Modality = Literal["audio", "image"]


class Task(L.LightningModule):
    """Base class of the mmtf tasks; subclasses set ``encoder`` and implement the methods below."""

    encoder: nn.Module

    def __init__(self) -> None:
        super().__init__()
        self.run_config: dict | None = None   # the composed config, stored in checkpoints
        self.tokenizer: Any = None            # mmtf.text.Tokenizer of tasks that emit text
        # split -> rows {"id", "prediction", "references"} of the last scored epoch
        self.last_predictions: dict[str, list[dict[str, Any]]] = {}

    @property
    def modality(self) -> Modality:
        """The input modality: ``audio`` (waveforms + lengths) or ``image`` (b, 3, h, w)."""
        return "audio" if isinstance(self.encoder, AudioEncoder) else "image"

    def attached_datamodule(self) -> Any:
        """The data module of the Trainer running this task; None outside a Trainer or when the
        Trainer was given loaders instead."""
        try:
            trainer = self.trainer
        except RuntimeError:       # Lightning: "... is not attached to a `Trainer`"
            return None
        return trainer.datamodule

    def configure_model(self) -> None:
        # trainer=fsdp: one FSDP2 shard unit per transformer block; other strategies: nothing.
        shard_model(self)

    def setup(self, stage: str) -> None:
        datamodule = self.attached_datamodule()
        if datamodule is not None:
            self.connect_data(datamodule)

    def connect_data(self, datamodule: Any) -> None:
        """Exchange with a data module what each side owns; check the data fits the model."""
        self.check_audio_limit(datamodule)

    def check_audio_limit(self, datamodule: Any) -> None:
        """Audio clips longer than the encoder accepts are cropped by the data, never passed on.

        Checked here because only the task sees both sides: the data module's ``max_seconds``
        and the encoder's.
        """
        if datamodule.modality != "audio" or self.modality != "audio":
            return
        limit, data_seconds = self.encoder.max_seconds, datamodule.max_seconds
        if limit is not None and (data_seconds is None or data_seconds > limit):
            raise ConfigError(f"data.max_seconds ({data_seconds}) exceeds model.encoder."
                              f"max_seconds ({limit}); set data.max_seconds <= {limit} (clips "
                              f"are cropped to it) or raise model.encoder.max_seconds.")

    def predict_batch(self, inputs: torch.Tensor, lengths: torch.Tensor | None,
                      ) -> list[dict[str, Any]]:
        """One result dict per input of the batch (inputs as in a training batch)."""
        raise NotImplementedError

    def update_generation(self, overrides: dict[str, Any]) -> None:
        """Merge generation settings; only tasks that generate text take any."""
        if overrides:
            raise ConfigError(f"generation.{sorted(overrides)[0]} is set but a "
                              f"{type(self).__name__} checkpoint generates no text; remove the "
                              f"generation.* overrides.")

    def export_parts(self) -> dict[str, nn.Module]:
        """The parts ``mmtf.export`` can write, by the name of their config key under model."""
        return {"encoder": self.encoder}

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[dict[str, Any]]:
        return self.predict_batch(*batch_inputs(batch))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Plain data only (str / dict / list), so the checkpoint loads with weights_only=True.
        checkpoint["mmtf"] = {
            "config": self.run_config,
            "tokenizer": None if self.tokenizer is None else self.tokenizer.to_json_str(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.run_config = (checkpoint.get("mmtf") or {}).get("config")


def batch_inputs(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The encoder input of a batch: waveforms (b, samples) + lengths, or images (b, 3, h, w)."""
    if "audio" in batch:
        return batch["audio"], batch["audio_lengths"]
    if "image" in batch:
        return batch["image"], None
    raise KeyError(f"batch has neither 'audio' nor 'image' (keys: {sorted(batch)}); the data "
                   f"module's collate must provide one of them.")
