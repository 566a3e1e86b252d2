"""The attention core and the transformer building blocks every mmtf model runs through."""

from mmtf.nn.attention import Attention
from mmtf.nn.embedding import EmbeddingOptions, TokenEmbedding
from mmtf.nn.kv_cache import KVCache
from mmtf.nn.linear import Linear, packed_linear_weights
from mmtf.nn.positions import FixedPositions, LearnedPositions, sinusoidal_table
from mmtf.nn.rope import RotaryEmbedding
from mmtf.nn.transformer import MLP, BlockOptions, TransformerBlock, TransformerStack, make_norm

__all__ = ["MLP", "Attention", "BlockOptions", "EmbeddingOptions", "FixedPositions", "KVCache",
           "LearnedPositions", "Linear", "RotaryEmbedding", "TokenEmbedding", "TransformerBlock",
           "TransformerStack", "make_norm", "packed_linear_weights", "sinusoidal_table"]
