"""Turn any mmtf caption set into WebDataset tar shards: ``python -m mmtf.data.shard``.

Usage::

    python -m mmtf.data.shard out=/data/synth_shards                      # the built-in audio set
    python -m mmtf.data.shard data=clotho data.root=/data/clotho out=/data/clotho_shards
    python -m mmtf.data.shard data=coco_captions data.root=/data/coco out=DIR shard_size=5000
    python -m mmtf.train experiment=audio_captioning data=shards data.root=/data/clotho_shards

The data set is built from the same ``conf/data/<name>.yaml`` training uses and read with its
reader (bad items are raised, or skipped and counted under ``data.on_error=skip``, as in
training); each split is written by :func:`mmtf.data.formats.shards.write_shards` to
``<out>/<split>/<split>-000000.tar`` ... with the index of each beside it. Printed: per split the
items, shards and bytes written, and the ``data.shards`` value that reads them back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig

from mmtf.data.formats.shards import write_shards
from mmtf.errors import ConfigError
from mmtf.utils.config import run_cli
from mmtf.utils.config_dir import CONF_DIR


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
    for split in cfg.splits:
        items = dm.items(split)
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


if __name__ == "__main__":
    main()
