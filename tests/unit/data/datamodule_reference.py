"""Digests of every batch of seeded data modules built from flat (pre-#39) data configs.

``python tests/unit/data/datamodule_reference.py OUT.json DATA_DIR`` with ``PYTHONPATH`` at the
pre-#39 code wrote ``datamodule_reference.json``; :mod:`tests.unit.data.test_datamodule` builds
the same configs through today's constructors (flat keys mapped by
:func:`mmtf.utils.parts.upgrade_config`) and compares.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

# Flat data configs as a pre-#39 run stored them (root filled in), one per batching path.
CONFIGS: dict[str, dict[str, Any]] = {
    "audio_buckets": {"_target_": "mmtf.data.CaptionDataModule", "format": "clotho",
                      "max_seconds": 1.5, "batch_size": 2, "eval_batch_size": 3,
                      "bucketing": True, "bucket_size": 2, "drop_last": True,
                      "num_workers": 0, "persistent_workers": False, "pin_memory": False,
                      "train_crop": "start", "eval_crop": "center", "image_cache_mb": 1,
                      "seed": 5, "captions_per_item": 2},
    "audio_budget": {"_target_": "mmtf.data.CaptionDataModule", "format": "clotho",
                     "max_seconds": 2.0, "batch_size": None, "max_seconds_per_batch": 3.2,
                     "eval_max_seconds_per_batch": 4.0, "seed": 1},
    "image_budget": {"_target_": "mmtf.data.CaptionDataModule", "format": "coco",
                     "batch_size": None, "max_pixels_per_batch": 3000, "bucketing": False,
                     "seed": 2},
}
ROOTS = {"audio_buckets": "audio_captions", "audio_budget": "audio_captions",
         "image_budget": "image_captions"}


def digest(dm: Any) -> str:
    """sha256 over every train (2 epochs) and val batch: ids, tokens and the media bytes."""
    from mmtf.text import BPETokenizer

    dm.setup("fit")
    dm.connect(BPETokenizer.train(dm.train_captions(), vocab_size=120))
    h = hashlib.sha256()
    loaders = [dm.train_dataloader(), dm.train_dataloader(), dm.val_dataloader()]
    for epoch, loader in enumerate(loaders):
        if hasattr(loader.batch_sampler, "set_epoch"):
            loader.batch_sampler.set_epoch(min(epoch, 1))
        for batch in loader:
            h.update(json.dumps(list(batch["ids"])).encode())
            for key in ("tokens", "audio", "audio_lengths", "images"):
                if isinstance(batch.get(key), torch.Tensor):
                    h.update(batch[key].contiguous().numpy().tobytes())
    return h.hexdigest()


if __name__ == "__main__":
    from hydra.utils import instantiate

    from mmtf.synthetic import ensure_synthetic

    data = Path(sys.argv[2])
    roots = {"audio_captions": ensure_synthetic(
        data / "audio_captions", "audio_captions", num_train=6, num_val=3, num_test=3,
        min_seconds=1.0, max_seconds=2.0, seed=0), "image_captions": ensure_synthetic(
        data / "image_captions", "image_captions", num_train=6, num_val=3, num_test=3,
        image_size=32, seed=0)}
    out = {name: digest(instantiate({**cfg, "root": str(roots[ROOTS[name]])}))
           for name, cfg in CONFIGS.items()}
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
