"""The attention core and the transformer building blocks every mmtf model runs through."""

from mmtf.nn.attention import Attention
from mmtf.nn.kv_cache import KVCache
from mmtf.nn.rope import RotaryEmbedding
from mmtf.nn.transformer import MLP, TransformerBlock, TransformerStack, make_norm

__all__ = ["MLP", "Attention", "KVCache", "RotaryEmbedding", "TransformerBlock",
           "TransformerStack", "make_norm"]
