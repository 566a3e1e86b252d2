"""mmtf data: dataset formats, audio/image I/O, batching, DataModules (the names in ``__all__``).

The built-in (generated) sets live one layer up, in :mod:`mmtf.synthetic`; nothing here
imports them."""

from mmtf.data.audio import audio_info, load_audio, resample
from mmtf.data.collate import Collate
from mmtf.data.datamodule import CaptionDataModule, ClassificationDataModule
from mmtf.data.errors import ErrorCounter
from mmtf.data.image import build_eval_image_transform, build_transform, load_image
from mmtf.data.loader import make_loader
from mmtf.data.sampler import BucketBatchSampler, SamplerState, padding_fraction, sample_rng
from mmtf.data.shards.reader import ShardDataModule, ShardStreamSampler
from mmtf.errors import DataError

__all__ = [
    "BucketBatchSampler", "CaptionDataModule", "ClassificationDataModule", "Collate",
    "DataError", "ErrorCounter", "SamplerState", "ShardDataModule", "ShardStreamSampler",
    "audio_info", "build_eval_image_transform",
    "build_transform",
    "load_audio", "load_image", "make_loader",
    "padding_fraction", "resample", "sample_rng",
]
