"""Tokenizers: BPE (trained with HuggingFace `tokenizers`), character-level, and pretrained
(any ``tokenizer.json`` with its own special ids and decoder prompt).

mmtf's own tokenizers fix the specials at ``<pad>=0, <bos>=1, <eos>=2, <unk>=3``; every
tokenizer names its ids (``pad_id``, ``bos_id``, ``eos_id``) and ``prompt_ids``.
"""

from mmtf.text.base import SPECIAL_TOKENS, Tokenizer, load_tokenizer
from mmtf.text.bpe import BPETokenizer
from mmtf.text.char import CharTokenizer
from mmtf.text.pretrained import PretrainedTokenizer

__all__ = ["SPECIAL_TOKENS", "BPETokenizer", "CharTokenizer", "PretrainedTokenizer", "Tokenizer",
           "load_tokenizer"]
