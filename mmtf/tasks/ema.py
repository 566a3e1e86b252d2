"""An exponential moving average of a task's weights (``callbacks=ema``).

:class:`EMA` is Lightning's ``WeightAveraging`` with mmtf's rules: ``ema = lerp(ema, w, 1 -
decay)`` after optimizer steps ``start_step, start_step + every_n_steps, ...`` (the first update
copies the weights); checkpoints keep the trained weights in ``state_dict`` and the average in
``ema_state_dict``, and a resume continues the average bit for bit; ``validate_with_ema`` swaps
the average in for validation and test; the trained weights are never overwritten at the end of
fit (``use_ema=true`` of the readers picks the average). Why: docs/design/ema.md.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from torch import Tensor
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from mmtf.checkpoint_io import EMA_STATE_KEY
from mmtf.errors import ConfigError
from mmtf.tasks.fsdp import FSDP2Strategy

log = logging.getLogger("mmtf.tasks.ema")

__all__ = ["EMA"]


class EMA(WeightAveraging):
    """Exponential moving average of every parameter of the task.

    Args:
        decay: weight of the old average per update, in (0, 1).
        start_step: the first update (a copy of the weights) after this many optimizer steps.
        every_n_steps: update after every n-th optimizer step from ``start_step`` on.
        validate_with_ema: run validation and test on the averaged weights.
        device: where the average lives; None = the model's device.
    """

    def __init__(self, *, decay: float = 0.999, start_step: int = 0, every_n_steps: int = 1,
                 validate_with_ema: bool = True, device: str | None = None) -> None:
        if not 0.0 < decay < 1.0:
            raise ConfigError(f"callbacks.ema.decay ({decay}) must be in (0, 1), e.g. 0.999.")
        if start_step < 0 or every_n_steps < 1:
            raise ConfigError(f"callbacks.ema: start_step ({start_step}) must be >= 0 and "
                              f"every_n_steps ({every_n_steps}) >= 1.")
        self._ema_fn = get_ema_multi_avg_fn(decay)
        super().__init__(device=device, use_buffers=False, multi_avg_fn=self._ema_fn)
        self.decay, self.start_step, self.every_n_steps = decay, start_step, every_n_steps
        self.validate_with_ema = validate_with_ema
        self._swapped: dict[str, Tensor] | None = None   # the tensors now holding the others
        self._loaded: dict[str, Tensor] | None = None    # a tested checkpoint's average
        self._testing_checkpoint = False                 # validate/test of a checkpoint file

    # ------------------------------------------------------------------ when to update
    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """After optimizer step ``step_idx + 1`` (Lightning passes a 0-based index)."""
        if step_idx is None:
            return False
        step = step_idx + 1
        return step >= self.start_step and (step - self.start_step) % self.every_n_steps == 0

    @property
    def updates(self) -> int:
        """Updates folded into the average so far (0: none, no average yet)."""
        return 0 if self._average_model is None else int(self._average_model.n_averaged)

    # ------------------------------------------------------------------ lifecycle
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._loaded, self._testing_checkpoint = None, False
        if stage != "fit":
            return
        if isinstance(trainer.strategy, FSDP2Strategy):
            raise ConfigError("callbacks.ema does not support trainer=fsdp (the average would "
                              "be a full unsharded copy on every rank); use trainer=ddp or "
                              "remove callbacks.ema.")
        # The averaged copy of the task; buffers follow the model (use_buffers=False).
        self._average_model = AveragedModel(pl_module, device=self._device, use_buffers=False,
                                            multi_avg_fn=self._ema_fn)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # setup() ran before the strategy moved the model to its device.
        if self._device is None and self._average_model is not None:
            self._average_model.to(pl_module.device)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Keep the trained weights (Lightning would overwrite them with the average)."""

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._swap_in(pl_module)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._swap_out(pl_module)

    on_test_epoch_start = on_validation_epoch_start
    on_test_epoch_end = on_validation_epoch_end

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"latest_update_step": self._latest_update_step, "updates": self.updates,
                "decay": self.decay, "start_step": self.start_step,
                "every_n_steps": self.every_n_steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._latest_update_step = state_dict["latest_update_step"]
        if self._average_model is not None:
            self._average_model.n_averaged.fill_(int(state_dict["updates"]))

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        """``ema_state_dict``: ``state_dict`` with the parameters' averages, once one exists."""
        if not self.updates:
            return
        state = checkpoint["state_dict"]
        if self._swapped is None:
            average = self._average_parameters()
        else:    # saved mid-validation: the task holds the average, the copy the trained weights
            average = {name: state[name] for name in self._swapped}
            state = checkpoint["state_dict"] = {**state, **self._swapped}
        checkpoint[EMA_STATE_KEY] = {**state, **average}

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        stored = checkpoint.get(EMA_STATE_KEY)
        if trainer.state.fn != "fit":          # a tested/validated checkpoint's own average
            self._loaded, self._testing_checkpoint = stored, True
            return
        if stored is not None and self._average_model is not None:
            with torch.no_grad():
                for name, tensor in self._average_parameters().items():
                    tensor.copy_(stored[name])

    # ------------------------------------------------------------------ swapping
    def _average_parameters(self) -> dict[str, Tensor]:
        assert self._average_model is not None
        return {name: p.detach() for name, p in
                self._average_model.module.named_parameters(remove_duplicate=False)}

    def _swap_in(self, pl_module: L.LightningModule) -> None:
        if not self.validate_with_ema or self._swapped is not None:
            return
        if self._testing_checkpoint:           # never the end-of-fit average for another file
            if self._loaded is None:
                log.warning("callbacks.ema.validate_with_ema: %s holds no EMA weights (saved "
                            "before callbacks.ema.start_step, or without callbacks=ema); "
                            "scoring its trained weights.", pl_module.trainer.ckpt_path)
                return
            others = {name: self._loaded[name].to(pl_module.device)
                      for name, _ in pl_module.named_parameters()}
        elif self.updates:
            others = self._average_parameters()
        else:                                  # before the first update: no average yet
            return
        self._exchange(pl_module, others)
        self._swapped = others

    def _swap_out(self, pl_module: L.LightningModule) -> None:
        if self._swapped is not None:
            self._exchange(pl_module, self._swapped)
            self._swapped = None

    @staticmethod
    @torch.no_grad()
    def _exchange(pl_module: L.LightningModule, others: dict[str, Tensor]) -> None:
        """Swap the values of the task's parameters and ``others`` (same names), in place."""
        for name, param in pl_module.named_parameters():
            other = others[name]
            held = param.detach().clone()
            param.copy_(other)
            other.copy_(held)
