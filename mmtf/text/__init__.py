"""Tokenizers: BPE (trained with HuggingFace `tokenizers`) and character-level.

Specials are fixed ids in every tokenizer: ``<pad>=0, <bos>=1, <eos>=2, <unk>=3``.
"""

from mmtf.text.base import SPECIAL_TOKENS, Tokenizer, load_tokenizer
from mmtf.text.bpe import BPETokenizer
from mmtf.text.char import CharTokenizer

__all__ = ["SPECIAL_TOKENS", "BPETokenizer", "CharTokenizer", "Tokenizer", "load_tokenizer"]
