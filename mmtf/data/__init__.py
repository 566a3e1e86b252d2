"""mmtf data: dataset formats, audio/image I/O, batching, DataModules.

Public API::

    CaptionDataModule, ClassificationDataModule      LightningDataModules (Hydra `_target_`)
    BatchOptions, LoaderOptions                      their batching and loader parts
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

from mmtf.data.audio import audio_info, load_audio, resample
from mmtf.data.collate import Collate
from mmtf.data.datamodule import (
    BatchOptions,
    CaptionDataModule,
    ClassificationDataModule,
    LoaderOptions,
)
from mmtf.data.errors import ErrorCounter
from mmtf.data.image import build_eval_image_transform, build_transform, load_image
from mmtf.data.loader import make_loader
from mmtf.data.sampler import BucketBatchSampler, SamplerState, padding_fraction, sample_rng
from mmtf.data.shards import ShardDataModule, ShardStreamSampler
from mmtf.errors import DataError

__all__ = [
    "BatchOptions", "BucketBatchSampler", "CaptionDataModule", "ClassificationDataModule", "Collate",
    "DataError", "ErrorCounter", "LoaderOptions", "SamplerState", "ShardDataModule", "ShardStreamSampler",
    "audio_info", "build_eval_image_transform",
    "build_transform",
    "load_audio", "load_image", "make_loader",
    "padding_fraction", "resample", "sample_rng",
]
