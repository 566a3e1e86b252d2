"""Weighted mixtures of caption sets: ``data=mixture`` (AudioCaps + WavCaps + Clotho, ...), and
of instruction sets for a prefix LLM (AQA + captions with an instruction, ...).

A :class:`MixtureDataModule` holds one caption data module per source (its own root, format,
transforms, crops, augmentation), plus the mixture's keys (conf/data/mixture.yaml). Items are
the sources' concatenated (global index = source offset + local index). Training draws
``epoch_samples / world`` source choices per epoch and rank by weight (:class:`MixtureSampler`),
each taking the next example of that source's own sampler: the order is a pure function of
``(seed, epoch, rank)`` and resumes mid-epoch. Validation and test hold the sources with
``evaluate: true``; metrics are logged per source (``val/clotho/cider_d``) and overall. A
source's ``prompt_token`` ends the prompt (CoNeTTE's task embedding; Labbé et al., 2024).
Why and how: docs/design/mixtures.md.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from mmtf.data.collate import Collate
from mmtf.data.datamodule import CaptionDataModule, to_plain
from mmtf.data.errors import ErrorCounter
from mmtf.data.formats import SPLITS
from mmtf.data.sampler import BucketBatchSampler, Key, refuse_other_settings
from mmtf.errors import ConfigError, UserError
from mmtf.text import Tokenizer
from mmtf.text.chat import ChatTemplate
from mmtf.text.prompt import SourcePrompt

log = logging.getLogger("mmtf.data")

__all__ = ["MixtureDataModule", "MixtureDataset", "MixtureSampler", "Source"]

# Reading and example settings: each source's own, never the mixture's.
PER_SOURCE = ("format", "root", "modality", "splits", "sample_rate", "max_seconds", "crop",
              "channels", "transforms", "media_cache_mb",
              "augment", "max_caption_tokens", "caption_policy",
              "captions_per_item", "language", "speech_job", "task", "on_error",
              "instruction", "max_chat_tokens", "rotations", "train_rotations",
              "media_token")


class MixtureSampler(BucketBatchSampler):
    """Training batches drawn from several sources by weight (see the module doc).

    Args:
        sources, weights, names, offsets: per source: its training sampler (same
            ``num_replicas`` / ``rank`` as this one), weight (> 0; normalised), name (logs,
            checkpoint checks) and first global item index.
        epoch_samples: examples per epoch over all ranks; None = the sum of the sources'
            examples per epoch.
        **kwargs: :class:`BucketBatchSampler` over the concatenated items (``lengths``,
            ``num_captions``, ``batch_size``, ...).
    """

    def __init__(self, *, sources: Sequence[BucketBatchSampler], weights: Sequence[float],
                 names: Sequence[str], offsets: Sequence[int], epoch_samples: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not len(sources) == len(weights) == len(names) == len(offsets) >= 1:
            raise UserError(f"MixtureSampler: sources, weights, names and offsets must have one "
                            f"entry per source; got {len(sources)}, {len(weights)}, {len(names)} "
                            f"and {len(offsets)}.")
        weights = np.asarray(weights, dtype=np.float64)
        bad = [f"{n}={w}" for n, w in zip(names, weights) if not (math.isfinite(w) and w > 0)]
        if bad:
            raise UserError(f"MixtureSampler: every weight must be a finite number > 0; got "
                            f"{', '.join(bad)}; fix data.sources.<name>.weight.")
        if self.num_captions is None:
            raise UserError("MixtureSampler: num_captions is needed (the source epoch rides in "
                            "the caption slot of the key).")
        for name, src in zip(names, sources):
            if src.world() != self.world():
                raise UserError(f"MixtureSampler: source {name!r} samples for (num_replicas, "
                                f"rank) {src.world()}, the mixture for {self.world()}.")
        ends = [o + len(s.lengths) for o, s in zip(offsets, sources)]
        if list(offsets[1:]) != ends[:-1] or offsets[0] != 0 or ends[-1] != len(self.lengths):
            raise UserError(f"MixtureSampler: offsets {list(offsets)} do not tile the "
                            f"{len(self.lengths)} items of the sources "
                            f"({[len(s.lengths) for s in sources]}).")
        if epoch_samples is not None and (isinstance(epoch_samples, bool) or
                                          not isinstance(epoch_samples, int) or epoch_samples < 1):
            raise UserError(f"MixtureSampler: epoch_samples ({epoch_samples!r}) must be a "
                            f"positive int or null; fix data.epoch_samples.")
        self.sources, self.names = list(sources), [str(n) for n in names]
        self.weights = weights / weights.sum()
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.epoch_samples = epoch_samples
        self._consumed_at: dict[int, dict[int, np.ndarray]] = {}     # rank -> epoch -> counts

    def num_examples(self) -> int:
        if self.epoch_samples is not None:
            return self.epoch_samples
        return sum(src.num_examples() for src in self.sources)

    # ------------------------------------------------------------------ order
    def choices(self, epoch: int, rank: int | None = None) -> np.ndarray:
        """The source of each of ``rank``'s (default: this rank's) examples of ``epoch``
        (``_rank_size()`` long)."""
        rank = self.rank if rank is None else rank
        rng = np.random.default_rng([self.seed, epoch, 4, rank])
        return rng.choice(len(self.sources), size=self._rank_size(), p=self.weights)

    def source_counts(self, epoch: int) -> dict[str, int]:
        """How many of this rank's examples of ``epoch`` each source gives."""
        counts = np.bincount(self.choices(epoch), minlength=len(self.sources))
        return dict(zip(self.names, (int(c) for c in counts)))

    def _consumed(self, epoch: int, rank: int) -> np.ndarray:
        """Examples each source gave ``rank`` in the epochs before ``epoch``."""
        memo = self._consumed_at.setdefault(rank, {0: np.zeros(len(self.sources), np.int64)})
        start = max(e for e in memo if e <= epoch)
        used = memo[start].copy()
        for e in range(start, epoch):
            used += np.bincount(self.choices(e, rank), minlength=len(self.sources))
            memo[e + 1] = used.copy()
        return used

    def rank_examples(self, epoch: int, rank: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``rank``'s (default: this rank's) examples of ``epoch``: global items, and captions
        with the source's epoch folded in (``caption + num_captions[item] * source_epoch``)."""
        rank = self.rank if rank is None else rank
        choice = self.choices(epoch, rank)
        start = self._consumed(epoch, rank)
        items = np.empty(len(choice), dtype=np.int64)
        caps = np.empty(len(choice), dtype=np.int64)
        for k, src in enumerate(self.sources):
            where = np.flatnonzero(choice == k)
            if not len(where):
                continue
            per_epoch = src._rank_size()
            pos = start[k] + np.arange(len(where))
            src_epoch, index = pos // per_epoch, pos % per_epoch
            for e in np.unique(src_epoch):
                sel = src_epoch == e
                # Another rank's examples too: a batch count over every rank asks for them.
                local, cap = (src.rank_examples(int(e)) if rank == self.rank
                              else src.rank_examples(int(e), rank=rank))
                glob = local[index[sel]] + self.offsets[k]
                items[where[sel]] = glob
                caps[where[sel]] = cap[index[sel]] + self.num_captions[glob] * int(e)
        return items, caps

    def __iter__(self) -> Iterator[list[Key]]:
        first = True
        for batch in super().__iter__():
            if first:          # the epoch (or its resumed remainder) has begun: say what it holds
                first = False
                counts = self.source_counts(self.state.epoch)
                total = sum(counts.values()) or 1
                log.info("[data] mixture train epoch %d (rank %d): %s", self.state.epoch,
                         self.rank, ", ".join(f"{n} {c} ({100 * c / total:.1f}%)"
                                              for n, c in counts.items()))
            yield batch

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "sources": list(self.names),
                "weights": [float(w) for w in self.weights],
                "source_items": [len(s.lengths) for s in self.sources],
                "epoch_samples": self.epoch_samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position (see :meth:`BucketBatchSampler.load_state_dict`).

        Raises:
            UserError: the position was saved with other sources, weights or source sizes.
        """
        refuse_other_settings(self, state, ("sources", "weights", "source_items", "epoch_samples"),
                              "the same data.sources and data.epoch_samples")
        super().load_state_dict(state)


class MixtureDataset(Dataset):
    """Hands each key to its source's dataset; adds the item's ``source`` and prefixes its id.

    Args:
        parts: each source's dataset (a :class:`~mmtf.data.datasets.CaptionDataset`).
        offsets: each source's first global item index.
        num_captions: captions per global item; given when the key's caption slot carries the
            source's epoch (training under :class:`MixtureSampler`).
    """

    def __init__(self, parts: Sequence[Any], *, names: Sequence[str], offsets: Sequence[int],
                 num_captions: Sequence[int] | None = None) -> None:
        self.parts, self.names, self.offsets = list(parts), list(names), list(offsets)
        self.num_captions = None if num_captions is None else np.asarray(num_captions)

    def __len__(self) -> int:
        return self.offsets[-1] + len(self.parts[-1])

    def __getitem__(self, key: Key | int) -> dict[str, Any]:
        item, caption, epoch = (key, 0, 0) if isinstance(key, int) else key
        k = bisect.bisect_right(self.offsets, item) - 1
        if self.num_captions is not None:
            epoch, caption = divmod(caption, int(self.num_captions[item]))
        out = self.parts[k][(item - self.offsets[k], caption, epoch)]
        # Ids stay unique across sources (metrics keep one row per id).
        out["id"], out["source"] = f"{self.names[k]}/{out['id']}", self.names[k]
        return out


class MixtureCollate(Collate):
    """:class:`~mmtf.data.collate.Collate` plus ``sources``: each item's source name."""

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        batch = super().__call__(examples)
        batch["sources"] = [e["source"] for e in examples]
        return batch


@dataclass
class Source:
    """One source of a mixture: its data module and the mixture's keys for it."""

    name: str
    weight: float
    module: CaptionDataModule
    prompt_token: str | None = None
    evaluate: bool = True


def build_sources(sources: Any) -> list[Source]:
    """``data.sources`` (a list of entries with ``name``, or a mapping name -> entry) -> the
    sources, each entry's data config instantiated (or a data module given as ``module``).

    Raises:
        ConfigError: no sources, a missing or duplicate name, a weight that is not > 0, a
            source that is not a caption data module, or an entry that is not a mapping.
    """
    from hydra.utils import instantiate

    sources = to_plain(sources)
    if isinstance(sources, Mapping):
        entries = [(str(k), v) for k, v in sources.items()]
    elif isinstance(sources, Sequence) and not isinstance(sources, str):
        entries = [(None, v) for v in sources]
    else:
        raise ConfigError(f"data.sources must be a list of sources or a mapping name -> source; "
                          f"got {type(sources).__name__}.")
    if not entries:
        raise ConfigError("data.sources is empty; give at least one source: {<a data config>, "
                          "weight: 1.0, name: ...}.")
    out: list[Source] = []
    for i, (key, entry) in enumerate(entries):
        where = f"data.sources.{key}" if key is not None else f"data.sources[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where} must be a data config with weight and name; got "
                              f"{entry!r}.")
        entry = dict(entry)
        name = entry.pop("name", None) or key
        if not name or not isinstance(name, str) or "/" in name:
            raise ConfigError(f"{where}: name ({name!r}) must be a non-empty string without '/'; "
                              f"set {where}.name (it names the source's metrics).")
        if name in {s.name for s in out}:
            raise ConfigError(f"{where}: the name {name!r} is used by two sources; give each "
                              f"its own name.")
        weight = entry.pop("weight", None)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or \
                not math.isfinite(weight) or weight <= 0:
            raise ConfigError(f"{where} ({name}): weight ({weight!r}) must be a number > 0; set "
                              f"{where}.weight.")
        token = entry.pop("prompt_token", None)
        if token is not None and (not isinstance(token, str) or not token.strip()):
            raise ConfigError(f"{where} ({name}): prompt_token ({token!r}) must be a non-empty "
                              f"string such as '<|{name}|>', or null.")
        evaluate = entry.pop("evaluate", True)
        module = entry.pop("module", None)
        if module is None:
            if "_target_" not in entry:
                raise ConfigError(f"{where} ({name}): no _target_; a source is a data config "
                                  f"(e.g. the defaults entry /data@data.sources.{name}: clotho) "
                                  f"plus weight and name.")
            module = instantiate(entry)
        elif entry:
            raise ConfigError(f"{where} ({name}): a given module takes no data keys; got "
                              f"{sorted(entry)}.")
        if not isinstance(module, CaptionDataModule):
            raise ConfigError(f"{where} ({name}): {type(module).__name__} is not a caption data "
                              f"module; a mixture mixes caption sets (CaptionDataModule).")
        if isinstance(module, MixtureDataModule):
            raise ConfigError(f"{where} ({name}): a mixture cannot be a source of a mixture; "
                              f"list its sources here with their weights.")
        out.append(Source(name=name, weight=float(weight), module=module, prompt_token=token,
                          evaluate=bool(evaluate)))
    return out


class MixtureDataModule(CaptionDataModule):
    """Caption sets mixed by weight (see the module doc).

    Args:
        sources: a list of ``{<data config>, weight, name, prompt_token, evaluate}`` or a
            mapping name -> ``{<data config>, weight, prompt_token, evaluate}``. ``weight``
            (> 0): the share of the training draws (normalised); ``prompt_token``: the source's
            prompt token (every source names one, or none does); ``evaluate``: validate and test
            on it (default true; false for a set without val/test splits).
        epoch_samples: training examples per epoch over all ranks (what ``__len__`` and the LR
            schedule count); None = the sum of the sources' examples per epoch.
        default_source: the source whose prompt token ends a trained tokenizer's prompt (what
            generation starts from when nothing else says); None = the first with a token.
        **kwargs: ``batches``, ``loader``, ``seed`` as :class:`MediaDataModule`; every other
            setting is each source's (:data:`PER_SOURCE`: an error here).

    Raises:
        ConfigError: bad sources, a source's setting given to the mixture, sources that differ
            in modality, sample rate or ``captions_per_item``, mixup on a source, prompt tokens
            on some sources only, or an unknown ``default_source``.
    """

    def __init__(self, *, sources: Any, epoch_samples: int | None = None,
                 default_source: str | None = None, **kwargs: Any) -> None:
        own = sorted(k for k in kwargs if k in PER_SOURCE)
        if own:
            raise ConfigError(f"data.{own[0]} is set on the mixture, but it is each source's "
                              f"setting; set data.sources.<name>.{own[0]} on the sources "
                              f"instead (mixture keys: sources, epoch_samples, default_source, "
                              f"batches, loader and seed).")
        self.sources = build_sources(sources)
        mods = [s.module for s in self.sources]
        _same(self.sources, "modality", "a mixture is of one modality (audio or images); put "
              "the other in its own run")
        if mods[0].modality == "audio":
            _same(self.sources, "sample_rate", "each source resamples to its own sample_rate; "
                  "set data.sources.<name>.sample_rate to one value")
        _same(self.sources, "captions_per_item", "set data.sources.<name>.captions_per_item "
              "alike")
        for s in self.sources:
            if s.module.mixup is not None:
                raise ConfigError(f"data.sources.{s.name}: augment.mixup mixes pairs of one "
                                  f"batch, which a mixture's batches span sources; set "
                                  f"data.sources.{s.name}.augment.mixup.p=0.")
        tokens = [s.prompt_token for s in self.sources]
        if any(tokens) and not all(tokens):
            raise ConfigError(f"data.sources: prompt_token is set on "
                              f"{[s.name for s in self.sources if s.prompt_token]} but not on "
                              f"{[s.name for s in self.sources if not s.prompt_token]}; give "
                              f"every source its token or none.")
        if len(set(tokens)) < len(tokens) and any(tokens):
            raise ConfigError(f"data.sources: two sources share a prompt_token ({tokens}); give "
                              f"each its own.")
        names = [s.name for s in self.sources]
        if default_source is not None and default_source not in names:
            raise ConfigError(f"data.default_source ({default_source!r}) must be one of {names}.")
        self.default_source = default_source or next(
            (s.name for s in self.sources if s.prompt_token), names[0])
        seconds = [m.max_seconds for m in mods]
        # The largest crop of any source: what the task checks against the encoder's limit.
        super().__init__(format="mixture", root=".", modality=mods[0].modality,
                         sample_rate=mods[0].sample_rate,
                         max_seconds=None if None in seconds else max(seconds),
                         max_caption_tokens=max(m.max_caption_tokens for m in mods),
                         captions_per_item=mods[0].captions_per_item, **kwargs)
        self.root = None              # no folder of its own: each source has its root
        self.epoch_samples = epoch_samples
        self._members: dict[str, list[int]] = {}
        self._offsets: dict[str, list[int]] = {}

    def _formats(self) -> Mapping[str, tuple[Any, str | None]]:
        return {"mixture": (None, None)}

    @property
    def source_names(self) -> tuple[str, ...]:   # type: ignore[override]
        """The sources validated and tested (``evaluate: true``)."""
        return tuple(s.name for s in self.sources if s.evaluate)

    def members(self, split: str) -> list[Source]:
        """The sources whose items make up ``split`` (training: all; val/test: ``evaluate``)."""
        return [s for s in self.sources if split == "train" or s.evaluate]

    # ------------------------------------------------------------------ reading
    def prepare_data(self) -> None:
        for s in self.sources:
            s.module.prepare_data()

    def items(self, split: str) -> list:
        """The sources' usable items of ``split``, concatenated in source order."""
        if split not in SPLITS:
            raise UserError(f"split ({split!r}) must be one of {SPLITS}.")
        if split not in self._items:
            members = self.members(split)
            if not members:
                raise ConfigError(f"data.sources: no source has evaluate: true, so the mixture "
                                  f"has no {split} split; set evaluate: true on one.")
            items, durations, offsets = [], [], []
            for s in members:
                mod = s.module
                offsets.append(len(items))
                part = mod.items(split)
                crop = mod.train_crop if split == "train" else mod.eval_crop
                limit = mod.max_seconds if crop != "full" else None
                # What each source's crop leaves: the lengths batches are bucketed by.
                durations += [min(d, limit) if limit else d for d in mod.durations(split)]
                items += part
            self._items[split], self._durations[split] = items, durations
            self._offsets[split] = offsets
            self._members[split] = [self.sources.index(s) for s in members]
            log.info("[data] mixture %s: %d items: %s", split, len(items), ", ".join(
                f"{s.name} {len(s.module.items(split))} ({s.module.format} at {s.module.root}"
                + (f", weight {s.weight / sum(x.weight for x in self.sources):.3f}"
                   if split == "train" else "") + ")" for s in members))
        return self._items[split]

    # ------------------------------------------------------------------ tokens
    def tokenizer_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """``spec`` plus, for a tokenizer mmtf trains (``bpe``), the sources' prompt tokens as
        special tokens and ``[<bos>, <default source's token>]`` as its prompt (unless
        ``tokenizer.prompt`` is set). Other kinds are not grown; :meth:`connect` checks them."""
        spec = dict(spec)
        tokens = [s.prompt_token for s in self.sources if s.prompt_token]
        if not tokens or spec.get("kind", "bpe") != "bpe":
            return spec
        have = list(spec.get("special_tokens") or [])
        spec["special_tokens"] = have + [t for t in tokens if t not in have]
        if spec.get("prompt") is None:
            default = next(s for s in self.sources if s.name == self.default_source)
            spec["prompt"] = ["<bos>", default.prompt_token]
        return spec

    def questions(self, split: str) -> list[dict[str, Any]]:
        """Every evaluated source's multiple-choice items, ids prefixed with the source's name
        (as :class:`MixtureDataset` prefixes them)."""
        return [{**q, "id": f"{s.name}/{q['id']}"} for s in self.members(split)
                for q in s.module.questions(split)]

    def train_captions(self) -> list[str]:
        """Every source's training texts (:meth:`CaptionDataModule.train_captions`)."""
        return [t for s in self.sources for t in s.module.train_captions()]

    def connect(self, tokenizer: Tokenizer, chat_template: ChatTemplate | None = None,
                media_token: str | None = None) -> None:
        """Build ids with ``tokenizer`` (every source too); it must hold the prompt tokens.
        With ``chat_template`` every source's items are chats (instruction sets, caption sets
        with their ``instruction``), mixed as they are.

        Raises:
            ConfigError: a source's prompt token is not a special token of ``tokenizer``, or
                its prompt does not end with one of the sources' tokens; prompt tokens with a
                chat template (the chat says what to do).
        """
        if chat_template is not None:
            marked = [s.name for s in self.sources if s.prompt_token]
            if marked:
                raise ConfigError(f"data.sources: prompt_token is set on {marked}, but a prefix "
                                  f"LLM's chats say the task in their user turn; set "
                                  f"prompt_token: null and give each caption source its "
                                  f"instruction (data.sources.<name>.instruction).")
        else:
            self._check_prompt_tokens(tokenizer)
        super().connect(tokenizer, chat_template, media_token)
        for s in self.sources:
            s.module.connect(tokenizer, chat_template, media_token)

    def _check_prompt_tokens(self, tokenizer: Tokenizer) -> None:
        ids = self._token_ids(tokenizer)
        if not ids:
            return
        special = tokenizer.special_ids
        missing = [f"{s.prompt_token} ({s.name})" for s in self.sources
                   if ids[s.name] is None or ids[s.name] not in special]
        if missing:
            raise ConfigError(
                f"data.sources: the prompt tokens {', '.join(missing)} are not special tokens of the "
                f"tokenizer ({type(tokenizer).__name__}, {tokenizer.vocab_size} tokens). mmtf "
                f"adds them when it trains the tokenizer (tokenizer=bpe); a pretrained, saved or "
                f"char tokenizer is not grown: use one that holds them, or set prompt_token: "
                f"null on every source.")
        prompt = tokenizer.prompt_ids
        if prompt[-1] not in ids.values():
            raise ConfigError(
                f"data.sources: the tokenizer's prompt "
                f"{[tokenizer.id_to_token(i) for i in prompt]} does not end with a source's "
                f"prompt token ({[s.prompt_token for s in self.sources]}), whose place it is; "
                f"set tokenizer.prompt=[<bos>,{self.sources[0].prompt_token}] (tokenizer=bpe "
                f"does so by itself).")

    def _token_ids(self, tokenizer: Tokenizer) -> dict[str, int | None]:
        return {s.name: tokenizer.token_to_id(s.prompt_token) for s in self.sources
                if s.prompt_token}

    def prompt(self) -> SourcePrompt:
        """Each source's prompt: its items' own, with its token in the prompt's last place."""
        return SourcePrompt(super().prompt(), self._token_ids(self.tokenizer))

    def _source_tokens(self, s: Source, split: str, prompt: SourcePrompt,
                       ) -> list[list[list[int]]]:
        """The source's token ids, its prompt token in the prompt's last place."""
        return [[prompt.mark(t, s.name) for t in per] for per in s.module.tokens(split)]

    def tokens(self, split: str) -> list[list[list[int]]]:
        if split not in self._tokens and self.chats:      # each source's chats, in order
            self.items(split)
            self._tokens[split] = [per for s in self.members(split)
                                   for per in s.module.tokens(split)]
        if split not in self._tokens:
            if self.tokenizer is None:
                super().tokens(split)        # its error: connect a tokenizer first
            self.items(split)
            prompt = self.prompt()
            self._tokens[split] = [per for s in self.members(split)
                                   for per in self._source_tokens(s, split, prompt)]
        return self._tokens[split]

    # ------------------------------------------------------------------ loading
    def _pixels(self, split: str) -> list[int]:
        # Each source's images through its own transforms, in the mixture's item order.
        return [n for s in self.members(split) for n in s.module._pixels(split)]

    def _sampler(self, split: str, **kwargs: Any) -> BucketBatchSampler:
        if split != "train":
            return super()._sampler(split, **kwargs)
        self.items(split)
        return MixtureSampler(
            sources=[s.module.batch_sampler("train") for s in self.sources],
            weights=[s.weight for s in self.sources], names=[s.name for s in self.sources],
            offsets=self._offsets["train"], epoch_samples=self.epoch_samples, **kwargs)

    def _dataset(self, split: str, crop: str) -> MixtureDataset:
        self.tokens(split)
        parts = []
        for s, offset in zip(self.members(split), self._offsets[split]):
            mod = s.module
            # The source builds its own dataset (its crops, transforms, augmentation) from
            # the ids it caches; hand it the ids with its prompt token.
            mod._tokens[split] = self._tokens[split][offset:offset + len(mod.items(split))]
            parts.append(mod._dataset(split, mod.train_crop if split == "train"
                                      else mod.eval_crop))
        return MixtureDataset(parts, names=[s.name for s in self.members(split)],
                              offsets=self._offsets[split],
                              num_captions=self._num_captions(split) if split == "train"
                              else None)

    def _collate(self, split: str) -> MixtureCollate:
        return MixtureCollate(**self._collate_kwargs(split))

    @property
    def error_summary(self) -> dict[str, ErrorCounter]:
        """Each source's problems (reading and probing), and the mixture's (loading)."""
        return {**{s.name: s.module.error_counts for s in self.sources},
                "mixture": self.error_counts}

    def _log_error_summary(self) -> None:
        for name, counter in self.error_summary.items():
            if counter:
                log.warning("[data] mixture source %s, all epochs so far: %s", name,
                            counter.summary())


def _same(sources: list[Source], attr: str, fix: str) -> None:
    values = {s.name: getattr(s.module, attr) for s in sources}
    if len(set(values.values())) > 1:
        raise ConfigError(f"data.sources: {attr} differs between sources "
                          f"({', '.join(f'{n}={v!r}' for n, v in values.items())}); {fix}.")
