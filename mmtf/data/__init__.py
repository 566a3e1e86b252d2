"""mmtf data: dataset formats, audio/image I/O, batching, DataModules (the names in ``__all__``).

The built-in (generated) sets live one layer up, in :mod:`mmtf.synthetic`; nothing here
imports them."""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use (PEP 562): predicting reads audio and images through mmtf.data and
# must not load the data modules, the shard reader and the loaders with them.
_LAZY = {
    "audio_info": "mmtf.data.audio", "load_audio": "mmtf.data.audio",
    "resample": "mmtf.data.audio", "Collate": "mmtf.data.collate",
    "CaptionDataModule": "mmtf.data.datamodule", "BatchOptions": "mmtf.data.datamodule",
    "LoaderOptions": "mmtf.data.datamodule",
    "ClassificationDataModule": "mmtf.data.datamodule", "ErrorCounter": "mmtf.data.errors",
    "QADataModule": "mmtf.data.datamodule",
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
    "BatchOptions", "BucketBatchSampler", "CaptionDataModule", "ClassificationDataModule", "Collate",
    "DataError", "ErrorCounter", "LoaderOptions", "QADataModule", "SamplerState", "ShardDataModule", "ShardStreamSampler",
    "audio_info", "build_eval_image_transform",
    "build_transform",
    "load_audio", "load_image", "make_loader",
    "padding_fraction", "resample", "sample_rng",
]
