"""Encoders: audio (log-mel + conv stem + transformer), vision (ViT) and text (token ids; BERT
configured), one calling convention.

``out = encoder(inputs, lengths=None)`` returns ``EncoderOutput(memory (b, s, c), mask (b, s))``
and ``encoder.dim`` is c, so any encoder plugs into any decoder or downstream head.
"""

from mmtf.encoders.audio import AudioEncoder, ConvStem, LogMelFrontEnd, SpecAugment
from mmtf.encoders.base import Encoder, EncoderOutput, pool
from mmtf.encoders.text import PoolingOptions, TextEmbedder, TextEncoder
from mmtf.encoders.vision import VisionEncoder

__all__ = ["AudioEncoder", "ConvStem", "Encoder", "EncoderOutput", "LogMelFrontEnd",
           "PoolingOptions", "SpecAugment", "TextEmbedder", "TextEncoder", "VisionEncoder", "pool"]
