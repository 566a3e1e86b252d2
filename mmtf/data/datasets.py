"""Map-style datasets over the items a format reader returns: decode on access.

An example is looked up by the sampler's key ``(item, caption, epoch)`` (a plain ``int``: caption
0, epoch 0); the epoch seeds the crop and transform RNG, so an example is a pure function of
``(seed, key)``. Under ``on_error="skip"`` a bad item is replaced by the next good one and the
skip recorded in ``_skipped`` (batches are never short). :func:`probe` checks headers up front.

Shapes: audio (s,) float32; images (3, h, w) float32 after the transform."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from mmtf.data.audio import Crop, StoredAudio, audio_info, load_audio, read_stored_audio
from mmtf.data.augment import WaveAugment, augment_stream
from mmtf.data.chat import ChatExample
from mmtf.data.collate import Modality
from mmtf.data.errors import ErrorPolicy, OnError, check_media_file
from mmtf.data.formats.aqa import QAItem
from mmtf.data.formats.base import CaptionItem, LabelItem
from mmtf.data.image import load_image
from mmtf.data.sampler import sample_rng
from mmtf.errors import DataError, UserError
from mmtf.metrics.aqa import rotate_item

Key = tuple[int, int, int]


def _probe_one(item: CaptionItem | LabelItem | QAItem, modality: str,
               channels: int | None) -> float | DataError:
    try:
        if modality == "audio":
            return audio_info(item.path, channels=channels, where=item.where).duration
        check_media_file(item.path, item.where)
        return 1.0
    except DataError as e:
        return e


def probe(items: Sequence[CaptionItem | LabelItem | QAItem], *, modality: str, policy: ErrorPolicy,
          channels: int | None = None, threads: int = 8) -> tuple[list, list[float]]:
    """Check every item's file without decoding it; drop (or raise on) the bad ones.

    Args:
        modality: ``audio`` (:func:`mmtf.data.audio.audio_info`) or ``image`` (exists, not
            empty). channels: required audio channel count, or None for any.
        threads: parallel header reads (I/O bound).

    Returns the good items and their durations in seconds (1.0 for images).
    """
    if len(items) > 256 and threads > 1:
        with ThreadPoolExecutor(threads) as ex:
            results = list(ex.map(lambda it: _probe_one(it, modality, channels), items,
                                  chunksize=64))
    else:
        results = [_probe_one(it, modality, channels) for it in items]
    kept, durations = [], []
    for item, res in zip(items, results):
        if isinstance(res, DataError):
            policy(res)
        else:
            kept.append(item)
            durations.append(res)
    return kept, durations


class MediaDataset(Dataset):
    """Decodes the audio or image of each item; subclasses add captions or labels.

    Args:
        items: from a format reader (after :func:`probe`).
        sample_rate, max_seconds, crop, channels: as :func:`mmtf.data.audio.load_audio`.
        transform: image pipeline (uint8 (3, h, w) -> float32), e.g. from
            :func:`mmtf.data.image.build_transform`.
        on_error, max_retries: ``raise`` | ``skip`` (replace by the next good item, up to
            ``max_retries`` tries, and record it). seed: with the key's epoch and item.
        cache_bytes: decoded media kept in memory per process, up to this many bytes (0 = off;
            ``media_cache_mb`` of :class:`~mmtf.data.datamodule.MediaDataModule`).
        augment: audio only: per-item :class:`mmtf.data.augment.WaveAugment`; None = off.
    """

    def __init__(self, items: Sequence[CaptionItem | LabelItem | QAItem], *, modality: Modality,
                 sample_rate: int = 16000, max_seconds: float | None = None, crop: Crop = "center",
                 channels: int | None = None, transform: Callable[[Tensor], Tensor] | None = None,
                 on_error: OnError = "raise", seed: int = 0, max_retries: int = 16,
                 cache_bytes: int = 0, augment: WaveAugment | None = None) -> None:
        # modality and on_error are checked once, at the config boundary (CaptionDataModule,
        # ErrorPolicy); a dataset is built from checked values.
        if cache_bytes < 0:
            raise UserError(f"cache_bytes ({cache_bytes}) must be >= 0.")
        self._cache: dict[int, Tensor | StoredAudio] = {}
        self._cache_bytes = self._cache_left = cache_bytes
        self._not_cached: set[int] = set()   # audio too big for what is left, or lossy
        self.items = list(items)
        self.modality, self.sample_rate, self.max_seconds = modality, sample_rate, max_seconds
        self.crop, self.channels, self.transform = crop, channels, transform
        self.on_error, self.seed, self.max_retries = on_error, seed, max_retries
        self.augment = augment

    def __len__(self) -> int:
        return len(self.items)

    def read_bytes(self, index: int) -> bytes | None:
        """The bytes of item ``index``'s media when it is not a file of its own (a shard
        member: :class:`mmtf.data.shards.ShardCaptionDataset`); None: the decoder opens
        ``item.path``."""
        return None

    def load(self, index: int, epoch: int = 0) -> Tensor:
        """The decoded media of item ``index``: audio (s,) or image (3, h, w)."""
        item = self.items[index]
        if self.modality == "audio":
            # A pure function of (seed, epoch, item): the same crop in any worker, and again
            # after a resume (a worker's global generators restart with the worker).
            rng = sample_rng(self.seed, epoch, index) if self.crop == "random" else None
            stored = self._stored_audio(index)
            if stored is not None:
                wave = stored.clip(sample_rate=self.sample_rate, max_seconds=self.max_seconds,
                                   crop=self.crop, rng=rng)
            else:
                wave = load_audio(item.path, sample_rate=self.sample_rate,
                                  max_seconds=self.max_seconds, crop=self.crop,
                                  channels=self.channels, rng=rng, where=item.where,
                                  check_header=False,  # headers were checked by probe()
                                  data=self.read_bytes(index))
            if self.augment is not None:
                wave = self.augment(wave, augment_stream(self.seed, epoch, index))
            return wave
        image = self._cache.get(index)
        if image is None:
            image = load_image(item.path, where=item.where,
                               data=self.read_bytes(index))                  # (3, h, w) uint8
            if image.nbytes <= self._cache_left:
                self._cache[index] = image
                self._cache_left -= image.nbytes
        assert isinstance(image, Tensor)
        if self.transform is None:
            return image.clone() if index in self._cache else image
        # Random transforms draw from torch's global RNG; seed it per (seed, epoch, item) so
        # augmentations, like audio crops, do not depend on the number of workers. The CPU
        # generator only (torch.manual_seed also seeds CUDA, at a cost per call).
        # Why: see docs/design/image-transform-seeding.md
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(
                int(np.random.SeedSequence([self.seed, epoch, index]).generate_state(1)[0]))
            return self.transform(image)

    def cache_report(self) -> str | None:
        """What the decoded-media cache of this process holds, for the epoch's log line (e.g.
        ``"kept decoded: 3000 of 3000 items, 369.9 of 400.0 MiB"``); None without a cache."""
        if not self._cache_bytes:
            return None
        used = (self._cache_bytes - self._cache_left) / 2 ** 20
        return (f"kept decoded: {len(self._cache)} of {len(self.items)} items, {used:.1f} of "
                f"{self._cache_bytes / 2 ** 20:.1f} MiB")

    def _stored_audio(self, index: int) -> StoredAudio | None:
        """Item ``index``'s samples from the cache, read into it on first use while they fit;
        None: decode from the file."""
        stored = self._cache.get(index)
        if stored is not None or index in self._not_cached or self._cache_left <= 0:
            return stored  # type: ignore[return-value]
        item = self.items[index]
        stored = read_stored_audio(item.path, channels=self.channels, where=item.where,
                                   data=self.read_bytes(index), max_bytes=self._cache_left)
        if stored is None:
            self._not_cached.add(index)
            return None
        final = stored.finalized(sample_rate=self.sample_rate, max_seconds=self.max_seconds,
                                 crop=self.crop)
        if final.nbytes <= self._cache_left:   # an upsampled file may outgrow its samples
            stored = final
        self._cache[index] = stored
        self._cache_left -= stored.nbytes
        return stored

    def example(self, index: int, caption: int, media: Tensor) -> dict[str, Any]:
        """The example dict of one item (subclasses add their targets)."""
        return {self.modality: media, "id": self.items[index].id}

    def __getitem__(self, key: Key | int) -> dict[str, Any]:
        item, caption, epoch = (key, 0, 0) if isinstance(key, int) else key
        if not self.items:
            raise IndexError("dataset is empty")
        skipped: list[tuple[str, str]] = []
        last: DataError | None = None
        for attempt in range(self.max_retries + 1):
            index = (item + attempt) % len(self.items)
            try:
                media = self.load(index, epoch)
            except DataError as e:
                if self.on_error == "raise":
                    raise
                skipped.append((e.reason, e.location()))
                last = e
                continue
            out = self.example(index, caption, media)
            out["_skipped"] = skipped
            out["_key"] = (index, epoch)   # what Collate seeds a batch's mixup with
            return out
        raise DataError(f"{self.max_retries + 1} items in a row (from {self.items[item].path}) "
                        f"failed to load; the last error: {last}. Most of this dataset looks "
                        f"broken: run `python -m mmtf.data.check` on it.",
                        reason=last.reason if last else "invalid")


class CaptionDataset(MediaDataset):
    """Media + tokenized training caption(s) + all references per item.

    Args:
        tokens: token ids per item per caption (``tokens[i][k]`` for ``items[i].captions[k]``),
            or, for a prefix LLM, each item's encoded chat variants
            (:class:`mmtf.data.chat.ChatExample`; the key's caption slot picks one, and the
            example carries it as ``chat``, plus ``qa`` for a multiple-choice item).
        captions_per_item: 1: ``tokens`` is the key's caption; k > 1: a list of the k captions
            from the key's one on, cycling through the item's references (not for chats).
        **kwargs: see :class:`MediaDataset`.
    """

    def __init__(self, items: Sequence[CaptionItem], *,
                 tokens: Sequence[Sequence[Sequence[int] | ChatExample]],
                 captions_per_item: int = 1, **kwargs: Any) -> None:
        super().__init__(items, **kwargs)
        if len(tokens) != len(self.items):
            raise ValueError(f"tokens has {len(tokens)} entries for {len(self.items)} items.")
        if captions_per_item < 1:
            raise UserError(f"captions_per_item ({captions_per_item}) must be >= 1.")
        self.chats = bool(tokens) and isinstance(tokens[0][0], ChatExample)
        if self.chats and captions_per_item != 1:
            raise UserError(f"captions_per_item ({captions_per_item}) must be 1 for chats "
                            f"(one conversation per example).")
        self.tokens = [list(per) if self.chats else [np.asarray(t, dtype=np.int64) for t in per]
                       for per in tokens]
        self.captions_per_item = captions_per_item

    def example(self, index: int, caption: int, media: Tensor) -> dict[str, Any]:
        out = super().example(index, caption, media)
        per_item = self.tokens[index]
        if self.chats:
            item, chat = self.items[index], per_item[caption % len(per_item)]
            out.update(chat=chat, references=chat.references or item.captions, qa=item.qa)
            return out
        if self.captions_per_item == 1:
            out["tokens"] = per_item[caption % len(per_item)]
        else:
            out["tokens"] = [per_item[(caption + j) % len(per_item)]
                             for j in range(self.captions_per_item)]
        out["references"] = self.items[index].captions
        return out


class LabelDataset(MediaDataset):
    """Media + class index per item."""

    def example(self, index: int, caption: int, media: Tensor) -> dict[str, Any]:
        out = super().example(index, caption, media)
        out["label"] = self.items[index].label
        return out


class QADataset(MediaDataset):
    """Audio + one multiple-choice question as a chat (:mod:`mmtf.data.formats.aqa`).

    An example holds the clip (``audio`` (s,)), ``messages`` (the user turn with its
    ``<|audio|>`` placeholder, the assistant's ``(B) <answer>``), ``question_type``,
    ``choices``, ``answer`` and ``rotation``. Tokenizing the chat is the model side's.

    Args:
        rotations: 1 (default): every item as written. k > 1: the key's caption slot picks
            the rotation (``caption % k``, :func:`mmtf.metrics.aqa.rotate_item`), so a sampler
            over (item, caption) pairs with k "captions" per item covers every rotation.
        **kwargs: see :class:`MediaDataset`.
    """

    def __init__(self, items: Sequence[QAItem], *, rotations: int = 1, **kwargs: Any) -> None:
        super().__init__(items, **kwargs)
        if not 1 <= rotations <= min((len(it.choices) for it in self.items), default=1):
            raise UserError(f"rotations ({rotations}) must be between 1 and the fewest options "
                            f"of an item.")
        self.rotations = rotations
        # Several questions share a clip: they load (and keep decoded) the first one's audio.
        first: dict[Any, int] = {}
        self._clip_of = [first.setdefault(item.path, i) for i, item in enumerate(self.items)]

    def load(self, index: int, epoch: int = 0) -> Tensor:
        return super().load(self._clip_of[index], epoch)

    def example(self, index: int, caption: int, media: Tensor) -> dict[str, Any]:
        out = super().example(index, caption, media)
        item = self.items[index]
        variant = rotate_item(item, caption % self.rotations)
        out.update(messages=variant["messages"], question_type=item.question_type,
                   choices=variant["choices"], answer=item.answer, rotation=variant["rotation"])
        return out
