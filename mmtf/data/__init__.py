"""mmtf data: built-in synthetic sets, dataset formats, audio/image I/O, batching, DataModules.

Public API::

    CaptionDataModule, ClassificationDataModule      LightningDataModules (Hydra `_target_`)
    load_audio(path, sample_rate=, max_seconds=)      -> (s,) float32 mono waveform
    load_image(path)                                  -> (3, h, w) uint8 RGB
    build_eval_image_transform(data_cfg)              the eval image pipeline of a data config
    DataError, ErrorCounter                           bad input: raise or skip-and-count
    BucketBatchSampler, SamplerState, Collate         batching (one resumable sampler)
    make_loader, sample_rng, padding_fraction         loaders, per-item randomness, padding
    ensure_synthetic(root, kind, **params)            generate a built-in set (cached, atomic)

Caption parsers of the synthetic sets: ``mmtf.data.synthetic_audio.parse_caption`` and
``mmtf.data.synthetic_image.parse_caption`` (``datamodule.caption_parser``), scored by
``mmtf.metrics.event_sequence_accuracy``.
"""

from mmtf.data.audio import audio_info, load_audio, resample
from mmtf.data.collate import Collate
from mmtf.data.datamodule import CaptionDataModule, ClassificationDataModule
from mmtf.data.errors import ErrorCounter
from mmtf.data.image import build_eval_image_transform, build_transform, load_image
from mmtf.data.loader import make_loader
from mmtf.data.sampler import BucketBatchSampler, SamplerState, padding_fraction, sample_rng
from mmtf.data.synthetic import ensure_synthetic
from mmtf.errors import DataError

__all__ = [
    "BucketBatchSampler", "CaptionDataModule", "ClassificationDataModule", "Collate",
    "DataError", "ErrorCounter", "SamplerState", "audio_info", "build_eval_image_transform",
    "build_transform",
    "ensure_synthetic", "load_audio", "load_image", "make_loader",
    "padding_fraction", "resample", "sample_rng",
]
