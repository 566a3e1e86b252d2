"""Text decoders and generation: ``TextDecoder``, ``EncoderDecoder``, greedy/beam/sampling."""

from mmtf.decoders.encoder_decoder import EncoderDecoder, Seq2SeqOutput
from mmtf.decoders.generation import GenerationConfig, GenerationOutput, generate
from mmtf.decoders.text import DecoderCache, TextDecoder

__all__ = ["DecoderCache", "EncoderDecoder", "GenerationConfig", "GenerationOutput",
           "Seq2SeqOutput", "TextDecoder", "generate"]
