"""Encoders: audio (log-mel + conv stem + transformer) and vision (ViT), one calling convention.

``out = encoder(inputs, lengths=None)`` returns ``EncoderOutput(memory (b, s, c), mask (b, s))``
and ``encoder.dim`` is c, so any encoder plugs into any decoder or downstream head.
"""

from mmtf.encoders.audio import AudioEncoder, ConvStem, LogMelFrontEnd, SpecAugment
from mmtf.encoders.base import Encoder, EncoderOutput, pool
from mmtf.encoders.vision import VisionEncoder

__all__ = ["AudioEncoder", "ConvStem", "Encoder", "EncoderOutput", "LogMelFrontEnd",
           "SpecAugment", "VisionEncoder", "pool"]
