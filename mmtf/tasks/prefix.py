"""The multimodal prefix model as a LightningModule: encoder -> projector -> LLM, trained on the
answer tokens of chat-rendered items, validated and tested by generation.

A training batch carries ``media`` (the encoder's input), ``media_mask`` ((b, n) bool or
absent), ``input_ids``, ``attention_mask`` and ``labels`` (unshifted, -100 where not trained:
the chat renderer's output, right-padded). A validation/test batch also carries
``prompt_ids`` / ``prompt_mask`` (left-padded: the conversation up to the last assistant turn
and the generation prompt) and its targets: ``references`` (captions: scored with the
captioner's metrics, :class:`~mmtf.tasks.captioning.CaptionScoring`) or ``choices``,
``answer``, ``question_type`` and ``rotation`` (multiple-choice questions: shuffle-robust
accuracy, :mod:`mmtf.metrics.aqa`).

The task owns the text side: its tokenizer (handed over, :meth:`PrefixLMTask.use_tokenizer`),
the media placeholder resolved from it, and the chat template (built in, ``chatml``, or the
LLM folder's), which is stored in every checkpoint beside the tokenizer and handed to the data
module with it (:meth:`PrefixLMTask.text_context`). The fine-tuning controls, per-part learning
rates, LoRA, EMA and exact resume are the base task's (:class:`~mmtf.tasks.base.Task`), with
three parts: ``encoder``, ``projector``, ``decoder`` (the LLM). Why:
docs/design/prefix-model.md, docs/design/prefix-task-text.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from mmtf.decoders.generation import GenerationConfig, GenerationOutput
from mmtf.decoders.lm import CausalLM
from mmtf.decoders.prefix import MediaPrefixLM, PrefixOutput
from mmtf.errors import CheckpointError, ConfigError, UserError
from mmtf.tasks.base import Task
from mmtf.tasks.captioning import CaptionScoring, finetuning_controls
from mmtf.text.chat import (
    BUILTIN_TOKENS,
    MEDIA_TOKENS,
    ChatTemplate,
    backend_of,
    encode_rendered,
    end_of_turn_id,
    ensure_media_token,
)

log = logging.getLogger(__name__)

PARTS = ("encoder", "projector", "decoder")
# The instruction predict() captions with when the run's data names none (data.instruction).
DEFAULT_INSTRUCTIONS = {"audio": "Describe the sound.", "image": "Describe the image."}


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


def user_turn(text: str, media_token: str) -> str:
    """A user message that holds the media: ``text`` as it is when it has the placeholder,
    else the placeholder on its own line before it (the form of :mod:`mmtf.metrics.aqa`)."""
    return text if media_token in text else f"{media_token}\n{text}"


class PrefixLMTask(CaptionScoring, Task):
    """Trains a :class:`~mmtf.decoders.prefix.MediaPrefixLM` on the answer tokens and scores
    what it generates.

    Args:
        encoder: any mmtf encoder.
        decoder: the LLM (``mmtf.pretrained.llm.llm_decoder``: from a folder or from scratch).
        projector: ``{"kind": ..., **settings}`` or a ``_target_`` (see ``MediaPrefixLM``).
        media_token: the placeholder's spelling; None = ``<|audio|>`` / ``<|image|>`` by the
            encoder's modality. Its id is read from the tokenizer (added to a pretrained one
            by :func:`~mmtf.text.chat.ensure_media_token`).
        media_token_id: an explicit id instead (None: from the tokenizer).
        grow_vocab: when the placeholder's id is past the LLM's vocabulary, add the missing
            rows instead of refusing.
        chat_template: a built-in template's name (``chatml``) or an LLM folder or hub id
            (its ``chat_template.jinja`` / ``tokenizer_config.json``); None = ``chatml``. A
            rebuilt checkpoint uses the one it stored.
        optimizer: partial optimizer (Hydra ``_partial_: true``), called on parameter groups.
        weight_decay, warmup_steps, min_lr_ratio: :mod:`mmtf.tasks.optim`.
        generation: :class:`GenerationConfig` fields for validation, test and predict.
        val_generate: generate and score in validation (loss only when False).
        val_metrics, test_metrics, metrics_backend, num_logged_samples: the caption scoring
            (as :class:`~mmtf.tasks.CaptioningTask`).
        finetuning: :class:`PrefixFinetuning` or its keys; None = every part trains.
        lora: LoRA adapters (:meth:`Task.init_lora`), e.g. ``{"parts": ["decoder"], ...}``.
    """

    reads_text: ClassVar[bool] = True

    def __init__(self, *, encoder: nn.Module, decoder: CausalLM,
                 projector: Mapping[str, Any] | str | Callable[..., nn.Module] | nn.Module,
                 optimizer: Callable, media_token: str | None = None,
                 media_token_id: int | None = None, grow_vocab: bool = False,
                 chat_template: str | None = None,
                 weight_decay: float = 0.0, warmup_steps: int = 100, min_lr_ratio: float = 0.05,
                 generation: dict | None = None, val_generate: bool = True,
                 val_metrics: Sequence[str] | None = ("bleu", "rouge_l", "cider_d"),
                 test_metrics: Sequence[str] | None = None, metrics_backend: str = "mmtf",
                 num_logged_samples: int = 8,
                 finetuning: PrefixFinetuning | Mapping[str, Any] | None = None,
                 lora: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["encoder", "decoder", "projector", "optimizer"])
        self.model = MediaPrefixLM(encoder=encoder, decoder=decoder, projector=projector,
                                   media_token_id=media_token_id, grow_vocab=grow_vocab)
        self.media_token = media_token or MEDIA_TOKENS[self.modality]
        self.optimizer = optimizer
        self.generation = dict(generation or {"strategy": "greedy"})
        GenerationConfig.build(**self.generation)
        self.chat_template_source = chat_template or "chatml"
        self._chat_template: ChatTemplate | None = None
        self._stop_id: int | None = None
        self.init_caption_metrics(val_metrics, test_metrics, metrics_backend)
        # split -> this rank's replies to multiple-choice questions of the epoch
        self.qa_rows: dict[str, list[dict[str, Any]]] = {"val": [], "test": []}
        self.last_qa_scores: dict[str, Any] = {}
        self._questions: list[str] | None = None      # set_questions, for one predict_batch
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

    # ------------------------------------------------------------------ text side
    @property
    def chat_template(self) -> ChatTemplate:
        """The chat template the data and the prompts are rendered with, read on first use.

        Raises:
            UserError: none configured, an unknown built-in name, or a folder without one.
        """
        if self._chat_template is None:
            source = str(self.chat_template_source)
            # A bare name that is no folder names a built-in template (its error lists them).
            builtin = source in BUILTIN_TOKENS or ("/" not in source
                                                   and not Path(source).expanduser().exists())
            self._chat_template = (ChatTemplate.builtin(source) if builtin
                                   else ChatTemplate.from_folder(source))
        return self._chat_template

    def use_tokenizer(self, tokenizer: Any) -> None:
        """Adopt ``tokenizer`` (an mmtf BPE with the chat tokens, or an LLM folder's): the
        placeholder's id is read from it (added to it when missing, one token), the LLM grows
        to it when ``grow_vocab``, and its ids must fit the LLM's vocabulary.

        Raises:
            ConfigError: the tokenizer has more ids than the LLM's vocabulary.
        """
        if self.hparams.media_token_id is None:
            media_id = ensure_media_token(tokenizer, self.media_token)
            if self.model.media_token_id != media_id:
                self.model.set_media_token(media_id, grow_vocab=self.hparams.grow_vocab)
        vocab = self.model.decoder.vocab_size
        if tokenizer.vocab_size > vocab:
            raise ConfigError(
                f"PrefixLMTask: the tokenizer has {tokenizer.vocab_size} tokens but the LLM's "
                f"vocabulary (model.decoder.vocab_size) is {vocab}; raise it to at least "
                f"{tokenizer.vocab_size} (a from-scratch LLM: ${{tokenizer.vocab_size}}), or "
                f"set model.grow_vocab=true for added tokens.")
        self.tokenizer = tokenizer
        self._stop_id = None

    def text_context(self) -> dict[str, Any]:
        """What the data module renders items with besides the tokenizer
        (``datamodule.connect(tokenizer, **task.text_context())``)."""
        return {"chat_template": self.chat_template, "media_token": self.media_token}

    @property
    def stop_id(self) -> int:
        """Where generation stops: the template's end-of-turn token (``<|im_end|>``), else the
        tokenizer's eos."""
        if self._stop_id is None:
            tokenizer = self.require_tokenizer()
            turn_end = end_of_turn_id(self.chat_template, tokenizer)
            self._stop_id = tokenizer.eos_id if turn_end is None else turn_end
        return self._stop_id

    def connect_data(self, datamodule: Any) -> None:
        """The data fits the encoder and builds its ids with this task's tokenizer."""
        self.check_audio_limit(datamodule)
        self.check_data_tokenizer(datamodule)
        self.use_sources(getattr(datamodule, "source_names", ()))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        # Beside the tokenizer: a checkpoint renders prompts without the LLM folder.
        checkpoint["mmtf"]["chat_template"] = self.chat_template.to_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        stored = (checkpoint.get("mmtf") or {}).get("chat_template")
        if stored is not None:
            self._chat_template, self._stop_id = ChatTemplate.from_dict(stored), None
        if self.tokenizer is not None and (checkpoint.get("mmtf") or {}).get("tokenizer"):
            from mmtf.tasks.resolve import stored_tokenizer

            if stored_tokenizer(checkpoint) != self.tokenizer:
                raise CheckpointError(
                    "the checkpoint's tokenizer differs from the one this task (and its data) "
                    "were given; resume with python -m mmtf.train ckpt_path=<it> (which takes "
                    "the checkpoint's tokenizer).")

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
        n = batch["input_ids"].shape[0]
        self.log(f"{split}/loss", self(batch).loss, prog_bar=True, sync_dist=True,
                 batch_size=n)
        if split == "val" and (not self.hparams.val_generate or self.trainer.sanity_checking):
            return
        if "prompt_ids" not in batch:
            return
        replies = self.generate_texts(batch["media"], batch.get("media_mask"),
                                      batch["prompt_ids"], batch.get("prompt_mask"))
        self.score_replies(batch, replies, split)

    def score_replies(self, batch: Mapping[str, Any], replies: list[str], split: str) -> None:
        """Add a batch's generated replies to ``split``'s metrics: captions with
        ``references``, questions with ``choices`` (the shown order), ``answer``,
        ``question_type`` and ``rotation``."""
        ids = [str(i) for i in batch["ids"]]
        # The chat collate gives every row references and, when any row is a question, the
        # question keys (None on the other rows): a question is scored by its choices, never as
        # a caption of its answer, and a mixture may hold both kinds in one batch.
        choices = batch.get("choices") or [None] * len(ids)
        questions = [i for i, c in enumerate(choices) if c is not None]
        captions = [i for i, c in enumerate(choices) if c is None]
        if captions and "references" not in batch:
            raise ConfigError(f"PrefixLMTask: a {split} batch with prompt_ids has neither "
                              f"'references' (captions) nor 'choices' (questions) to score "
                              f"against (keys: {sorted(batch)}).")
        if captions:
            refs, sources = batch["references"], list(batch.get("sources") or ())
            self.caption_metrics[split].update([replies[i] for i in captions],
                                               [refs[i] for i in captions],
                                               keys=[ids[i] for i in captions])
            for name, metrics in self.source_metrics[split].items():     # a mixture: per source
                rows = [i for i in captions if i < len(sources) and sources[i] == name]
                if rows:
                    metrics.update([replies[i] for i in rows], [refs[i] for i in rows],
                                   keys=[ids[i] for i in rows])
        rotations = batch.get("rotation") or [0] * len(ids)
        for i in questions:
            self.qa_rows[split].append({
                "id": ids[i], "rotation": int(rotations[i] or 0), "reply": replies[i],
                "choices": list(choices[i]), "answer": batch["answer"][i],
                "question_type": str(batch["question_type"][i])})

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    # ------------------------------------------------------------------ scores
    def on_validation_epoch_end(self) -> None:
        self._score_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._score_epoch("test")

    def _score_epoch(self, split: str) -> None:
        if len(self.caption_metrics[split]):
            self._score(split)              # the captioner's scoring and sample logging
        else:
            self.caption_metrics[split].reset()
        rows, self.qa_rows[split] = self.qa_rows[split], []
        if self.trainer.sanity_checking or (split == "val" and not self.hparams.val_generate):
            return
        rows = _gathered(rows)              # collective under DDP; every rank scores alike
        if rows:
            self._score_questions(split, rows)

    def _score_questions(self, split: str, rows: list[dict[str, Any]]) -> None:
        """Shuffle-robust accuracy (:class:`~mmtf.metrics.aqa.AQAAccuracy`) of the epoch's
        replies, overall and per question type, logged as ``<split>/<score>`` and
        ``<split>/<type>/<score>``; the confusion by question type is printed and kept in
        ``last_qa_scores``."""
        from mmtf.metrics.aqa import AQAAccuracy, confusion_table

        items: dict[str, dict[str, Any]] = {}
        for row in rows:
            n, r = len(row["choices"]), row["rotation"]
            # The choices as written (rotation 0): option i was shown at (i + r) % n.
            items.setdefault(row["id"], {
                "id": row["id"], "question_type": row["question_type"],
                "choices": [row["choices"][(i + r) % n] for i in range(n)],
                "answer": row["answer"]})
        k = max(row["rotation"] for row in rows) + 1
        metric = AQAAccuracy(list(items.values()), rotations=k)
        metric.update([r["id"] for r in rows], [r["rotation"] for r in rows],
                      [r["reply"] for r in rows], [r["answer"] for r in rows])
        scores, confusion = metric.compute(), metric.confusion()
        for name, value in scores.items():
            self.log(f"{split}/{name}", float(value), rank_zero_only=False, sync_dist=False,
                     prog_bar=name == "mean_accuracy")
        self.last_qa_scores[split] = {"scores": scores, "confusion": confusion}
        self.last_predictions = {split: [
            {"id": r["id"], "prediction": r["reply"],
             "references": [f"rotation {r['rotation']}: {r['answer']}"]} for r in rows]}
        if self.global_rank == 0:
            log.info("%s confusion (rotations: %d):\n%s", split, k, confusion_table(confusion))

    # ------------------------------------------------------------------ generation
    def update_generation(self, overrides: dict[str, Any]) -> None:
        GenerationConfig.build(**{**self.generation, **overrides})
        self.generation.update(overrides)

    def generation_state(self) -> Any:
        return dict(self.generation)

    def restore_generation(self, state: Any) -> None:
        self.generation = dict(state)

    def generation_settings(self, **overrides: Any) -> dict[str, Any]:
        """The configured settings with ``overrides``; ids the tokenizer cannot decode (a
        from-scratch LLM sized above what its BPE learned) are never generated."""
        settings = {**self.generation, **overrides}
        if self.tokenizer is not None:
            extra = range(self.tokenizer.vocab_size, self.model.decoder.vocab_size)
            settings["suppress_tokens"] = tuple(sorted(
                {*settings.get("suppress_tokens", ()), *extra}))
        return settings

    @torch.no_grad()
    def generate(self, batch: Mapping[str, Any], **overrides: Any) -> GenerationOutput:
        """Answers to a batch of prompts (``input_ids`` ending in the generation prompt) with
        the configured generation settings, ``overrides`` on top."""
        eos = {} if self.tokenizer is None else {"eos_id": self.stop_id}
        return self.model.generate(batch["media"], batch.get("media_mask"), batch["input_ids"],
                                   batch.get("attention_mask"), **eos,
                                   **self.generation_settings(**overrides))

    @torch.no_grad()
    def generate_texts(self, media: Tensor, media_mask: Tensor | None, prompt_ids: Tensor,
                       prompt_mask: Tensor | None = None) -> list[str]:
        """The decoded replies to left-padded prompts (b, p): the continuation only, cut at
        the end of the turn, special tokens dropped."""
        out = self.generate({"media": media, "media_mask": media_mask, "input_ids": prompt_ids,
                             "attention_mask": prompt_mask})
        return [self.decode(row) for row in out.best().tokens.tolist()]

    def decode(self, ids: Sequence[int]) -> str:
        """Generated ids as text: cut at the first stop id, special tokens dropped."""
        ids = list(ids)
        stop = self.stop_id
        ids = ids[:ids.index(stop)] if stop in ids else ids
        return self.require_tokenizer().decode(ids, skip_special=True)

    def encode_prompts(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """User turns (each with the media placeholder) as left-padded prompt ids (b, p) and
        mask (b, p), rendered with the chat template and its generation prompt.

        Raises:
            UserError: a text without the media placeholder.
        """
        tokenizer = self.require_tokenizer()
        rows = []
        for i, text in enumerate(texts):
            if self.media_token not in text:
                raise UserError(f"PrefixLMTask: prompt {i} ({text[:40]!r}) has no media "
                                f"placeholder {self.media_token}; put it where the media goes, "
                                f"e.g. \"{self.media_token}\\n{text}\".")
            rendered = self.chat_template.render([{"role": "user", "content": text}],
                                                 add_generation_prompt=True)
            rows.append(encode_rendered(backend_of(tokenizer), rendered).ids)
        width = max(len(r) for r in rows)
        pad = self.model.pad_id
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
        mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
        device = self.model.decoder.embed.weight.device
        return ids.to(device), mask.to(device)                             # (b, p) each

    def instruction(self) -> str:
        """The caption instruction of the run (``data.instruction``), else a default."""
        data = (self.run_config or {}).get("data") or {}
        return data.get("instruction") or DEFAULT_INSTRUCTIONS[self.modality]

    def predict_batch(self, inputs: Tensor, lengths: Tensor | None) -> list[dict[str, Any]]:
        """``{"caption": str}`` per input (the run's instruction), or ``{"answer": str}`` for
        the questions :meth:`set_questions` gave (consumed by this call)."""
        questions, self._questions = self._questions, None
        b = inputs.shape[0]
        texts = questions or [self.instruction()] * b
        if len(texts) != b:
            raise UserError(f"answer: {len(texts)} questions for {b} inputs; give one each.")
        media_mask = None
        if lengths is not None:
            media_mask = torch.arange(inputs.shape[1], device=inputs.device)[None] < \
                lengths[:, None]                                              # (b, samples)
        ids, mask = self.encode_prompts([user_turn(t, self.media_token) if questions is None
                                         else t for t in texts])
        replies = self.generate_texts(inputs, media_mask, ids, mask)
        key = "caption" if questions is None else "answer"
        return [{key: r} for r in replies]

    def set_questions(self, questions: Sequence[str]) -> None:
        """The user turns the next :meth:`predict_batch` answers (one per input)."""
        self._questions = list(questions)

    def generate_captions(self, inputs: Tensor, lengths: Tensor | None) -> list[str]:
        """Captions with the run's instruction (what ``mmtf.load(ckpt).caption`` calls)."""
        return [row["caption"] for row in self.predict_batch(inputs, lengths)]


def _gathered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's rows (plain data) under DDP, else ``rows``."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return rows
    parts: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(parts, rows)
    return [row for part in parts for row in part]


__all__ = ["PrefixFinetuning", "PrefixLMTask", "user_turn"]
