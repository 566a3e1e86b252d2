"""Writing shards: :func:`write_shards`, and ``python -m mmtf.data.shard`` (:func:`main`), which
writes each split of any caption or instruction set (``conf/shard.yaml``; the same
``conf/data/<name>.yaml`` and reader as training, so bad items raise or are skipped and counted
as there; ``data.instruction`` is written with each caption item) to
``<out>/<split>/<split>-000000.tar`` ... with the index of each beside it.
"""

from __future__ import annotations

import dataclasses
import glob
import io
import json
import os
import re
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.utils import instantiate
from omegaconf import DictConfig

from mmtf.data.formats.base import CaptionItem
from mmtf.data.shards.index import INDEX_SUFFIX, ShardItem, _write_json, scan_shard
from mmtf.data.shards.reader import read_member
from mmtf.errors import ConfigError
from mmtf.utils.config import run_cli
from mmtf.utils.config_dir import CONF_DIR

__all__ = ["main", "shard_dataset", "write_shards"]


def _key(item_id: str, seen: set[str]) -> str:
    """A WebDataset key for ``item_id``: no dots (they start the extension) or slashes."""
    key = re.sub(r"[^A-Za-z0-9_-]+", "_", item_id).strip("_") or "sample"
    base, n = key, 1
    while key in seen:
        key, n = f"{base}_{n}", n + 1
    seen.add(key)
    return key


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644   # the same bytes on every run
    tar.addfile(info, io.BytesIO(data))


def write_shards(items: Sequence[CaptionItem], out_dir: str | os.PathLike, *, prefix: str,
                 shard_size: int = 1000, shard_bytes: int | None = None,
                 shuffle_seed: int | None = 0) -> list[Path]:
    """Write ``items`` as shards ``<out_dir>/<prefix>-000000.tar`` ... with their indexes; media
    bytes are copied unchanged, captions, id, language and task go to ``<key>.json``, and an
    instruction item's ``messages`` (a multiple-choice one's ``question``, ``question_type``,
    ``choices``, ``answer``), a caption item's ``instruction``.

    Args:
        items: any caption items (files, or members of other shards).
        out_dir: the folder (created).
        prefix: the shard file names' prefix (the split).
        shard_size: samples per shard.
        shard_bytes: also start a new shard before one would pass this many bytes.
        shuffle_seed: write the items in an order shuffled by this seed (so each shard mixes
            the whole set, as a sorted source would not); None keeps their order.

    Returns:
        The shard paths.
    """
    if shard_size < 1 or (shard_bytes is not None and shard_bytes < 1):
        raise ConfigError(f"shard_size ({shard_size}) and shard_bytes ({shard_bytes}) must be "
                          f">= 1 (shard_bytes may be null).")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in glob.glob(str(out / f"{glob.escape(prefix)}-*.tar*")):
        os.remove(stale)            # a shorter rewrite must not leave old shards behind
    order = list(range(len(items)))
    if shuffle_seed is not None:
        order = [int(k) for k in np.random.default_rng(shuffle_seed).permutation(len(items))]
    groups: list[list[int]] = []
    size = 0
    for k in order:                 # which items go to which shard (headers: ~3 blocks each)
        item = items[k]
        grow = (item.size if isinstance(item, ShardItem) else Path(item.path).stat().st_size) \
            + 4 * 512
        if not groups or len(groups[-1]) >= shard_size or (
                shard_bytes and size + grow > shard_bytes and groups[-1]):
            groups.append([])
            size = 0
        groups[-1].append(k)
        size += grow
    seen: set[str] = set()
    paths: list[Path] = []
    for group in groups:
        path = out / f"{prefix}-{len(paths):06d}.tar"
        tmp = path.with_suffix(".tar.tmp")
        with tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tar:
            for k in group:
                item = items[k]
                key = _key(item.id, seen)
                meta: dict[str, Any] = {"id": item.id, "captions": list(item.captions)}
                meta.update({n: v for n, v in (("language", item.language),
                                               ("task", item.task),
                                               ("instruction", item.instruction)) if v})
                if item.messages is not None:       # an instruction item: its chat, as read
                    meta["messages"] = [dict(m) for m in item.messages]
                if item.qa is not None:
                    meta.update(dataclasses.asdict(item.qa))
                ext = Path(str(item.path)).suffix.lower() or ".bin"
                _add(tar, f"{key}{ext}", read_member(item) if isinstance(item, ShardItem)
                     else Path(item.path).read_bytes())
                _add(tar, f"{key}.json", json.dumps(meta, ensure_ascii=False).encode("utf-8"))
        os.replace(tmp, path)
        _write_json(Path(str(path) + INDEX_SUFFIX), scan_shard(str(path)))
        paths.append(path)
    return paths


def shard_dataset(cfg: DictConfig) -> dict[str, list[Path]]:
    """Write the splits ``cfg.splits`` of ``cfg.data`` as shards under ``cfg.out``.

    Returns:
        The shard paths per split.
    """
    dm: Any = instantiate(cfg.data)
    if dm.targets != "caption":
        raise ConfigError(f"python -m mmtf.data.shard writes caption sets; format {dm.format} is "
                          f"a {dm.targets} set.")
    out = Path(str(cfg.out)).expanduser().resolve()
    written: dict[str, list[Path]] = {}
    print(f"mmtf shard: {dm.format} ({dm.modality}) at {dm.root} -> {out}")
    instruction = getattr(dm, "instruction", None)
    for split in cfg.splits:
        items = dm.items(split)
        if instruction:             # data.instruction travels with the caption items
            items = [item if item.messages is not None or item.instruction else
                     dataclasses.replace(item, instruction=instruction) for item in items]
        paths = write_shards(items, out / split, prefix=split, shard_size=int(cfg.shard_size),
                             shard_bytes=None if cfg.shard_bytes is None else int(cfg.shard_bytes),
                             shuffle_seed=int(cfg.seed) if cfg.shuffle else None)
        written[split] = paths
        size = sum(p.stat().st_size for p in paths)
        print(f"  {split}: {len(items)} items -> {len(paths)} shard(s), {size / 2**20:.1f} MiB: "
              f"data.shards.{split}='{split}/{split}-{{000000..{len(paths) - 1:06d}}}.tar'")
    if dm.error_counts:
        print(f"  skipped: {dm.error_counts.summary()}")
    print(f"read them with: data={'shards' if dm.modality == 'audio' else 'shards_image'} "
          f"data.root={out}")
    return written


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="shard")
def main(cfg: DictConfig) -> None:
    """Entry point; a user error exits with status 2 and one line."""
    run_cli(shard_dataset, cfg)
