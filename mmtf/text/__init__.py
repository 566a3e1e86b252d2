"""Tokenizers: BPE (trained with HuggingFace `tokenizers`), character-level, and pretrained
(any ``tokenizer.json`` with its own special ids and decoder prompt); :func:`build_tokenizer`
makes one from the ``tokenizer`` config node.

mmtf's own tokenizers fix the specials at ``<pad>=0, <bos>=1, <eos>=2, <unk>=3``; every
tokenizer names its ids (``pad_id``, ``bos_id``, ``eos_id``) and ``prompt_ids``.
"""

from mmtf.text.base import SPECIAL_TOKENS, Tokenizer, load_tokenizer
from mmtf.text.bpe import BPETokenizer
from mmtf.text.build import TOKENIZER_KINDS, build_tokenizer, trains
from mmtf.text.char import CharTokenizer
from mmtf.text.pretrained import PretrainedTokenizer

__all__ = ["SPECIAL_TOKENS", "TOKENIZER_KINDS", "BPETokenizer", "CharTokenizer",
           "PretrainedTokenizer", "Tokenizer", "build_tokenizer", "load_tokenizer", "trains"]
