"""Tokenizers: BPE, character-level and pretrained (a ``tokenizer.json`` with its own special
ids); :func:`build_tokenizer` makes one from the ``tokenizer`` config node."""

from mmtf.text.base import SPECIAL_TOKENS, Tokenizer, load_tokenizer
from mmtf.text.bpe import BPETokenizer
from mmtf.text.build import TOKENIZER_KINDS, build_tokenizer, trains
from mmtf.text.char import CharTokenizer
from mmtf.text.pretrained import PretrainedTokenizer

__all__ = ["SPECIAL_TOKENS", "TOKENIZER_KINDS", "BPETokenizer", "CharTokenizer",
           "PretrainedTokenizer", "Tokenizer", "build_tokenizer", "load_tokenizer", "trains"]
