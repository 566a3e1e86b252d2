"""A Lightning callback that draws the attention of one fixed validation example every epoch.

The figure goes to every logger that takes images and to ``<run dir>/samples/``. It cannot
change training: the item is read from the dataset directly (no loader iterator, which draws a
seed), decoding is greedy under ``no_grad`` and every submodule's train/eval state is restored."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy

from mmtf.inspect import plot

log = logging.getLogger(__name__)
SHARDED_STRATEGIES = (FSDPStrategy, ModelParallelStrategy, DeepSpeedStrategy)


class AttentionFigureCallback(L.Callback):
    """Log the cross-attention of the first validation item as a figure per epoch.

    Args:
        every_n_epochs: draw at the validations that end epochs 1-based divisible by it, as
            Lightning's ``check_val_every_n_epoch`` counts: 6 with validation every 2nd epoch
            draws after epochs 6, 12, 18, ...
        layers, head: decoder layers (None = the last one) and head (None = the mean) to draw.
        max_new_tokens: caption length limit for the figure (None = the task's generation).
    """

    def __init__(self, *, every_n_epochs: int = 1, layers: Sequence[int] | None = None,
                 head: int | None = None, max_new_tokens: int | None = None) -> None:
        super().__init__()
        from mmtf.errors import UserError

        if every_n_epochs < 1:
            raise UserError(f"callbacks.attention_figure.every_n_epochs ({every_n_epochs}) must "
                            f"be >= 1.")
        self.every_n_epochs, self.layers, self.head = every_n_epochs, layers, head
        self.max_new_tokens = max_new_tokens
        self._said_sharded = False

    @torch.no_grad()
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if (trainer.sanity_checking or not trainer.is_global_zero
                or not self.draws_after(trainer.current_epoch)):
            return
        if isinstance(trainer.strategy, SHARDED_STRATEGIES):
            # Rank 0 alone cannot run a sharded model: every forward gathers from all ranks.
            if not self._said_sharded:
                log.info("attention figure: off under %s (parameters are sharded); draw it "
                         "from a checkpoint with python -m mmtf.inspect.",
                         type(trainer.strategy).__name__)
                self._said_sharded = True
            return
        from mmtf.tasks import CaptioningTask

        if not isinstance(pl_module, CaptioningTask) or pl_module.tokenizer is None:
            return                      # only captioners generate text to attend with
        model, tokenizer = pl_module.model, pl_module.tokenizer
        inputs, lengths = self._first_item(trainer, pl_module.device)
        if inputs is None:
            return
        from mmtf.inspect.core import inspection_figures

        layers = self.layers if self.layers is not None else [-1]
        generation = dict(pl_module.generation)
        generation["strategy"] = "greedy" if generation.get("strategy") == "sample" else \
            generation.get("strategy", "greedy")
        if self.max_new_tokens is not None:
            generation["max_new_tokens"] = self.max_new_tokens
        _, _, figures = inspection_figures(model, tokenizer, inputs, lengths, layers=layers,
                                           head=self.head, with_alignment=False,
                                           generation=generation,
                                           data_cfg=(pl_module.run_config or {}).get("data"))
        name, fig = next(iter(figures.items()))
        step, epoch = trainer.global_step, trainer.current_epoch
        out = Path(trainer.default_root_dir) / "samples" / f"val_attention_epoch{epoch:03d}.png"
        image = plot.render_and_save(fig, out)
        for logger in trainer.loggers:
            experiment = getattr(logger, "experiment", None)
            if hasattr(experiment, "add_image"):
                experiment.add_image("val/attention", image, step, dataformats="HWC")
        log.info("attention figure (%s) of the first val item: %s", name, out)

    def draws_after(self, epoch: int) -> bool:
        """Whether the validation at the end of ``epoch`` (0-based, Lightning's
        ``current_epoch``) draws the figure."""
        return (epoch + 1) % self.every_n_epochs == 0

    @staticmethod
    def _first_item(trainer: L.Trainer, device: torch.device):
        """The first validation item as a batch of 1 on ``device``: (inputs, lengths)."""
        loaders = trainer.val_dataloaders
        loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
        dataset = getattr(loader, "dataset", None)
        collate = getattr(loader, "collate_fn", None)
        if dataset is None or collate is None or len(dataset) == 0:
            return None, None
        batch = collate([dataset[0]])
        if "audio" in batch:
            return batch["audio"].to(device), batch["audio_lengths"].to(device)
        if "image" in batch:
            return batch["image"].to(device), None
        return None, None
