"""mmtf data: dataset formats, audio/image I/O, batching, DataModules.

Public API::

    CaptionDataModule, ClassificationDataModule      LightningDataModules (Hydra `_target_`)
    ShardDataModule, ShardStreamSampler              tar shards read as streams (data=shards)
    load_audio(path, sample_rate=, max_seconds=)      -> (s,) float32 mono waveform
    load_image(path)                                  -> (3, h, w) uint8 RGB
    build_eval_image_transform(data_cfg)              the eval image pipeline of a data config
    DataError, ErrorCounter                           bad input: raise or skip-and-count
    BucketBatchSampler, SamplerState, Collate         batching (one resumable sampler)
    make_loader, sample_rng, padding_fraction         loaders, per-item randomness, padding

The built-in (generated) sets and their data modules live one layer up, in :mod:`mmtf.synthetic`:
they write the formats read here; nothing here imports them.
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use (PEP 562): predicting reads audio and images through mmtf.data and
# must not load the data modules, the shard reader and the loaders with them.
_LAZY = {
    "audio_info": "mmtf.data.audio", "load_audio": "mmtf.data.audio",
    "resample": "mmtf.data.audio", "Collate": "mmtf.data.collate",
    "CaptionDataModule": "mmtf.data.datamodule",
    "ClassificationDataModule": "mmtf.data.datamodule", "ErrorCounter": "mmtf.data.errors",
    "build_eval_image_transform": "mmtf.data.image", "build_transform": "mmtf.data.image",
    "load_image": "mmtf.data.image", "make_loader": "mmtf.data.loader",
    "BucketBatchSampler": "mmtf.data.sampler", "SamplerState": "mmtf.data.sampler",
    "padding_fraction": "mmtf.data.sampler", "sample_rng": "mmtf.data.sampler",
    "ShardDataModule": "mmtf.data.shards", "ShardStreamSampler": "mmtf.data.shards",
    "DataError": "mmtf.errors",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mmtf.data' has no attribute {name!r}")


__all__ = [
    "BucketBatchSampler", "CaptionDataModule", "ClassificationDataModule", "Collate",
    "DataError", "ErrorCounter", "SamplerState", "ShardDataModule", "ShardStreamSampler",
    "audio_info", "build_eval_image_transform",
    "build_transform",
    "load_audio", "load_image", "make_loader",
    "padding_fraction", "resample", "sample_rng",
]
