"""Captioning as a LightningModule: any encoder + TextDecoder, teacher-forced training and
generation-based validation scored with captioning metrics against all references."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn

from mmtf.decoders import EncoderDecoder
from mmtf.tasks.common import (
    batch_inputs,
    broadcast_object,
    check_limits,
    configure_adamw_cosine,
    gather_objects,
)

log = logging.getLogger(__name__)


class CaptioningTask(L.LightningModule):
    """Encoder-decoder captioner.

    Args:
        encoder: any mmtf encoder (``forward(inputs, lengths) -> EncoderOutput``).
        decoder: a ``TextDecoder`` whose ``context_dim`` equals ``encoder.dim``.
        optimizer: partial optimizer (Hydra ``_partial_: true``), called on parameter groups.
        weight_decay: decay of matrices; norms, biases and embeddings get none.
        warmup_steps, min_lr_ratio: warmup + cosine schedule, stepped per optimizer step.
        label_smoothing: of the teacher-forced cross-entropy.
        generation: keyword arguments of ``EncoderDecoder.generate`` for validation and test
            (``strategy: greedy | beam | sample`` ...).
        val_generate: generate and score captions in validation (loss only when False).
        val_metrics, test_metrics: metric names for ``mmtf.metrics.caption_metrics`` (None = every
            available metric). METEOR starts a JVM (10-50 s), so validation defaults to the fast
            ones (BLEU, ROUGE-L, CIDEr-D) and test to all.
        num_logged_samples: reference-vs-prediction rows logged per validation epoch.
    """

    def __init__(self, *, encoder: nn.Module, decoder: nn.Module, optimizer: Callable,
                 weight_decay: float = 0.05, warmup_steps: int = 200, min_lr_ratio: float = 0.05,
                 label_smoothing: float = 0.1, generation: dict | None = None,
                 val_generate: bool = True, num_logged_samples: int = 8,
                 val_metrics: list[str] | None = ("bleu", "rouge_l", "cider_d"),
                 test_metrics: list[str] | None = None) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["encoder", "decoder", "optimizer"])
        self.model = EncoderDecoder(encoder=encoder, decoder=decoder,
                                    label_smoothing=label_smoothing)
        self.optimizer = optimizer
        self.generation = dict(generation or {"strategy": "greedy"})
        self.tokenizer = None            # from the data module (setup) or the checkpoint
        self.caption_parser = None       # event-sequence parser of the synthetic sets
        self.run_config: dict | None = None  # the composed config, stored in checkpoints
        self._outputs: dict[str, list] = {"val": [], "test": []}

    # ------------------------------------------------------------------ wiring
    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        if dm is not None:
            if getattr(dm, "tokenizer", None) is not None:
                self.tokenizer = dm.tokenizer
            self.caption_parser = getattr(dm, "caption_parser", None)
            check_limits(dm, self.model.encoder, self.model.decoder,
                         self.generation.get("max_new_tokens"))
        if self.tokenizer is None:
            raise ValueError("CaptioningTask: no tokenizer; the data module must build one in "
                             "setup() or the checkpoint must carry it.")
        vocab = self.model.decoder.vocab_size
        if self.tokenizer.vocab_size > vocab:
            raise ValueError(
                f"CaptioningTask: the tokenizer has {self.tokenizer.vocab_size} tokens but "
                f"model.decoder.vocab_size is {vocab}; raise model.decoder.vocab_size to at least "
                f"{self.tokenizer.vocab_size} (or lower data.tokenizer.vocab_size).")

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        return configure_adamw_cosine(self, self.optimizer, [self.model], hp.weight_decay,
                                      hp.warmup_steps, hp.min_lr_ratio)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Plain data only (str / dict), so the checkpoint loads with weights_only=True.
        checkpoint["mmtf"] = {
            "config": self.run_config,
            "tokenizer": None if self.tokenizer is None else self.tokenizer.to_json_str(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        from mmtf.text import Tokenizer

        extra = checkpoint.get("mmtf") or {}
        if extra.get("tokenizer"):
            self.tokenizer = Tokenizer.from_json_str(extra["tokenizer"])
        self.run_config = extra.get("config")

    # ------------------------------------------------------------------ steps
    def forward(self, inputs: torch.Tensor, lengths: torch.Tensor | None, tokens: torch.Tensor):
        return self.model(inputs, lengths, tokens)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        inputs, lengths = batch_inputs(batch)
        out = self.model(inputs, lengths, batch["tokens"])
        self.log("train/loss", out.loss, prog_bar=True, batch_size=inputs.shape[0])
        return out.loss

    def _eval_step(self, batch: dict[str, Any], split: str) -> None:
        inputs, lengths = batch_inputs(batch)
        out = self.model(inputs, lengths, batch["tokens"])
        self.log(f"{split}/loss", out.loss, prog_bar=True, sync_dist=True,
                 batch_size=inputs.shape[0])
        if split == "val" and (not self.hparams.val_generate or self.trainer.sanity_checking):
            return
        predictions = self.generate_captions(inputs, lengths)
        self._outputs[split].extend(zip(batch["ids"], predictions, batch["references"]))

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[str]:
        inputs, lengths = batch_inputs(batch)
        return self.generate_captions(inputs, lengths)

    @torch.no_grad()
    def generate_captions(self, inputs: torch.Tensor, lengths: torch.Tensor | None) -> list[str]:
        """Captions for a batch with the configured generation strategy."""
        gen = self.model.generate(inputs, lengths, **self.generation)
        tokens = gen.tokens if gen.tokens.dim() == 2 else gen.tokens[:, 0]  # best of n-best
        return self.tokenizer.decode_batch(tokens.tolist())

    # ------------------------------------------------------------------ metrics
    def on_validation_epoch_end(self) -> None:
        self._score("val")

    def on_test_epoch_end(self) -> None:
        self._score("test")

    def _score(self, split: str) -> None:
        from mmtf.metrics import caption_metrics

        local, self._outputs[split] = self._outputs[split], []
        if self.trainer.sanity_checking:
            return
        rows = [row for part in gather_objects(local) for row in part]
        if not rows:
            return
        seen, unique = set(), []
        for row in rows:                  # a DistributedSampler pads by repeating items
            if row[0] not in seen:
                seen.add(row[0])
                unique.append(row)
        ids, predictions, references = (list(col) for col in zip(*unique))
        scores: dict[str, float] | None = None
        if self.global_rank == 0:        # score once (METEOR runs a JVM), then share
            names = self.hparams.val_metrics if split == "val" else self.hparams.test_metrics
            result = caption_metrics(predictions, references,
                                     metrics=None if names is None else list(names))
            scores = dict(result)
            for name, reason in result.unavailable.items():
                log.info("%s/%s unavailable: %s", split, name, reason)
            if self.caption_parser is not None:
                from mmtf.data import event_sequence_accuracy

                scores["event_accuracy"] = event_sequence_accuracy(predictions, references,
                                                                   self.caption_parser)
        scores = broadcast_object(scores)
        for name, value in scores.items():
            # Every rank holds the same gathered score: log without a second reduction.
            self.log(f"{split}/{name}", float(value), prog_bar=name in ("cider_d", "event_accuracy"),
                     rank_zero_only=False, sync_dist=False)
        self.last_predictions = {split: [{"id": i, "prediction": p, "references": r}
                                         for i, p, r in zip(ids, predictions, references)]}
        if self.global_rank == 0:
            self._log_samples(split, ids, predictions, references)

    def _log_samples(self, split: str, ids: list[str], predictions: list[str],
                     references: list[list[str]]) -> None:
        n = self.hparams.num_logged_samples
        lines = ["| id | prediction | reference |", "|---|---|---|"]
        lines += [f"| {i} | {p} | {r[0] if r else ''} |"
                  for i, p, r in zip(ids[:n], predictions[:n], references[:n])]
        table = "\n".join(lines)
        for logger in self.loggers:                      # TensorBoard shows it as text;
            experiment = getattr(logger, "experiment", None)  # every run also gets the file
            if hasattr(experiment, "add_text"):
                experiment.add_text(f"{split}/samples", table, self.global_step)
        out_dir = Path(self.trainer.default_root_dir) / "samples"
        out_dir.mkdir(parents=True, exist_ok=True)
        name = f"{split}_epoch{self.current_epoch:03d}_step{self.global_step:07d}.md"
        (out_dir / name).write_text(table + "\n")
        log.info("%s samples (epoch %d):\n%s", split, self.current_epoch, table)


def dump_predictions(path: str | Path, rows: list[dict]) -> None:
    """Write predictions (id, prediction, references) as JSON lines."""
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
