"""LightningDataModules for captioning and classification, over any supported format.

One code path for built-in and real data: :mod:`mmtf.synthetic`'s ``prepare_data`` writes a
built-in set to ``root`` in its real layout, read then by the same format reader as a download.

Pipeline per split: format reader (index -> items) -> :func:`~mmtf.data.datasets.probe` (header
checks, durations) -> dataset (decode, crop, transform, tokens) -> :class:`BucketBatchSampler`
-> :class:`~mmtf.data.collate.Collate` -> :class:`~mmtf.data.loader.DataLoader` (skip counts,
padding stats; for training the resumable :class:`~mmtf.data.loader.StatefulDataLoader`, whose
position Lightning checkpoints mid-epoch). Problems are raised or, with ``on_error=skip``, counted in
``datamodule.error_counts`` and logged at setup and at the end of every epoch.

Shapes: see :mod:`mmtf.data.collate` for the batch dict.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import lightning as L

from mmtf.data.augment import build_augment
from mmtf.data.chat import chat_texts, encode_items, question_fields
from mmtf.data.collate import Collate
from mmtf.data.datasets import CaptionDataset, LabelDataset, QADataset, probe
from mmtf.data.errors import ErrorCounter, ErrorPolicy
from mmtf.data.formats import CAPTION_FORMATS, LABEL_FORMATS, QA_FORMATS, SPLITS, CaptionItem
from mmtf.data.formats.instruction import media_token as media_token_for
from mmtf.data.image import build_transform, header_sizes, transformed_pixels
from mmtf.data.loader import DataLoader, StatefulDataLoader, make_loader
from mmtf.data.sampler import BucketBatchSampler, padding_fraction
from mmtf.errors import ConfigError, DataError, UserError
from mmtf.text import Tokenizer
from mmtf.text.base import BackedTokenizer
from mmtf.text.chat import ChatTemplate
from mmtf.text.prompt import JOBS, Prompt, prompt_for
from mmtf.utils.parts import as_part, moved_keys

log = logging.getLogger("mmtf.data")

_STAGE_SPLITS = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",),
                 "predict": ("test",), None: SPLITS}


def to_plain(x: Any) -> Any:
    """DictConfig/ListConfig -> dict/list (when Hydra's _convert_ was not set)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    return OmegaConf.to_container(x, resolve=True) if isinstance(x, DictConfig | ListConfig) else x


@dataclass(frozen=True)
class BatchOptions:
    """How the splits are cut into batches (``data.batches``; a mixture's, not its sources').

    Args:
        batch_size, max_seconds_per_batch, max_pixels_per_batch: training batches of this many
            examples, or cut by padded size (examples x the longest clip / largest image <=
            this; docs/design/duration-batching.md); exactly one of them is set.
        eval_*: the val/test counterparts; val/test use the first set of: the eval budgets,
            ``eval_batch_size``, ``batch_size`` (read when the loader is built), the training
            budget.
        bucketing, bucket_size: batch similar lengths together, in pools of this many
            batches. drop_last: drop the last incomplete training batch.
    """

    batch_size: int | None = 32
    eval_batch_size: int | None = None
    max_seconds_per_batch: float | None = None
    max_pixels_per_batch: float | None = None
    eval_max_seconds_per_batch: float | None = None
    eval_max_pixels_per_batch: float | None = None
    bucketing: bool = True
    bucket_size: int = 50
    drop_last: bool = False


@dataclass(frozen=True)
class LoaderOptions:
    """The DataLoader's processes and memory (``data.loader``; a mixture's, not its sources').

    Args:
        pin_memory: pin batches in page-locked memory; None = when the trainer's device is
            CUDA (Lightning then copies them with ``non_blocking=True``).
        persistent_workers: keep workers between epochs (only with ``num_workers > 0``).
    """

    num_workers: int = 0
    pin_memory: bool | None = None
    persistent_workers: bool = False


class MediaDataModule(L.LightningDataModule):
    """What captioning and classification share: reading, probing, batching, reporting.

    Args:
        format: the index format (see the subclasses).
        root: the dataset folder (relative paths resolve against the working directory).
        modality: ``audio`` | ``image``; fixed by the format except for ``manifest``.
        splits: our split -> the format's split name (e.g. COCO ``{train: train2017, ...}``).
        sample_rate, max_seconds: audio is resampled to this rate (Hz); longer audio is cropped.
        crop: ``{train: random | start, eval: full | center | start}`` (defaults: random,
            full); speech trains on ``start`` (its transcript follows the audio's start).
        channels: required audio channel count; None accepts any and mixes to mono.
        transforms: ``{train: [...], eval: [...]}`` image transforms (``transforms.v2`` lists).
        batches, loader: :class:`BatchOptions` and :class:`LoaderOptions` (or mappings of fields).
        seed: shuffling, caption sampling and random crops are functions of it and the epoch.
        on_error: ``raise`` at the first bad file/row, or ``skip`` and count.
        media_cache_mb: MiB of decoded media kept per split and process (same bits; not
            MP3/Vorbis/Opus); 0 = off. With workers, set ``loader.persistent_workers``.
        augment: audio training only: ``{speed, noise, gain, mixup}``
            (:mod:`mmtf.data.augment`); None = off.
    """

    targets = "label"      # what items are labelled with: "caption" | "label"

    def __init__(self, *, format: str, root: str, modality: str | None = None,
                 splits: Mapping[str, str] | None = None, sample_rate: int = 16000,
                 max_seconds: float | None = None, crop: Mapping[str, str] | None = None,
                 channels: int | None = None,
                 transforms: Mapping[str, Sequence[Any] | None] | None = None,
                 batches: BatchOptions | Mapping[str, Any] | None = None,
                 loader: LoaderOptions | Mapping[str, Any] | None = None, seed: int = 0,
                 on_error: Literal["raise", "skip"] = "raise", media_cache_mb: float = 0,
                 augment: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        batches, loader = as_part(BatchOptions, batches), as_part(LoaderOptions, loader)
        formats = self._formats()
        if format not in formats:
            raise UserError(f"{type(self).__name__}: format ({format!r}) must be one of "
                             f"{sorted(formats)}; set data.format.")
        fixed = formats[format][1]
        modality = modality or fixed
        if fixed and modality != fixed:
            raise UserError(f"{type(self).__name__}: modality ({modality!r}) must be {fixed!r} "
                             f"for format {format!r}; remove data.modality.")
        if modality not in ("audio", "image"):
            raise UserError(f"{type(self).__name__}: modality ({modality!r}) must be 'audio' "
                             f"or 'image'; set data.modality.")
        crop = {"train": "random", "eval": "full", **(to_plain(crop) or {})}
        if set(crop) != {"train", "eval"} or crop["train"] not in ("random", "start") or \
                crop["eval"] not in ("full", "center", "start"):
            raise UserError(f"data.crop ({crop}) must be {{train: random | start, eval: full | "
                            f"center | start}}; fix data.crop.")
        self.train_crop, eval_crop = crop["train"], crop["eval"]
        if max_seconds is not None and max_seconds <= 0:
            raise UserError(f"max_seconds ({max_seconds}) must be > 0, or null for no limit.")
        self.budget, self.eval_budget = _budgets(modality, batches)
        if loader.num_workers < 0:
            raise UserError(f"num_workers ({loader.num_workers}) must be >= 0; fix "
                            f"data.loader.num_workers.")
        if media_cache_mb < 0:
            raise UserError(f"{type(self).__name__}: media_cache_mb ({media_cache_mb}) must be "
                             f">= 0 (MiB per split; 0 = off); fix data.media_cache_mb.")
        self.cache_bytes = int(media_cache_mb * 2 ** 20)
        self.augment, self.mixup = build_augment(
            to_plain(augment), sample_rate=sample_rate, max_seconds=max_seconds, seed=seed,
            targets=self.targets)
        if modality != "audio" and (self.augment or self.mixup):
            raise ConfigError(f"data.augment is for audio; this data is {modality} (image "
                              f"augmentation: data.transforms.train); remove data.augment.")
        self.format, self.modality = format, modality
        self.root = Path(root).expanduser().resolve()
        self.splits = dict(to_plain(splits)) if splits else None
        self.sample_rate, self.max_seconds, self.eval_crop = sample_rate, max_seconds, eval_crop
        self.channels = channels
        transforms = dict(transforms or {})
        if set(transforms) - {"train", "eval"}:
            raise UserError(f"data.transforms has {sorted(transforms)}; it takes train and eval "
                            f"(lists of image transforms); fix data.transforms.")
        self.train_transforms, self.eval_transforms = transforms.get("train"), transforms.get("eval")
        # Attributes, not the parts: mmtf.evaluate sets batch_size on a built module.
        self.batch_size, self.eval_batch_size = batches.batch_size, batches.eval_batch_size
        self.bucketing, self.bucket_size = batches.bucketing, batches.bucket_size
        self.drop_last = batches.drop_last
        self.num_workers, self.pin_memory = loader.num_workers, loader.pin_memory
        self.persistent_workers = loader.persistent_workers and loader.num_workers > 0
        if self.cache_bytes and loader.num_workers > 0 and not loader.persistent_workers:
            log.warning("[data] data.media_cache_mb=%g with data.loader.num_workers=%d and "
                        "data.loader.persistent_workers=false: each epoch's new workers start "
                        "with an empty cache, so it only costs memory; set "
                        "data.loader.persistent_workers=true (or data.media_cache_mb=0)",
                        media_cache_mb, loader.num_workers)
        self.seed, self.on_error = seed, on_error
        self.error_counts = ErrorCounter()
        self.policy = ErrorPolicy(on_error, self.error_counts)
        self._items: dict[str, list] = {}
        self._durations: dict[str, list[float]] = {}
        self._loaders: dict[str, DataLoader] = {}

    # ------------------------------------------------------------------ reading
    def _formats(self) -> Mapping[str, tuple[Any, str | None]]:
        """The formats this module reads: name -> (reader, the modality it fixes or None)."""
        return CAPTION_FORMATS if self.targets == "caption" else LABEL_FORMATS

    def prepare_data(self) -> None:
        """Nothing to prepare for data on disk; the built-in sets generate themselves here
        (:mod:`mmtf.synthetic`). Lightning calls it on one process, :meth:`items` before reading."""

    def _reader_kwargs(self) -> dict[str, Any]:
        return {"splits": self.splits} if self.splits else {}

    def _read(self, split: str) -> list:
        reader = self._formats()[self.format][0]
        return reader(self.root, split, report=self.policy, **self._reader_kwargs())

    def items(self, split: str) -> list:
        """The usable items of a split (read and probed on first call)."""
        if split not in SPLITS:
            raise UserError(f"split ({split!r}) must be one of {SPLITS}.")
        if split not in self._items:
            self.prepare_data()  # a built-in set: generated unless already there
            before = self.error_counts.total
            raw = self._read(split)
            kept, durations = self._probe(raw)
            self._items[split], self._durations[split] = kept, durations
            problems = self.error_counts.total - before
            log.info("[data] %s %s: %d items from %s%s", self.format, split, len(kept),
                     self.root, f" ({problems} problem(s) skipped)" if problems else "")
            if problems:
                log.warning("[data] %s %s: %s", self.format, split, self.error_counts.summary())
        return self._items[split]

    def _probe(self, raw: list) -> tuple[list, list[float]]:
        """The good items of ``raw`` and their durations (:func:`probe`: header checks)."""
        return probe(raw, modality=self.modality, policy=self.policy, channels=self.channels)

    def durations(self, split: str) -> list[float]:
        """Seconds of each usable item of a split (audio; 1.0 for images), read as by :meth:`items`."""
        self.items(split)
        return self._durations[split]

    def setup(self, stage: str | None = None) -> None:
        """Read the splits ``stage`` needs (``fit``: train + val, ``test``: test, ...)."""
        for split in _STAGE_SPLITS.get(stage, SPLITS):
            self.items(split)

    # ------------------------------------------------------------------ loading
    def _dataset(self, split: str, crop: str) -> Any:
        raise NotImplementedError

    def _num_captions(self, split: str) -> list[int] | None:
        return None

    def _policy(self, split: str) -> str:
        return "first"

    def _transform(self, split: str) -> Any:
        if self.modality != "image":
            return None
        return build_transform(self.train_transforms if split == "train"
                               else self.eval_transforms)

    def _media_kwargs(self, split: str, crop: str) -> dict[str, Any]:
        return dict(modality=self.modality, sample_rate=self.sample_rate,
                    max_seconds=self.max_seconds, crop=crop, channels=self.channels,
                    transform=self._transform(split), on_error=self.on_error, seed=self.seed,
                    cache_bytes=self.cache_bytes,
                    augment=self.augment if split == "train" else None)

    def batch_sampler(self, split: str, *, bucketing: bool | None = None) -> BucketBatchSampler:
        """The batch sampler of a split (training: shuffled buckets; eval: sorted by length)."""
        train = split == "train"
        items = self.items(split)
        crop = self.train_crop if train else self.eval_crop
        limit = self.max_seconds if crop != "full" else None
        lengths = [min(d, limit) if limit else d for d in self._durations[split]]
        if not items:
            raise DataError.make("missing_split", self.root, f"split {split!r} has no usable items "
                                 f"({self.error_counts.summary()})", "check data.root and the "
                                 "index files, or run python -m mmtf.data.check",
                                 skippable=False)
        batch_size, budget = self._batching(split)
        if budget is not None:
            lengths = self._budget_lengths(split, lengths, warn=bucketing is None)
        return self._sampler(
            split, batch_size=batch_size, budget=budget,
            drop_last=self.drop_last and train, lengths=lengths,
            num_captions=self._num_captions(split), caption_policy=self._policy(split),
            shuffle=train, bucket_size=self.bucket_size, seed=self.seed,
            bucketing=(self.bucketing and self.modality == "audio") if bucketing is None
            else bucketing)

    def _batching(self, split: str) -> tuple[int | None, float | None]:
        """``(batch_size, budget)`` of a split's sampler: one of them is None."""
        if split != "train":
            if self.eval_budget is not None:
                return None, self.eval_budget
            if self.eval_batch_size or self.batch_size:
                return self.eval_batch_size or self.batch_size, None
        return (None, self.budget) if self.budget is not None else (self.batch_size, None)

    def _budget_lengths(self, split: str, lengths: list[float], warn: bool) -> list[float]:
        """What a budget counts per item: seconds after the crop (audio), or pixels as the
        split's transforms output them (images); ``warn``: about items over the budget."""
        if self.modality == "image":
            lengths = self._pixels(split)
        budget = self._batching(split)[1]
        over = sum(length > budget for length in lengths)
        if over and warn:
            unit = "seconds" if self.modality == "audio" else "pixels"
            log.warning("[data] %s: %d item(s) are longer than the budget of %g %s per batch "
                        "(the longest: %g); each is a batch of its own", split, over, budget,
                        unit, max(lengths))
        return lengths

    def _pixels(self, split: str) -> list[int]:
        """Pixels of every image of a split as the split's transforms output them."""
        return transformed_pixels(self._image_sizes(split), self._transform(split))

    def _image_sizes(self, split: str) -> list[tuple[int, int]]:
        """``(width, height)`` of every image of a split, from the files' headers."""
        return header_sizes([item.path for item in self.items(split)])

    def _sampler(self, split: str, **kwargs: Any) -> BucketBatchSampler:
        """The sampler of a split from :meth:`batch_sampler`'s settings (subclasses that order
        examples otherwise: shard streams, a mixture drawing from its sources' samplers,
        build their own subclass from the same)."""
        return BucketBatchSampler(**kwargs)

    def _loader(self, split: str) -> DataLoader | StatefulDataLoader:
        train = split == "train"
        sampler = self.batch_sampler(split)
        if train and sampler.bucketing:
            plain = self.batch_sampler(split, bucketing=False)
            lengths = sampler.lengths
            log.info("[data] %s: length bucketing pads %.1f%% of audio samples (%.1f%% without)",
                     split, 100 * padding_fraction(sampler.batches(0), lengths),
                     100 * padding_fraction(plain.batches(0), lengths))
        dataset = self._dataset(split, self.train_crop if train else self.eval_crop)
        # Train: resumable mid-epoch (Lightning checkpoints the sampler's position). Every
        # loader has its own generator, so iterating one never shifts the training stream.
        loader = make_loader(dataset, sampler, resumable=train, seed=self.seed,
                             collate_fn=self._collate(split),
                             num_workers=self.num_workers, pin_memory=self._pin_memory(),
                             persistent_workers=self.persistent_workers,
                             counter=self.error_counts, split=split)
        self._loaders[split] = loader
        return loader

    def _collate(self, split: str) -> Collate:
        return Collate(modality=self.modality, targets=self.targets)

    def _pin_memory(self) -> bool:
        if self.pin_memory is not None:
            return self.pin_memory
        trainer = self.trainer
        return trainer is not None and trainer.strategy.root_device.type == "cuda"

    def train_dataloader(self) -> StatefulDataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    @property
    def stats(self) -> dict[str, dict[str, Any]]:
        """Per split, the last epoch's loader stats (``padding_fraction``, ``skipped``, ...)."""
        return {split: loader.last_epoch for split, loader in self._loaders.items()}

    def teardown(self, stage: str | None = None) -> None:
        # The end of fit/validate/test: no loader worker outlives the run (loader.stop_workers).
        for loader in self._loaders.values():
            loader.stop_workers()
        self._log_error_summary()

    def _log_error_summary(self) -> None:
        if self.error_counts:
            log.warning("[data] %s at %s, all epochs so far: %s", self.format, self.root,
                        self.error_counts.summary())


class CaptionDataModule(MediaDataModule):
    """Captioning data: audio or images with reference captions.

    Formats: ``clotho``, ``audiocaps`` (audio), ``coco`` (images), ``manifest`` (either).
    Besides :class:`MediaDataModule`'s arguments:

    Args:
        max_caption_tokens: longer captions are truncated (keeping ``eos``) and counted as
            ``caption_truncated`` (a warning).
        caption_policy: ``random`` (one reference per item per epoch) or ``all`` (every
            (item, reference) pair per epoch). Evaluation always keeps every reference.
        captions_per_item: training captions per item per step sharing one encoder pass
            (``seq_per_img``); ``tokens`` then hold ``batch_size * captions_per_item`` rows,
            item-major. Only with ``caption_policy: random``.
        language, speech_job: speech: the language code and ``transcribe`` | ``translate`` of
            items that name none; None = the tokenizer's prompt. (``task``: the old name of
            ``speech_job``, read with a warning.)
        instruction: a prefix LLM's user turn for caption items (``"Describe the sound."``):
            each (item, caption) becomes the chat ``user: <|audio|>\n<instruction>``,
            ``assistant: <caption>`` (:mod:`mmtf.data.chat`). None: instruction items only.
        max_chat_tokens: the longest rendered conversation (an error names a longer one).
        rotations: chats, val/test: a multiple-choice item is asked under this many rotations
            of its options (``rotation`` in the batch; :class:`mmtf.metrics.aqa.AQAAccuracy`).
        train_rotations: chats, training: a multiple-choice item has this many rotations of its
            options as its "captions" (``caption_policy: random`` trains one per item per epoch,
            ``all`` every one), so its right letter moves and no letter becomes the answer;
            1 = as written.
        media_token: the placeholder of the media in a user turn; None = ``<|audio|>`` /
            ``<|image|>`` by modality.

    Speech items start their ids with their own prompt (:meth:`item_prompt`,
    docs/design/asr-prompts-per-item.md). The entry point hands the tokenizer over with
    :meth:`connect` (``self.tokenizer``, None until then); a prefix LLM's task hands its chat
    template and placeholder over with it (``connect(tokenizer, **task.text_context())``), and batches are then
    chats (:mod:`mmtf.data.collate`, ``targets="chat"``).
    """

    targets = "caption"
    # A mixture's sources that are validated and tested, each metric logged under its name
    # (mmtf.data.mixture); none here.
    source_names: tuple[str, ...] = ()

    def __init__(self, *, max_caption_tokens: int = 64,
                 caption_policy: Literal["random", "all"] = "random", captions_per_item: int = 1,
                 language: str | None = None, speech_job: str | None = None,
                 task: str | None = None, instruction: str | None = None,
                 max_chat_tokens: int = 512, rotations: int = 1, train_rotations: int = 1,
                 media_token: str | None = None, **kwargs: Any) -> None:
        super().__init__(**_current_keys(kwargs))
        if instruction is not None and (not isinstance(instruction, str)
                                        or not instruction.strip()):
            raise ConfigError(f"data.instruction ({instruction!r}) must be a non-empty string "
                              f"such as \"Describe the sound.\", or null.")
        if isinstance(max_chat_tokens, bool) or not isinstance(max_chat_tokens, int) or \
                max_chat_tokens < 2:
            raise ConfigError(f"data.max_chat_tokens ({max_chat_tokens!r}) must be an int >= 2.")
        for key, value in (("rotations", rotations), ("train_rotations", train_rotations)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"data.{key} ({value!r}) must be an int >= 1 (4: every "
                                  f"option of a 4-choice question visits every letter).")
        self.instruction = instruction.strip() if instruction else None
        self.max_chat_tokens, self.rotations = max_chat_tokens, rotations
        self.train_rotations = train_rotations
        self.placeholder = media_token_for(self.modality, media_token)
        self.media_token_set = media_token is not None   # else the task's placeholder wins
        self.chat_template: ChatTemplate | None = None
        self.max_caption_tokens = int(max_caption_tokens)
        if self.max_caption_tokens < 2:
            raise ConfigError(f"max_caption_tokens ({self.max_caption_tokens}) must be >= 2 to "
                              f"hold <bos> and <eos>.")
        if caption_policy not in ("random", "all"):
            raise ConfigError(f"caption_policy ({caption_policy!r}) must be 'random' or 'all'.")
        if captions_per_item < 1 or (captions_per_item > 1 and caption_policy != "random"):
            raise ConfigError(f"captions_per_item ({captions_per_item}) must be >= 1, and > 1 "
                              f"only with caption_policy=random (caption_policy "
                              f"{caption_policy!r} already visits every pair); fix "
                              f"data.captions_per_item or data.caption_policy.")
        if task is not None:
            if speech_job is not None and speech_job != task:
                raise ConfigError(f"data.task ({task!r}) is the old name of data.speech_job "
                                  f"({speech_job!r}); keep only data.speech_job.")
            log.warning("[data] data.task is now data.speech_job; read data.task=%s as it", task)
            speech_job = task
        if speech_job is not None and speech_job not in JOBS:
            raise ConfigError(f"data.speech_job ({speech_job!r}) must be one of {list(JOBS)} "
                              f"or null.")
        self.language, self.speech_job = language, speech_job
        self.captions_per_item = captions_per_item
        self.caption_policy = caption_policy
        self.tokenizer: Tokenizer | None = None
        self._tokens: dict[str, list[list[list[int]]]] = {}

    def _reader_kwargs(self) -> dict[str, Any]:
        kw = super()._reader_kwargs()
        if self.format == "manifest":
            kw["modality"] = self.modality
        if self.format == "instruction":
            kw.update(modality=self.modality, placeholder=self.placeholder)
        return kw

    def train_captions(self) -> list[str]:
        """Every training caption (and, for chats, every turn and the instruction): what a
        fresh run's tokenizer is trained on."""
        return [t for item in self.items("train")
                for t in chat_texts(item, self.placeholder, self.instruction)]

    @property
    def chats(self) -> bool:
        """Batches are chats for a prefix LLM (a chat template was connected)."""
        return self.chat_template is not None

    def tokenizer_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The ``tokenizer`` config node a fresh run trains with, given the configured one (a
        mixture adds its sources' prompt tokens); unchanged here."""
        return dict(spec)

    def connect(self, tokenizer: Tokenizer, chat_template: ChatTemplate | None = None,
                media_token: str | None = None) -> None:
        """Build token ids with ``tokenizer`` from now on (cached ids of another are dropped);
        with ``chat_template`` (a prefix LLM's), items become chats (:mod:`mmtf.data.chat`),
        with the task's ``media_token`` as their placeholder. The task hands all three over:
        ``connect(tokenizer, **task.text_context())``.

        Raises:
            ConfigError: chats with mixup, ``captions_per_item > 1`` or a tokenizer that is
                not backed by ``tokenizers`` (``char``); a ``data.media_token`` that is not the
                task's placeholder.
        """
        if media_token is not None and media_token != self.placeholder:
            if self.media_token_set:
                raise ConfigError(f"data.media_token ({self.placeholder!r}) is not the model's "
                                  f"placeholder ({media_token!r}); set both to the same token "
                                  f"(model.media_token and data.media_token) or drop "
                                  f"data.media_token.")
            self.placeholder = media_token
            self._tokens.clear()
        if chat_template is not None:
            if not isinstance(tokenizer, BackedTokenizer):
                raise ConfigError(f"a prefix LLM's chats are encoded by a tokenizer backed by "
                                  f"`tokenizers` (tokenizer=bpe or pretrained); "
                                  f"{type(tokenizer).__name__} is not one.")
            if self.mixup is not None:
                raise ConfigError("data.augment.mixup mixes caption losses; a prefix LLM trains "
                                  "on chats: set data.augment.mixup.p=0.")
            if self.captions_per_item != 1:
                raise ConfigError(f"data.captions_per_item ({self.captions_per_item}) must be 1 "
                                  f"for a prefix LLM (one chat per example); use "
                                  f"data.caption_policy=all to train on every caption.")
        if tokenizer != self.tokenizer or chat_template is not self.chat_template:
            self._tokens.clear()
        self.tokenizer, self.chat_template = tokenizer, chat_template

    def tokens(self, split: str) -> list[list[list[int]]]:
        """Token ids of every caption of every item of a split, truncated to the limit; with a
        chat template, every item's encoded chats (:func:`mmtf.data.chat.encode_items`).

        Raises:
            UserError: no tokenizer was connected (:meth:`connect`), or instruction data
                without a chat template.
        """
        if split not in self._tokens and self.tokenizer is not None and self.chats:
            self._tokens[split] = encode_items(
                self.items(split), template=self.chat_template, tokenizer=self.tokenizer,
                placeholder=self.placeholder, instruction=self.instruction,
                train=split == "train", max_tokens=self.max_chat_tokens,
                rotations=self.train_rotations if split == "train" else self.rotations)
        if split not in self._tokens and self.tokenizer is not None and (
                self.instruction or any(item.messages is not None for item in self.items(split))):
            raise UserError(f"{type(self).__name__}: {self.format} data with "
                            f"{'data.instruction' if self.instruction else 'conversations'} "
                            f"trains a prefix LLM, which hands its chat template over: "
                            f"datamodule.connect(tokenizer, chat_template=...) (a task with a "
                            f"chat_template does, e.g. the *_llm experiments); for a captioner "
                            f"set data.instruction=null and use a caption set.")
        if split not in self._tokens:
            if self.tokenizer is None:
                raise UserError(
                    f"{type(self).__name__}: no tokenizer to build the {split} token ids with; "
                    f"call datamodule.connect(tokenizer) first, e.g. with "
                    f"mmtf.tasks.resolve_tokenizer(cfg.tokenizer, "
                    f"train_captions=datamodule.train_captions) (mmtf.train does).")
            items = self.items(split)
            flat = [c for item in items for c in item.captions]
            ids = self.tokenizer.encode_batch(flat)
            limit = self.max_caption_tokens
            over = [i for i, t in enumerate(ids) if len(t) > limit]
            truncated = ErrorCounter()
            if over:
                where = [item.where for item in items for _ in item.captions]
                for i in over:
                    truncated.add("caption_truncated", f"{where[i]} ({len(ids[i])} tokens)")
                cut = self.tokenizer.encode_batch([flat[i] for i in over], max_len=limit)
                for i, t in zip(over, cut):
                    ids[i] = t
                self.error_counts.merge(truncated)
                log.warning("[data] %s %s: %d of %d captions exceed max_caption_tokens=%d and "
                            "were truncated (e.g. %s); raise data.max_caption_tokens to keep "
                            "them whole", self.format, split, truncated.total, len(flat), limit,
                            truncated.examples["caption_truncated"][0])
            out, k, prompt = [], 0, self.prompt()
            for item in items:
                per_item = ids[k:k + len(item.captions)]
                prefix = self.item_prompt(item, prompt)
                out.append(per_item if prefix is None else
                           prompt.start(per_item, prefix, where=item.where))
                k += len(item.captions)
            self._tokens[split] = out
        return self._tokens[split]

    def prompt(self) -> Prompt:
        """The prompt the targets start with (:func:`mmtf.text.prompt.prompt_for`)."""
        return prompt_for(self.tokenizer)

    def item_prompt(self, item: CaptionItem, prompt: Prompt) -> list[int] | None:
        """The prefix ids of one speech item (its language and job, else ``data.language`` /
        ``data.speech_job``), or None for the tokenizer's own prompt.

        Raises:
            ConfigError: an unknown language code (the message lists the tokenizer's), or
                ``data.language`` / ``data.speech_job`` set with a tokenizer whose prompt is
                not Whisper's.
        """
        language = item.language or self.language
        job = item.task or self.speech_job
        if language is None and job is None:
            return None
        if not prompt.speech:
            if self.language is not None or self.speech_job is not None:
                tok = self.tokenizer
                raise ConfigError(f"data.language / data.speech_job are set but the tokenizer's "
                                  f"prompt {[tok.id_to_token(i) for i in prompt.default]} is not "
                                  f"Whisper's (no language or job tokens); set "
                                  f"data.language=null data.speech_job=null.")
            return None
        return prompt.ids(job=job, language=language, where=item.where)

    def questions(self, split: str) -> list[dict[str, Any]]:
        """The split's multiple-choice items as :class:`mmtf.metrics.aqa.AQAAccuracy` takes
        them (ids as the batches carry them); empty when it has none."""
        return question_fields(self.items(split))

    def _num_captions(self, split: str) -> list[int] | None:
        if self.chats:            # chat variants: captions, or val/test rotations
            return [len(per) for per in self.tokens(split)]
        return [len(item.captions) for item in self.items(split)]

    def _collate_kwargs(self, split: str) -> dict[str, Any]:
        # Built after _dataset, which refuses to run without a tokenizer.
        pad = self.tokenizer.pad_id
        pad = 0 if pad is None else pad   # padded ids are masked: any id serves
        if self.chats:
            return dict(modality=self.modality, targets="chat", pad_id=pad,
                        prompts=split != "train")
        return dict(modality=self.modality, targets=self.targets, pad_id=pad,
                    mixup=self.mixup if split == "train" else None)

    def _collate(self, split: str) -> Collate:
        return Collate(**self._collate_kwargs(split))

    def _policy(self, split: str) -> str:
        if split != "train":
            return "all" if self.chats else "first"     # chats: every rotation
        return self.caption_policy

    def _dataset(self, split: str, crop: str) -> CaptionDataset:
        return CaptionDataset(self.items(split), tokens=self.tokens(split),
                              captions_per_item=self.captions_per_item if split == "train" else 1,
                              **self._media_kwargs(split, crop))


class ClassificationDataModule(MediaDataModule):
    """Classification data: audio or images with one class label each.

    Formats: ``esc50`` (audio), ``image_folder`` (images). Besides :class:`MediaDataModule`'s
    arguments:

    Args:
        folds: ESC-50 only: our split -> list of folds (default train 1-3, val 4, test 5).
        val_fraction, test_fraction: ImageFolder without split folders: each class's share.

    Attributes:
        class_names, num_classes: names by label index and their count (after ``setup``).
    """

    def __init__(self, *, folds: Mapping[str, Sequence[int]] | None = None,
                 val_fraction: float = 0.1, test_fraction: float = 0.1, **kwargs: Any) -> None:
        super().__init__(**_current_keys(kwargs))
        self.folds = dict(to_plain(folds)) if folds else None
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.class_names: list[str] | None = None
        self.num_classes: int | None = None

    def _reader_kwargs(self) -> dict[str, Any]:
        kw = super()._reader_kwargs()
        if self.format == "esc50":
            kw.pop("splits", None)
            if self.folds:
                kw["folds"] = self.folds
        else:
            kw.update(val_fraction=self.val_fraction, test_fraction=self.test_fraction,
                      seed=self.seed)
        return kw

    def _read(self, split: str) -> list:
        label_set = super()._read(split)
        if self.class_names is None:
            self.class_names = list(label_set.class_names)
            self.num_classes = len(self.class_names)
        elif list(label_set.class_names) != self.class_names:
            raise DataError.make("bad_row", self.root, f"split {split!r} has classes "
                                 f"{label_set.class_names} but earlier splits have "
                                 f"{self.class_names}", "use the same classes in every split",
                                 skippable=False)
        return label_set.items

    def _dataset(self, split: str, crop: str) -> LabelDataset:
        return LabelDataset(self.items(split), **self._media_kwargs(split, crop))


class QADataModule(MediaDataModule):
    """Multiple-choice audio questions (format ``aqa``: :mod:`mmtf.data.formats.aqa`): batches of
    padded clips plus each question as a chat (``messages``), ``choices``, ``answer``,
    ``question_type`` (:class:`~mmtf.data.datasets.QADataset`, :class:`~mmtf.data.Collate`).

    It reads, checks, batches and loads like the other modules (their arguments); turning the
    chats into a language model's tokens is the model side's. Scoring:
    :class:`mmtf.metrics.aqa.AQAAccuracy`.
    """

    targets = "qa"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**_current_keys(kwargs))

    def _formats(self) -> Mapping[str, tuple[Any, str | None]]:
        return QA_FORMATS

    def _dataset(self, split: str, crop: str) -> QADataset:
        return QADataset(self.items(split), **self._media_kwargs(split, crop))



def _current_keys(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs``, refused with the key's new place if one is an old flat key (a user's YAML;
    stored configs are upgraded before they get here)."""
    old = sorted(set(kwargs) & set(moved := moved_keys("DataModule")))
    if old:
        raise ConfigError(f"data.{old[0]} is now data.{moved[old[0]]}; rename it in your "
                          f"experiment YAML or override.")
    return kwargs


def _budgets(modality: str, batches: BatchOptions) -> tuple[float | None, float | None]:
    """The training and val/test budgets (per modality), after the checks of the keys."""
    o = batches
    for name, value in (("batch_size", o.batch_size), ("eval_batch_size", o.eval_batch_size)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise UserError(f"data.batches.{name} ({value!r}) must be a positive int.")
    mine, other = ("seconds", "pixels") if modality == "audio" else ("pixels", "seconds")
    keys = {"seconds": (o.max_seconds_per_batch, o.eval_max_seconds_per_batch),
            "pixels": (o.max_pixels_per_batch, o.eval_max_pixels_per_batch)}
    for key, value in zip((f"max_{other}_per_batch", f"eval_max_{other}_per_batch"),
                          keys[other]):
        if value is not None:
            raise ConfigError(f"data.batches.{key} ({value!r}) is for "
                              f"{'images' if other == 'pixels' else 'audio'}; this data is "
                              f"{modality}: use data.batches.max_{mine}_per_batch or remove "
                              f"data.batches.{key}.")
    budget, eval_budget = keys[mine]
    for key, value in ((f"max_{mine}_per_batch", budget), (f"eval_max_{mine}_per_batch",
                                                           eval_budget)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not 0 < value < float("inf")):
            raise ConfigError(f"data.batches.{key} ({value!r}) must be a positive number of "
                              f"{mine}, or null.")
    if (budget is None) == (o.batch_size is None):
        raise ConfigError(
            f"data.batches.batch_size ({o.batch_size!r}) and data.batches.max_{mine}_per_batch "
            f"({budget!r}): exactly one sets the training batches; "
            + (f"set data.batches.batch_size=null to batch by {mine}." if budget is not None
               else f"set data.batches.batch_size or data.batches.max_{mine}_per_batch."))
    if eval_budget is not None and o.eval_batch_size is not None:
        raise ConfigError(f"data.batches.eval_batch_size ({o.eval_batch_size!r}) and "
                          f"data.batches.eval_max_{mine}_per_batch ({eval_budget!r}) are both "
                          f"set; set one of them to null.")
    return budget, eval_budget
