"""Contrastive audio-text (or image-text) pretraining: a media encoder and a text tower mapped
into one embedding space (CLIP / CLAP), trained with :class:`mmtf.losses.ContrastiveLoss`,
validated by retrieval over the whole validation set, usable zero-shot as a classifier.

Media side: any mmtf encoder, pooled over its valid positions (masked mean, CLS or attention
pooling), then a projection head. Text side: any module with ``embed(ids, mask) -> (b, d)``
(mmtf's ``TextEncoder``), then a projection head (or none). Both embeddings are L2-normalised.
The guide: docs/guide/contrastive.md; the loss: docs/design/contrastive-loss.md.

Shapes: b items, k captions per item in training (``data.captions_per_item``), t captions of a
batch, n tokens, c encoder width, d text tower width, e = embed_dim.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmtf.encoders.text import encode_texts
from mmtf.errors import CheckpointError, ConfigError, UserError
from mmtf.losses import ContrastiveLoss, item_keys
from mmtf.metrics.retrieval import RetrievalMetrics
from mmtf.nn.heads import HeadKind, projection
from mmtf.nn.pooling import AttentionPool
from mmtf.tasks.base import Task, batch_inputs
from mmtf.tasks.captioning import finetuning_controls
from mmtf.tasks.resolve import stored_tokenizer
from mmtf.text import Tokenizer

__all__ = ["ContrastiveFinetuning", "ContrastiveTask", "ZeroShot"]

log = logging.getLogger("mmtf.tasks")

Pooling = Literal["mean", "cls", "attention"]


@dataclass(frozen=True)
class ContrastiveFinetuning:
    """The fine-tuning controls of a contrastive task (``model.finetuning``); see
    :meth:`Task.init_finetuning`. The heads, the attention pooling and the temperature are new
    layers: always trainable, at the optimizer's lr."""

    freeze_text_encoder: bool = False
    unfreeze_encoder_at_epoch: int | None = None
    unfreeze_text_encoder_at_epoch: int | None = None
    encoder_lr_scale: float = 1.0
    text_encoder_lr_scale: float = 1.0
    layer_decay: float | None = None


class ZeroShot(NamedTuple):
    """What :meth:`ContrastiveTask.zero_shot_classify` returns.

    Attributes:
        scores: (n, c) cosine similarity of each input to each label's prompt.
        predictions: (n,) long, the index of the best label.
        labels: the c label names, in the order of the columns.
    """

    scores: Tensor
    predictions: Tensor
    labels: list[str]


class ContrastiveTask(Task):
    """Dual encoder trained with the symmetric multi-positive InfoNCE over the global batch.

    Training batches are caption batches (``data.captions_per_item`` = k captions per item,
    item-major): every caption of an item is a positive of its clip. Validation and test embed
    every reference caption of every item and log ``<split>/text_to_<media>/R@k``,
    ``.../mAP@10``, ``.../mAP@16`` and ``<split>/<media>_to_text/...``
    (:class:`~mmtf.metrics.retrieval.RetrievalMetrics`), plus ``<split>/loss`` against the
    batch's own items.

    Its tokenizer is handed over (:meth:`use_tokenizer`) like a captioner's and saved in every
    checkpoint; the data module builds the training ids with the same one.

    Args:
        encoder: any mmtf encoder (``pretrained`` / ``freeze`` are its own arguments).
        text_encoder: the text tower: ``embed(ids (b, n) long, mask (b, n) bool) -> (b, d)``,
            with ``embed_dim`` (or ``dim``) = d; ``vocab_size`` and ``max_tokens`` are checked
            when it has them.
        optimizer: partial optimizer (Hydra ``_partial_: true``), called on parameter groups.
        embed_dim: e, the shared embedding width.
        pooling: media pooling: "mean" (over valid positions), "cls", or "attention" (a learned
            query, :class:`~mmtf.nn.pooling.AttentionPool` with ``pool_heads`` heads).
        head, head_hidden: the media projection ("linear" or "mlp" with ``head_hidden`` units).
        text_head: the text projection ("linear", "mlp" or "none": the tower's own width is e).
        temperature, max_logit_scale, learn_temperature, local_loss: of the loss
            (:class:`~mmtf.losses.ContrastiveLoss`).
        logit_scale_lr_scale: lr multiplier of the temperature, in its own parameter group
            without weight decay.
        weight_decay, warmup_steps, min_lr_ratio: :mod:`mmtf.tasks.optim`.
        finetuning: :class:`ContrastiveFinetuning` or its keys; None = all trainable.
        lora: LoRA adapters on ``encoder`` / ``text_encoder`` (:meth:`Task.init_lora`).
    """

    reads_text: ClassVar[bool] = True

    def __init__(self, *, encoder: nn.Module, text_encoder: nn.Module, optimizer: Callable,
                 embed_dim: int = 256, pooling: Pooling = "mean", pool_heads: int = 4,
                 head: HeadKind = "linear", head_hidden: int | None = None,
                 text_head: HeadKind = "linear", temperature: float = 0.07,
                 max_logit_scale: float = 100.0, learn_temperature: bool = True,
                 logit_scale_lr_scale: float = 1.0, local_loss: bool = False,
                 weight_decay: float = 0.05, warmup_steps: int = 100,
                 min_lr_ratio: float = 0.05,
                 finetuning: ContrastiveFinetuning | Mapping[str, Any] | None = None,
                 lora: dict[str, Any] | None = None) -> None:
        super().__init__()
        if pooling not in ("mean", "cls", "attention"):
            raise ConfigError(f"ContrastiveTask: model.pooling ({pooling!r}) must be 'mean', "
                              f"'cls' or 'attention'.")
        if pooling == "cls" and not getattr(encoder, "has_cls", False):
            raise ConfigError(f"ContrastiveTask: model.pooling=cls but the encoder "
                              f"({type(encoder).__name__}) has no CLS token; use pooling=mean "
                              f"or attention, or build the encoder with cls_token=true.")
        if head == "none":
            raise ConfigError("ContrastiveTask: model.head must be 'linear' or 'mlp' (the media "
                              "side needs a projection into the shared space).")
        text_dim = getattr(text_encoder, "embed_dim", None) or getattr(text_encoder, "dim", None)
        if not callable(getattr(text_encoder, "embed", None)) or not isinstance(text_dim, int):
            raise ConfigError(f"ContrastiveTask: model.text_encoder ({type(text_encoder).__name__})"
                              f" must have embed(ids, mask) -> (batch, dim) and an int embed_dim "
                              f"or dim; use mmtf.encoders.TextEncoder.")
        self.save_hyperparameters(ignore=["encoder", "text_encoder", "optimizer"])
        self.encoder, self.text_encoder, self.optimizer = encoder, text_encoder, optimizer
        self.pooler = (AttentionPool(dim=encoder.dim, num_heads=pool_heads)
                       if pooling == "attention" else None)
        self.media_head = projection(head, encoder.dim, embed_dim, head_hidden,
                                     owner="ContrastiveTask", key="model.head",
                                     out_key="model.embed_dim")
        self.text_head = projection(text_head, text_dim, embed_dim, head_hidden,
                                    owner="ContrastiveTask", key="model.text_head",
                                    out_key="model.embed_dim")
        self.contrastive = ContrastiveLoss(temperature=temperature, max_scale=max_logit_scale,
                                           learn_temperature=learn_temperature,
                                           local_loss=local_loss)
        self.retrieval = nn.ModuleDict({split: RetrievalMetrics(media=self.modality)
                                        for split in ("val", "test")})
        self.max_text_tokens: int | None = getattr(text_encoder, "max_tokens", None)
        self.init_lora(lora)
        ft = finetuning_controls(finetuning, ContrastiveFinetuning)
        self.finetuning_key = "model.finetuning"
        self.init_finetuning(
            freeze={"text_encoder": ft.freeze_text_encoder},
            unfreeze_at={"encoder": ft.unfreeze_encoder_at_epoch,
                         "text_encoder": ft.unfreeze_text_encoder_at_epoch},
            lr_scale={"encoder": ft.encoder_lr_scale,
                      "text_encoder": ft.text_encoder_lr_scale},
            layer_decay=ft.layer_decay)

    def export_parts(self) -> dict[str, nn.Module]:
        return {"encoder": self.encoder, "text_encoder": self.text_encoder}

    # ------------------------------------------------------------------ tokenizer and data
    def use_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Adopt ``tokenizer``: its ids must fit the text tower's vocabulary."""
        vocab = getattr(self.text_encoder, "vocab_size", None)
        if vocab is not None and tokenizer.vocab_size > vocab:
            raise ConfigError(f"ContrastiveTask: the tokenizer has {tokenizer.vocab_size} tokens "
                              f"but model.text_encoder.vocab_size is {vocab}; raise "
                              f"model.text_encoder.vocab_size to at least {tokenizer.vocab_size}.")
        self.tokenizer = tokenizer

    def tokenizer_spec(self, spec: dict[str, Any] | None) -> dict[str, Any] | None:
        """The tokenizer of a text tower read from a folder (``model.text_encoder.pretrained``
        with a tokenizer) wins: its weights know only those ids. A tokenizer the run would train
        (bpe, char: the caption data's default) is replaced by it; one read from elsewhere
        (pretrained, saved) must equal it.

        Raises:
            ConfigError: the configured tokenizer is read from elsewhere and differs.
        """
        tower = self.text_tower_tokenizer()
        if tower is None:
            return spec
        from mmtf.text.build import build_tokenizer, trains  # a run's start only

        if spec is None or trains(spec):
            log.info("[tokenizer] the text tower's own, from %s (model.text_encoder.pretrained)"
                     "; the configured tokenizer (kind: %s) is not trained", tower["path"],
                     None if spec is None else spec.get("kind", "bpe"))
            return tower
        if build_tokenizer(dict(spec), lambda: []) != build_tokenizer(tower, lambda: []):
            raise ConfigError(
                f"tokenizer (kind: {spec.get('kind')}, path: {spec.get('path')}) differs from "
                f"the tokenizer of model.text_encoder.pretrained ({tower['path']}), the only "
                f"ids its weights know; remove the tokenizer override (the tower's is used) or "
                f"set tokenizer={tower['kind']} tokenizer.path={tower['path']}.")
        return spec

    def text_tower_tokenizer(self) -> dict[str, Any] | None:
        """The ``tokenizer`` node of the text tower's pretrained weights (the run's
        ``model.text_encoder.pretrained``): a Hugging Face folder's own (a sentence-transformers
        one's model folder), or the ``tokenizer.json`` an mmtf export saved beside the weights;
        None for a tower trained from scratch or an export without one."""
        from mmtf.hub import EXPORT_TOKENIZER, is_export, resolve_source  # a run's start only

        model = (self.run_config or {}).get("model") or {}
        source = (model.get("text_encoder") or {}).get("pretrained")
        if not source:
            return None
        if is_export(source):
            folder = Path(source).expanduser()
            folder = folder.parent if folder.suffix == ".safetensors" else folder
            saved = folder / EXPORT_TOKENIZER
            return {"kind": "saved", "path": str(saved)} if saved.is_file() else None
        from mmtf.pretrained.bert import folder_settings

        folder = folder_settings(resolve_source(source, owner="model.text_encoder.pretrained"))
        return {"kind": "pretrained", "path": str(folder.model_folder), "prompt": None}

    def connect_data(self, datamodule: Any) -> None:
        """The data's audio length and caption length fit the towers, its ids come from this
        task's tokenizer (validation embeds the references with it too), and a global batch
        holds two items at least."""
        self.check_audio_limit(datamodule)
        limit = getattr(self.text_encoder, "max_tokens", None)
        tokens = datamodule.max_caption_tokens
        if limit is not None and tokens > limit:
            raise ConfigError(f"data.max_caption_tokens ({tokens}) exceeds what the text encoder "
                              f"reads ({limit} tokens); set data.max_caption_tokens <= {limit}.")
        self.check_data_tokenizer(datamodule)
        self.max_text_tokens = tokens
        trainer = self.attached_trainer()
        ranks = trainer.world_size if trainer is not None else 1
        size = getattr(datamodule, "batch_size", None)
        if isinstance(size, int) and size * ranks < 2:
            raise ConfigError(f"data.batches.batch_size={size} on {ranks} rank(s): a global batch "
                              f"of one item has no negative to contrast with (each clip's "
                              f"negatives are the other clips of the batch); set "
                              f"data.batches.batch_size >= 2.")

    def encode_texts(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Token ids (t, n) and mask (t, n) bool of ``texts`` (as the data module builds its ids:
        the tokenizer's specials, cut to ``max_text_tokens``), on the task's device."""
        return encode_texts(self.require_tokenizer(), texts, max_len=self.max_text_tokens,
                            device=self.device)

    # ------------------------------------------------------------------ embeddings
    def embed_media(self, inputs: Tensor, lengths: Tensor | None = None) -> Tensor:
        """L2-normalised media embeddings (b, e) of waveforms (b, samples) + lengths or images."""
        out = self.encoder(inputs, lengths)
        if self.pooler is not None:
            pooled = self.pooler(out.memory, out.mask)                             # (b, c)
        else:
            pooled = self.encoder.pool(out, mode=self.hparams.pooling)             # (b, c)
        return F.normalize(self.media_head(pooled), dim=-1)

    def embed_text(self, ids: Tensor, mask: Tensor) -> Tensor:
        """L2-normalised caption embeddings (t, e) of ids (t, n) and their mask (t, n)."""
        return F.normalize(self.text_head(self.text_encoder.embed(ids, mask)), dim=-1)

    @torch.no_grad()
    def embed_texts(self, texts: Sequence[str], *, batch_size: int = 64) -> Tensor:
        """L2-normalised embeddings (t, e) of strings, in eval mode, ``batch_size`` at a time."""
        if batch_size < 1:
            raise UserError(f"embed_texts: batch_size ({batch_size}) must be >= 1.")
        texts = list(texts)
        was_training = self.training
        self.eval()
        try:
            out = [self.embed_text(*self.encode_texts(texts[i:i + batch_size]))
                   for i in range(0, len(texts), batch_size)]
        finally:
            self.train(was_training)
        e = self.hparams.embed_dim
        return torch.cat(out) if out else torch.zeros(0, e, device=self.device)

    def forward(self, inputs: Tensor, lengths: Tensor | None, ids: Tensor, mask: Tensor,
                ) -> tuple[Tensor, Tensor]:
        """Media (b, e) and caption (t, e) embeddings."""
        return self.embed_media(inputs, lengths), self.embed_text(ids, mask)

    @torch.no_grad()
    def zero_shot_classify(self, media_emb: Tensor, label_texts: Sequence[str],
                           template: str = "the sound of a {label}") -> ZeroShot:
        """Classify media embeddings by their similarity to each label's prompt.

        Args:
            media_emb: (n, e) from :meth:`embed_media`.
            label_texts: the c class names; each fills ``template``'s ``{label}``.

        Raises:
            UserError: no labels, or a template without ``{label}`` (or with other fields).
        """
        labels = [str(label) for label in label_texts]
        if not labels:
            raise UserError("zero_shot_classify: label_texts is empty; pass the class names.")
        try:
            prompts = [template.format(label=label) for label in labels]
        except (KeyError, IndexError, ValueError) as err:
            raise UserError(f"zero_shot_classify: template {template!r} must have one {{label}} "
                            f"field and no other ({err!r}).") from None
        if "{label}" not in template:
            raise UserError(f"zero_shot_classify: template {template!r} has no {{label}}; e.g. "
                            f"'the sound of a {{label}}'.")
        text = self.embed_texts(prompts)                                           # (c, e)
        scores = F.normalize(media_emb.to(text), dim=-1) @ text.T                  # (n, c)
        return ZeroShot(scores, scores.argmax(dim=-1), labels)

    # ------------------------------------------------------------------ training
    def configure_optimizers(self) -> dict[str, Any]:
        from mmtf.tasks.optim import PartOptim, configure_adamw_cosine  # training only

        hp = self.hparams
        if not hp.logit_scale_lr_scale > 0:
            raise UserError(f"model.logit_scale_lr_scale ({hp.logit_scale_lr_scale}) must be > 0;"
                            f" set model.learn_temperature=false to keep the temperature fixed.")
        parts = {**self.optim_parts(),
                 "logit_scale": PartOptim(self.contrastive, hp.logit_scale_lr_scale,
                                          own_group=True)}
        return configure_adamw_cosine(self.optimizer, [self], weight_decay=hp.weight_decay,
                                      warmup_steps=hp.warmup_steps, min_lr_ratio=hp.min_lr_ratio,
                                      total_steps=int(self.trainer.estimated_stepping_batches),
                                      parts=parts, layer_decay=self.layer_decay)

    def batch_keys(self, batch: dict[str, Any], captions: int) -> tuple[Tensor, Tensor]:
        """Item keys of the media rows (b,) and of ``captions`` caption rows laid out
        item-major, the same number per item."""
        keys = item_keys(batch["ids"]).to(self.device)                            # (b,)
        if captions % keys.numel():
            raise ValueError(f"ContrastiveTask: {captions} caption rows for {keys.numel()} "
                             f"items; the collate lays out k captions per item, item-major.")
        return keys, keys.repeat_interleave(captions // keys.numel())             # (b * k,)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        if "mix_lambda" in batch:
            raise UserError("data.augment.mixup mixes two clips under one caption, which has no "
                            "single positive in a contrastive loss; remove data.augment.mixup.")
        inputs, lengths = batch_inputs(batch)
        tokens = batch["tokens"]                                                  # (b * k, n)
        mask = torch.arange(tokens.shape[1], device=tokens.device) < batch["token_lengths"][:, None]
        media, text = self(inputs, lengths, tokens, mask)
        keys, text_keys = self.batch_keys(batch, tokens.shape[0])
        loss = self.contrastive(media, text, keys, text_keys)
        b = inputs.shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=b)
        self.log("train/logit_scale", self.contrastive.scale().detach(), batch_size=b)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.contrastive.clamp_()          # after the optimizer step (idempotent between steps)

    # ------------------------------------------------------------------ evaluation
    def _eval_step(self, batch: dict[str, Any], split: str) -> None:
        inputs, lengths = batch_inputs(batch)
        media = self.embed_media(inputs, lengths)                                 # (b, e)
        counts = [len(refs) for refs in batch["references"]]
        texts = [caption for refs in batch["references"] for caption in refs]
        text = self.embed_text(*self.encode_texts(texts))                         # (t, e)
        keys = item_keys(batch["ids"]).to(self.device)
        repeats = torch.tensor(counts, device=self.device)
        text_keys = keys.repeat_interleave(repeats)                               # (t,)
        slots = torch.cat([torch.arange(c) for c in counts]).to(self.device)      # (t,)
        groups = self.relevance_keys(batch["ids"], batch["references"])
        if groups is None:                    # relevant = the item the caption was written for
            self.retrieval[split].update(media, keys, text, text_keys, slots)
        else:
            groups = groups.to(self.device)                                       # (b,)
            self.retrieval[split].update(media, keys, text, text_keys, slots, groups,
                                         groups.repeat_interleave(repeats))
        if torch.unique(keys).numel() > 1:   # a last batch of one item has no negative
            loss = self.contrastive(media, text, keys, text_keys, gather=False)
            self.log(f"{split}/loss", loss, sync_dist=True, batch_size=inputs.shape[0])

    def relevance_keys(self, ids: Sequence[Any], references: Sequence[Sequence[str]],
                       ) -> Tensor | None:
        """One relevance key (b,) per item: items with equal keys are relevant to each other's
        captions in the retrieval metrics. None (real data): each caption's own item only.

        On a built-in set (``data.synthetic.kind``), whose paraphrased captions repeat across
        clips, the key is the event sequence its captions parse back to (exact: every generated
        caption parses to its clip's sequence); an item whose captions do not parse keeps its
        own id. Why: docs/guide/contrastive.md#what-relevant-means"""
        parser = self.event_parser()
        if parser is None:
            return None
        groups = []
        for item_id, refs in zip(ids, references):
            sequence = next((seq for seq in map(parser, refs) if seq is not None), None)
            groups.append(f"id:{item_id}" if sequence is None else f"events:{sequence!r}")
        return item_keys(groups)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_validation_epoch_end(self) -> None:
        self._score("val")

    def on_test_epoch_end(self) -> None:
        self._score("test")

    def _score(self, split: str) -> None:
        metric = self.retrieval[split]
        if self.trainer.sanity_checking:
            metric.reset()
            return
        scores = metric.compute()        # collective: every rank's embeddings, scored once each
        metric.reset()
        main = f"text_to_{self.modality}/mAP@10"
        for name, value in scores.items():
            # Every rank holds the same score: log without a second reduction.
            self.log(f"{split}/{name}", float(value), prog_bar=name == main,
                     rank_zero_only=False, sync_dist=False)

    @torch.no_grad()
    def predict_batch(self, inputs: Tensor, lengths: Tensor | None) -> list[dict[str, Any]]:
        """``{"embedding": [e floats]}`` per input: its L2-normalised media embedding."""
        return [{"embedding": row} for row in self.embed_media(inputs, lengths).tolist()]

    # ------------------------------------------------------------------ checkpoints
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Only checks: another tokenizer would give the text tower other ids for the same words.
        super().on_load_checkpoint(checkpoint)
        stored = stored_tokenizer(checkpoint)
        if stored is not None and self.tokenizer is not None and stored != self.tokenizer:
            raise CheckpointError(
                "the checkpoint's tokenizer differs from the one this task (and its data) were "
                "given; resume with python -m mmtf.train ckpt_path=<it> (which takes the "
                "checkpoint's tokenizer), or load it with mmtf.tasks.build_task.")
