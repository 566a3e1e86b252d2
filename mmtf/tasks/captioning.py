"""Captioning as a LightningModule: any encoder + TextDecoder, teacher-forced training and
generation-based validation scored with captioning metrics against all references."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger
from torch import nn

from mmtf.decoders import EncoderDecoder
from mmtf.decoders.generation import GenerationConfig
from mmtf.errors import CheckpointError, ConfigError
from mmtf.metrics import CaptionMetrics
from mmtf.metrics.caption import check_backend
from mmtf.tasks.base import Finetuning, Task, batch_inputs
from mmtf.tasks.resolve import check_same_tokenizer_on_every_rank, stored_tokenizer
from mmtf.text import Tokenizer

log = logging.getLogger(__name__)

C = TypeVar("C")
# The model keys that were flat before they became model.finetuning.*: old configs still load.
FINETUNING_KEYS = tuple(Finetuning.__dataclass_fields__)
# The generation keys of speech decoding (mmtf.tasks.speech.SpeechOptions): SpeechTask's only.
SPEECH_KEYS = frozenset({"language", "task", "timestamps", "long_form", "chunk_overlap",
                         "temperatures", "compression_ratio_threshold", "logprob_threshold",
                         "no_speech_threshold", "condition_on_previous_text", "sample_len",
                         "initial_prompt", "word_timestamps"})


def finetuning_controls(value: Any, controls: type[C] = Finetuning) -> C:
    """``model.finetuning`` as a ``controls`` dataclass (:class:`Finetuning`, or a task's own
    with more parts); a one-line error naming a wrong key."""
    if value is None or isinstance(value, controls):
        return value or controls()
    keys = list(controls.__dataclass_fields__)
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise ConfigError(f"model.finetuning.{unknown[0]} is not a fine-tuning control; the keys "
                          f"are {keys}.")
    return controls(**value)


def upgrade_config(model_cfg: dict[str, Any]) -> dict[str, Any]:
    """A stored ``model`` config with flat fine-tuning keys, moved under ``finetuning``."""
    cfg = dict(model_cfg)
    flat = {k: cfg.pop(k) for k in FINETUNING_KEYS if k in cfg}
    if flat:
        cfg["finetuning"] = {**flat, **(cfg.get("finetuning") or {})}
    return cfg


class CaptionScoring:
    """Generation-based caption scoring of a task (mixed into a :class:`Task` that generates
    text): val/test :class:`CaptionMetrics` (and per mixture source), scored at the end of each
    epoch under ``<split>/<metric>`` (event accuracy on a built-in set), the samples logged.
    The host calls :meth:`init_caption_metrics` and updates ``caption_metrics[split]`` in its
    steps; it has ``hparams.val_generate`` and ``hparams.num_logged_samples``."""

    caption_metrics: dict[str, CaptionMetrics]
    source_metrics: dict[str, dict[str, CaptionMetrics]]

    def init_caption_metrics(self, val_metrics: Sequence[str] | None,
                             test_metrics: Sequence[str] | None, backend: str) -> None:
        """The val and test metrics (names; None = all) with their ``backend``."""
        self.caption_metrics = {
            split: CaptionMetrics(metrics=None if names is None else list(names),
                                  backend=backend)
            for split, names in (("val", val_metrics), ("test", test_metrics))
        }
        # A mixture's sources (datamodule.source_names): the same metrics per source.
        self.source_metrics = {"val": {}, "test": {}}

    def _all_metrics(self) -> list[CaptionMetrics]:
        return [*self.caption_metrics.values(),
                *(m for per in self.source_metrics.values() for m in per.values())]

    def set_metrics_backend(self, backend: str) -> None:
        """Score with ``backend`` ("mmtf" | "aac") from now on (``evaluate metrics_backend=``)."""
        for metrics in self._all_metrics():
            metrics.backend = check_backend(backend)

    def use_sources(self, names: Sequence[str]) -> None:
        """Score val/test per source too (a mixture's ``source_names``): every metric also
        under ``<split>/<source>/<metric>``, from the batches' ``sources``."""
        hp = self.hparams
        self.source_metrics = {
            split: {name: CaptionMetrics(metrics=None if which is None else list(which),
                                         backend=self.caption_metrics[split].backend,
                                         normalizer=self.caption_metrics[split].normalizer)
                    for name in names}
            for split, which in (("val", hp.val_metrics), ("test", hp.test_metrics))}

    def on_validation_epoch_end(self) -> None:
        self._score("val")

    def on_test_epoch_end(self) -> None:
        self._score("test")

    def _score(self, split: str) -> None:
        metrics = self.caption_metrics[split]
        if self.trainer.sanity_checking or (split == "val" and not self.hparams.val_generate):
            metrics.reset()
            for per_source in self.source_metrics[split].values():
                per_source.reset()
            return
        self._score_sources(split)
        # collective: gathered, scored once, broadcast
        scores = metrics.compute(event_parser=self.event_parser())
        metrics.reset()
        for name, reason in metrics.unavailable.items():
            log.info("%s/%s unavailable: %s", split, name, reason)
        for name, value in scores.items():
            # Every rank holds the same score: log without a second reduction.
            self.log(f"{split}/{name}", float(value), prog_bar=name in ("cider_d", "event_accuracy"),
                     rank_zero_only=False, sync_dist=False)
        rows = [{"id": row.key, "prediction": row.prediction, "references": row.references}
                for row in metrics.rows]
        for row, errors in zip(rows, metrics.errors):   # wer / cer: the word alignment counts
            row.update({k: v for k, v in errors.to_row().items() if k != "id"})
        self.last_predictions = {split: rows}
        if self.global_rank == 0:
            self._log_samples(split, rows)
            if metrics.errors:
                from mmtf.metrics.wer import write_errors_csv  # transcripts only

                write_errors_csv(Path(self.trainer.default_root_dir) / "errors" /
                                 f"{split}_{self._epoch_step()}.csv", metrics.errors)

    def _score_sources(self, split: str) -> None:
        """Each source's metrics under ``<split>/<source>/<metric>`` (collective, like the
        all-sources scores; every rank walks the same sources in the same order)."""
        for name, metrics in self.source_metrics[split].items():
            try:
                scores = metrics.compute(event_parser=self.event_parser())
            except ValueError:
                if metrics.rows:
                    raise
                scores = {}                 # no batch of it this epoch (limit_val_batches)
            metrics.reset()
            for metric, value in scores.items():
                self.log(f"{split}/{name}/{metric}", float(value), rank_zero_only=False,
                         sync_dist=False)

    def _epoch_step(self) -> str:
        return f"epoch{self.current_epoch:03d}_step{self.global_step:07d}"

    def _log_samples(self, split: str, rows: list[dict[str, Any]]) -> None:
        shown = rows[:self.hparams.num_logged_samples]
        if rows and "substitutions" in rows[0]:     # transcripts: the alignment counts too
            lines = ["| id | prediction | reference | S | D | I | WER |", "|---|---|---|---|---|---|---|"]
            lines += [f"| {r['id']} | {r['prediction']} | {r['references'][0]} | "
                      f"{r['substitutions']} | {r['deletions']} | {r['insertions']} | "
                      f"{r['wer']:.3f} |" for r in shown]
        else:
            lines = ["| id | prediction | reference |", "|---|---|---|"]
            lines += [f"| {r['id']} | {r['prediction']} | {r['references'][0]} |" for r in shown]
        table = "\n".join(lines)
        name = f"{split}_{self._epoch_step()}.md"
        for logger in self.loggers:
            if isinstance(logger, WandbLogger):          # a table per validation
                logger.log_table(f"{split}/samples", columns=["id", "prediction", "reference"],
                                 data=[[r["id"], r["prediction"], r["references"][0]]
                                       for r in shown], step=self.global_step)
            elif isinstance(logger, MLFlowLogger):       # an artifact file per validation
                logger.experiment.log_text(logger.run_id, table + "\n", f"samples/{name}")
            elif isinstance(logger, TensorBoardLogger):  # the Text tab
                logger.experiment.add_text(f"{split}/samples", table, self.global_step)
        out_dir = Path(self.trainer.default_root_dir) / "samples"   # every run gets the file
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / name).write_text(table + "\n")
        log.info("%s samples (epoch %d):\n%s", split, self.current_epoch, table)


class CaptioningTask(CaptionScoring, Task):
    """Encoder-decoder captioner. Its tokenizer is handed over (:meth:`use_tokenizer`) by
    whoever built it (docs/design/tokenizer-ownership.md), saved in every checkpoint and checked
    against a restored one's.

    Args:
        encoder: any mmtf encoder (``forward(inputs, lengths) -> EncoderOutput``).
        decoder: a ``TextDecoder`` whose ``context_dim`` equals ``encoder.dim``.
        optimizer: partial optimizer (Hydra ``_partial_: true``), called on parameter groups.
        weight_decay, warmup_steps, min_lr_ratio: :mod:`mmtf.tasks.optim`.
        label_smoothing: of the teacher-forced cross-entropy.
        generation: :class:`GenerationConfig` fields for validation, test and predict.
        val_generate: generate and score captions in validation (loss only when False).
        val_metrics, test_metrics: metric names (None = all; validation: the fast ones).
        metrics_backend: "mmtf" (built-in) or "aac" (aac-metrics, :mod:`mmtf.metrics.aac`).
        num_logged_samples: reference-vs-prediction rows logged per validation epoch.
        finetuning: :class:`~mmtf.tasks.base.Finetuning` or its keys; None = all trainable.
        lora: LoRA adapters (:meth:`Task.init_lora`); None = off.
    """

    reads_text: ClassVar[bool] = True

    def __init__(self, *, encoder: nn.Module, decoder: nn.Module, optimizer: Callable,
                 weight_decay: float = 0.05, warmup_steps: int = 200, min_lr_ratio: float = 0.05,
                 label_smoothing: float = 0.1, generation: dict | None = None,
                 val_generate: bool = True, num_logged_samples: int = 8,
                 val_metrics: list[str] | None = ("bleu", "rouge_l", "cider_d"),
                 test_metrics: list[str] | None = None, metrics_backend: str = "mmtf",
                 finetuning: Finetuning | Mapping[str, Any] | None = None,
                 lora: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["encoder", "decoder", "optimizer"])
        self.model = EncoderDecoder(encoder=encoder, decoder=decoder,
                                    label_smoothing=label_smoothing)
        self.optimizer = optimizer
        self.generation = dict(generation or {"strategy": "greedy"})
        self.user_suppress_tokens = tuple(self.generation.get("suppress_tokens", ()))
        self.check_generation()
        self.init_caption_metrics(val_metrics, test_metrics, metrics_backend)
        self.init_lora(lora)
        ft = finetuning_controls(finetuning)
        self.finetuning_key = "model.finetuning"
        self.init_finetuning(
            freeze={"decoder": ft.freeze_decoder},
            unfreeze_at={"encoder": ft.unfreeze_encoder_at_epoch,
                         "decoder": ft.unfreeze_decoder_at_epoch},
            lr_scale={"encoder": ft.encoder_lr_scale, "decoder": ft.decoder_lr_scale},
            layer_decay=ft.layer_decay)

    @property
    def encoder(self) -> nn.Module:
        return self.model.encoder

    def update_generation(self, overrides: dict[str, Any]) -> None:
        """Merge ``overrides`` into the generation settings (``evaluate``, ``predict``)."""
        self.generation.update(overrides)
        self.user_suppress_tokens = tuple(self.generation.get("suppress_tokens", ()))
        self.suppress_undecodable_ids()
        self.check_generation()

    def suppress_undecodable_ids(self) -> None:
        """Never generate the decoder's ids past the tokenizer's vocabulary (a BPE trained on
        little text learns fewer tokens than ``model.decoder.vocab_size``; they have no text)."""
        if self.tokenizer is None:
            return
        extra = range(self.tokenizer.vocab_size, self.model.decoder.vocab_size)
        self.generation["suppress_tokens"] = tuple(sorted({*self.user_suppress_tokens, *extra}))

    def generation_state(self) -> Any:
        return dict(self.generation), self.user_suppress_tokens

    def restore_generation(self, state: Any) -> None:
        self.generation, self.user_suppress_tokens = state

    def check_generation(self) -> None:
        """The generation settings are valid options (:class:`GenerationConfig`), and
        ``max_new_tokens`` plus the prompt fits the decoder's positions."""
        speech = sorted(SPEECH_KEYS & set(self.generation))
        if speech:
            raise ConfigError(f"generation.{speech[0]} is a speech decoding setting; it needs "
                              f"model._target_=mmtf.tasks.SpeechTask (model=whisper) and a "
                              f"Whisper tokenizer.")
        GenerationConfig.build(**self.generation)
        max_new = self.generation.get("max_new_tokens")
        max_len = self.model.decoder.max_len
        prompt = len(self.model.prompt_ids)
        if max_new is not None and max_new + prompt > max_len:
            raise ConfigError(f"model.generation.max_new_tokens ({max_new}) + the prompt "
                              f"({prompt} token{'s' if prompt > 1 else ''}) exceeds "
                              f"model.decoder.max_len ({max_len}); lower max_new_tokens.")

    # ------------------------------------------------------------------ wiring
    def setup(self, stage: str) -> None:
        super().setup(stage)
        trainer = self.attached_trainer()
        if self.tokenizer is not None and trainer is not None and trainer.world_size > 1:
            check_same_tokenizer_on_every_rank(self.tokenizer, trainer.strategy)

    def connect_data(self, datamodule: Any) -> None:
        """Check the data module builds its ids with this task's tokenizer and fits the model.

        Raises:
            UserError: either side has no tokenizer, or they differ.
        """
        self.check_audio_limit(datamodule)
        caption_tokens = datamodule.max_caption_tokens
        max_len = self.model.decoder.max_len
        if caption_tokens > max_len:
            raise ConfigError(f"data.max_caption_tokens ({caption_tokens}) exceeds "
                              f"model.decoder.max_len ({max_len}); lower data.max_caption_tokens "
                              f"(longer captions are truncated and counted) or raise "
                              f"model.decoder.max_len.")
        self.check_data_tokenizer(datamodule)
        self.use_sources(getattr(datamodule, "source_names", ()))

    def use_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Adopt ``tokenizer``: its ids must fit the decoder's vocabulary, and the model takes
        its pad, eos and prompt ids."""
        vocab = self.model.decoder.vocab_size
        if tokenizer.vocab_size > vocab:
            raise ConfigError(
                f"CaptioningTask: the tokenizer has {tokenizer.vocab_size} tokens but "
                f"model.decoder.vocab_size is {vocab}; raise model.decoder.vocab_size to at least "
                f"{tokenizer.vocab_size} (or lower tokenizer.vocab_size).")
        self.model.set_special_tokens(pad_id=tokenizer.pad_id, eos_id=tokenizer.eos_id,
                                      prompt_ids=tokenizer.prompt_ids)
        self.tokenizer = tokenizer
        self.suppress_undecodable_ids()
        self.check_generation()

    def configure_optimizers(self) -> dict[str, Any]:
        from mmtf.tasks.optim import configure_adamw_cosine  # training only

        hp = self.hparams
        return configure_adamw_cosine(self.optimizer, [self.model], weight_decay=hp.weight_decay,
                                      warmup_steps=hp.warmup_steps, min_lr_ratio=hp.min_lr_ratio,
                                      total_steps=int(self.trainer.estimated_stepping_batches),
                                      parts=self.optim_parts(), layer_decay=self.layer_decay)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Only checks: the tokenizer was handed over before; another one would read other words.
        super().on_load_checkpoint(checkpoint)
        stored = stored_tokenizer(checkpoint)
        if stored is None:
            raise CheckpointError("the checkpoint carries no tokenizer (checkpoint['mmtf']"
                                  "['tokenizer']); it was not written by a CaptioningTask.")
        if self.tokenizer is None:
            raise CheckpointError(
                "CaptioningTask: restoring a checkpoint into a task without a tokenizer; hand it "
                "the checkpoint's first: task.use_tokenizer(mmtf.tasks.stored_tokenizer("
                "checkpoint)), or load it with mmtf.tasks.build_task / mmtf.load.")
        if stored != self.tokenizer:
            raise CheckpointError(
                "the checkpoint's tokenizer differs from the one this task (and its data) were "
                "given; resume with python -m mmtf.train ckpt_path=<it> (which takes the "
                "checkpoint's tokenizer), or hand both mmtf.tasks.resolve_tokenizer(..., "
                "ckpt_path=<it>).")

    # ------------------------------------------------------------------ steps
    def forward(self, inputs: torch.Tensor, lengths: torch.Tensor | None, tokens: torch.Tensor):
        return self.model(inputs, lengths, tokens)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        inputs, lengths = batch_inputs(batch)
        if "mix_lambda" in batch:      # data.augment.mixup: both captions, weighted
            out = self.model.mixup_forward(inputs, lengths, batch["tokens"],
                                           batch["mix_index"], batch["mix_lambda"])
        else:
            out = self.model(inputs, lengths, batch["tokens"])
        self.log("train/loss", out.loss, prog_bar=True, batch_size=inputs.shape[0])
        return out.loss

    def _eval_step(self, batch: dict[str, Any], split: str) -> None:
        inputs, lengths = batch_inputs(batch)
        if not self.too_long(lengths):      # whole long clips (long_audio=...): no loss
            out = self.model(inputs, lengths, batch["tokens"])
            self.log(f"{split}/loss", out.loss, prog_bar=True, sync_dist=True,
                     batch_size=inputs.shape[0])
        if split == "val" and (not self.hparams.val_generate or self.trainer.sanity_checking):
            return
        # Each item generates from the prompt it was scored with (its language and task:
        # the data module puts each speech item's own prompt at the start of its target).
        prompts = batch["tokens"][:, :len(self.model.prompt_ids)]
        same = bool((prompts == prompts.new_tensor(self.model.prompt_ids)).all())
        predictions = self.generate_captions(inputs, lengths,
                                             prompt_ids=None if same else prompts)
        self.caption_metrics[split].update(predictions, batch["references"], keys=batch["ids"])
        for name, metrics in self.source_metrics[split].items():     # a mixture: per source
            rows = [i for i, source in enumerate(batch.get("sources", ())) if source == name]
            if rows:
                metrics.update([predictions[i] for i in rows],
                               [batch["references"][i] for i in rows],
                               keys=[batch["ids"][i] for i in rows])

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def too_long(self, lengths: torch.Tensor | None) -> bool:
        """Whether a batch is scored without its teacher-forced loss (whole long clips of
        :class:`~mmtf.tasks.speech.SpeechTask`); never for captions."""
        return False

    def predict_batch(self, inputs: torch.Tensor, lengths: torch.Tensor | None,
                      ) -> list[dict[str, Any]]:
        """``{"caption": str}`` per input, with the configured generation strategy."""
        return [{"caption": c} for c in self.generate_captions(inputs, lengths)]

    @torch.no_grad()
    def generate_captions(self, inputs: torch.Tensor, lengths: torch.Tensor | None, *,
                          prompt_ids: torch.Tensor | None = None) -> list[str]:
        """Captions for a batch with the configured generation strategy; ``prompt_ids``: (b, p)
        each item's prompt, or None for the model's."""
        tokenizer = self.require_tokenizer()
        extra = {} if prompt_ids is None else {"prompt_ids": prompt_ids}
        gen = self.model.generate(inputs, lengths, **extra, **self.generation)
        return tokenizer.decode_batch(gen.best().tokens.tolist())

    def export_parts(self) -> dict[str, nn.Module]:
        return {"encoder": self.model.encoder, "decoder": self.model.decoder}
