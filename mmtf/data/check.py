"""Scan a dataset and report everything wrong with it: ``python -m mmtf.data.check``.

Usage::

    python -m mmtf.data.check data=clotho data.root=/data/clotho [splits=[val]] [decode=true]

Builds the dataset from the ``conf/data/<name>.yaml`` training uses, checks every file (in full
with ``decode=true``) whatever ``data.on_error`` says, prints counts, histograms, vocabulary and
every problem with its fix. Exit status 1 when anything was found."""

from __future__ import annotations

import re
import sys
from collections import Counter
from typing import Any

import hydra
import numpy as np
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from mmtf.data.audio import load_audio
from mmtf.data.errors import ErrorCounter
from mmtf.data.image import load_image
from mmtf.data.mixture import MixtureDataModule
from mmtf.data.shards.index import ShardItem
from mmtf.data.shards.reader import read_member
from mmtf.errors import DataError
from mmtf.metrics.aqa import LETTERS
from mmtf.text import build_tokenizer
from mmtf.utils.config_dir import CONF_DIR


class _Collector:
    """An on_error policy that never raises: keeps every problem."""

    def __init__(self) -> None:
        self.errors: list[DataError] = []
        self.counter = ErrorCounter()

    def __call__(self, err: DataError) -> None:
        if any(str(e) == str(err) for e in self.errors[-20:]):
            return  # a whole-file problem met again by the next split
        self.errors.append(err)
        self.counter.add_error(err)


def _histogram(values: list[float], unit: str, bins: int = 8) -> list[str]:
    if not values:
        return []
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9:
        return [f"  {lo:8.2f} {unit}: {len(values)}"]
    counts, edges = np.histogram(values, bins=bins, range=(lo, hi))
    width = max(counts)
    return [f"  {edges[i]:7.2f}-{edges[i + 1]:<7.2f}{unit} {c:7d} {'#' * int(40 * c / width)}"
            for i, c in enumerate(counts)]


def _scan_split(dm: Any, split: str, collector: _Collector, decode: bool) -> dict[str, Any]:
    """Read, probe and (optionally) decode one split; problems go to ``collector``."""
    dm.policy = collector  # the module's own readers and probe, but every problem is kept
    items = dm.items(split)
    durations = dm.durations(split)
    sizes: Counter[str] = Counter()
    good = 0
    for item in items if decode else []:
        try:
            data = read_member(item) if isinstance(item, ShardItem) else None
            if dm.modality == "audio":
                load_audio(item.path, sample_rate=None, crop="full", channels=dm.channels,
                           where=item.where, check_header=False, data=data)
            else:
                img = load_image(item.path, where=item.where, data=data)
                sizes[f"{img.shape[2]}x{img.shape[1]}"] += 1
            good += 1
        except DataError as e:
            collector(e)
    return {"items": items, "durations": durations, "sizes": sizes,
            "decoded": good if decode else None}


def run_check(cfg: DictConfig) -> int:
    """Scan ``cfg.data``; print the report; return the number of problems found. A mixture
    (``data=mixture``) is reported source by source, then its weights and expected draws."""
    dm = instantiate(cfg.data)
    if not isinstance(dm, MixtureDataModule):
        return _check_module(cfg, dm, cfg.splits)
    print(f"mmtf data check: mixture of {len(dm.sources)} sources ({dm.modality}, captions)")
    problems = 0
    for s in dm.sources:
        print(f"\n=== source {s.name} ===")
        problems += _check_module(cfg, s.module, [split for split in cfg.splits
                                                  if split == "train" or s.evaluate])
    total = sum(s.weight for s in dm.sources)
    per_epoch = dm.epoch_samples
    if per_epoch is None:
        per_epoch = sum(len(s.module.items("train")) for s in dm.sources)
    print(f"\nMixture: {per_epoch} training examples per epoch "
          f"({'data.epoch_samples' if dm.epoch_samples else 'the sources sum'}), drawn by weight:")
    for s in dm.sources:
        n = len(s.module.items("train"))
        share = s.weight / total
        print(f"  source {s.name}: weight {share:.3f} ({n} train items), ~{share * per_epoch:.0f} "
              f"draws per epoch (~{share * per_epoch / max(n, 1):.2f} per item)"
              + (f", prompt token {s.prompt_token}" if s.prompt_token else "")
              + ("" if s.evaluate else ", not evaluated"))
    print(f"\n{'FAILED' if problems else 'OK'}: {problems} problem(s) over the sources")
    return problems


def _check_module(cfg: DictConfig, dm: Any, splits: list[str]) -> int:
    """The report of one data module (a mixture's source: one of them)."""
    collector = _Collector()
    kind = {"caption": "captions", "qa": "questions"}.get(dm.targets, "labels")
    print(f"mmtf data check: {dm.format} ({dm.modality}, {kind}) at {dm.root}")
    try:
        dm.prepare_data()
    except DataError as e:
        collector(e)
    results: dict[str, dict[str, Any]] = {}
    for split in splits:
        try:
            results[split] = _scan_split(dm, split, collector, cfg.decode)
        except DataError as e:  # a whole-file problem: missing split, missing columns, ...
            collector(e)
    column = {"captions": "captions", "questions": "clips"}.get(kind, "classes")
    print(f"\n{'split':<6} {'items':>7} {column:>9} "
          + ("  hours    min    median   max (s)" if dm.modality == "audio" else "  decoded"))
    all_durations: list[float] = []
    for split, r in results.items():
        items = r["items"]
        extra = (sum(len(it.captions) for it in items) if kind == "captions" else
                 len({it.path for it in items}) if kind == "questions" else
                 len({it.label for it in items}))
        if dm.modality == "audio":
            d = r["durations"] or [0.0]
            all_durations += r["durations"]
            stats = f"{sum(d) / 3600:7.2f} {min(d):6.2f} {float(np.median(d)):8.2f} {max(d):7.2f}"
        else:
            stats = f"{r['decoded'] if r['decoded'] is not None else '-':>9}"
        print(f"{split:<6} {len(items):>7} {extra:>9} {stats}")
    shards = {split: len({it.shard for it in r["items"]}) for split, r in results.items()
              if r["items"] and isinstance(r["items"][0], ShardItem)}
    if shards:        # problems below name the shard and the sample's key
        print("\nShards read: " + ", ".join(f"{split} {n}" for split, n in shards.items()))
    if dm.modality == "audio" and all_durations:
        print("\nDuration histogram (all splits):")
        print("\n".join(_histogram(all_durations, "s")))
    elif results:
        sizes = sum((r["sizes"] for r in results.values()), Counter())
        if sizes:
            print("\nImage sizes (w x h): " + ", ".join(f"{s}: {n}" for s, n in
                                                         sizes.most_common(8)))
    if kind == "labels" and results and dm.class_names is not None:
        counts = Counter(it.label for r in results.values() for it in r["items"])
        print(f"\nClasses ({dm.num_classes}): " + ", ".join(
            f"{name}={counts.get(k, 0)}" for k, name in enumerate(dm.class_names)))
    if kind == "questions" and results:
        questions = [it for r in results.values() for it in r["items"]]
        types = Counter(it.question_type for it in questions)
        letters = Counter(LETTERS[it.choices.index(it.answer)] for it in questions)
        print(f"\nQuestion types: {', '.join(f'{t}={n}' for t, n in sorted(types.items()))}; "
              f"right letters: {', '.join(f'{x}={n}' for x, n in sorted(letters.items()))}")
    if kind == "captions" and results:
        texts = [c for r in results.values() for it in r["items"] for c in it.captions]
        words = Counter(w for t in texts for w in re.findall(r"[\w']+", t.lower()))
        print(f"\nVocabulary: {len(words)} distinct words in {len(texts)} captions; "
              f"most common: {', '.join(w for w, _ in words.most_common(10))}")
        chats = sum(it.messages is not None or bool(getattr(dm, "instruction", None))
                    for r in results.values() for it in r["items"])
        if chats:       # a prefix LLM's: encoded with the task's chat template, not here
            print(f"Chats: {chats} item(s) are conversations for a prefix LLM; they are "
                  f"encoded with its tokenizer and chat template when it trains")
        elif "train" in results and results["train"]["items"]:
            dm.error_counts = ErrorCounter()
            spec = OmegaConf.to_container(cfg.tokenizer, resolve=True)
            dm.connect(build_tokenizer(spec, dm.train_captions))   # what a fresh run would use
            for split in results:
                dm.tokens(split)
            n_trunc = dm.error_counts["caption_truncated"]
            print(f"Tokenizer ({spec.get('kind', 'bpe')}): "
                  f"{dm.tokenizer.vocab_size} tokens; {n_trunc} caption(s) longer than "
                  f"max_caption_tokens={dm.max_caption_tokens}")
            collector.counter.merge(dm.error_counts)  # truncation counts and examples
    n = collector.counter.total
    if collector.errors or n:
        print(f"\nProblems ({n}):")
        for err in collector.errors[: cfg.max_listed]:
            print(f"  [{err.reason}] {err}")
        if len(collector.errors) > cfg.max_listed:
            print(f"  ... and {len(collector.errors) - cfg.max_listed} more (max_listed="
                  f"{cfg.max_listed})")
        for where in collector.counter.examples.get("caption_truncated", []):
            print(f"  [caption_truncated] {where}: longer than max_caption_tokens; raise "
                  f"data.max_caption_tokens or shorten it")
        print(f"\nFAILED: {collector.counter.summary()}")
    else:
        print("\nOK: no problems found")
    return n


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="data_check")
def main(cfg: DictConfig) -> None:
    """Entry point; exits with status 1 when problems were found."""
    if run_check(cfg):
        sys.exit(1)


if __name__ == "__main__":
    main()
